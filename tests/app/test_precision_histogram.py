"""The layer panel's histogram draws the grid of the layer's format: E4M3's uneven levels for an FP8 input,
INT8's even steps otherwise."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from test_main_window import _no_webengine, answers, calibrate, load_demo, window  # noqa: E402,F401

from workbench.quant.algorithms.precision import grid_levels  # noqa: E402


def test_histogram_draws_the_fp8_grid_of_an_fp8_layer(window, qtbot):  # noqa: F811
    session = load_demo(window, qtbot)
    # E4M3 inputs with the histogram calibrator (FP8 histogram methods search on the E4M3 grid)
    assert window.controller.set_descriptor(["block.conv1"], "input", {"num_bits": [4, 3]})
    assert session.precisions(["block.conv1"])["block.conv1"] is None  # INT8 weights still: custom
    calibrate(window, qtbot)
    window.controller.select(["block.conv1"])
    panel = window.layer_panel
    qtbot.waitUntil(lambda: panel.histogram_item is not None and panel.quantizer_name == "block.conv1._input_quantizer")
    data = session.histogram("block.conv1._input_quantizer")
    assert data["format"] == "fp8"
    levels = panel.grid_item.getData()[0][::2]
    assert len(levels) == 127  # 0 and the 126 positive finite E4M3 values
    np.testing.assert_allclose(levels, grid_levels((4, 3), data["current"]), rtol=1e-6)
    assert levels[-1] == pytest.approx(data["current"])  # the top level is amax (448 scaled)
    steps = np.diff(levels)
    assert steps[-1] > 50 * steps[1]  # dense near zero, coarse near amax
    # an INT8 layer: 128 even steps up to its amax
    window.controller.select(["block.conv2"])
    qtbot.waitUntil(lambda: panel.histogram_item is not None and panel.quantizer_name == "block.conv2._input_quantizer")
    levels = panel.grid_item.getData()[0][::2]
    assert len(levels) == 128 and np.allclose(np.diff(levels), levels[1])
