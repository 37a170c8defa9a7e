"""What the round-3 real-input run (Xvfb, xdotool, a tiny BERT and GPT-2) found, each driven through the real
widgets (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from window_waits import settle  # noqa: E402

INT4_LAYER = "bert.encoder.layer.0.output.dense"  # 64 input features: INT4 blocks of 64


def test_an_int4_layers_switched_off_input_says_why_in_the_histogram_within_the_plot(window, qtbot, tmp_path):
    """The histogram of an INT4 weight-only layer's input said "this quantizer uses the max calibrator... set its
    calibrator to 'histogram'" (the editor beside it is off for that input), cut off on both sides of the plot."""
    pytest.importorskip("transformers")
    from bert_project import bert_specs

    model, data = bert_specs(tmp_path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="max")
    settle(window, qtbot)
    assert window.controller.set_precision([INT4_LAYER], "int4w")
    window.controller.select([INT4_LAYER])
    settle(window, qtbot)
    panel = window.layer_panel
    panel.role_tabs.setCurrentIndex(0)
    panel.quantizer_combo.setCurrentIndex(panel.quantizer_combo.findData(f"{INT4_LAYER}._input_quantizer"))
    settle(window, qtbot)
    text = panel.histogram_message.textItem.toPlainText()
    assert text.startswith("Off: this layer's precision") and "calibrator" not in text
    wrapped = panel.histogram_message.textItem.boundingRect().width()
    assert 0 < wrapped <= panel.histogram_plot.getViewBox().width()  # all of it inside the plot
