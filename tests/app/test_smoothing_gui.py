"""The Calibrate dialog's SmoothQuant switch: it smooths the project's Linear layers, shows them smoothed when
opened again, and switching it off restores the original weights (the GUI twin of calibrate --smoothquant)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

import torch  # noqa: E402


def calibrate_with(window, qtbot, checked: bool, alpha: float = 0.5):
    dialog = window.calibrate_dialog()
    dialog.smoothquant.setChecked(checked)
    dialog.alpha.setValue(alpha)
    dialog.num_batches.setValue(1)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        dialog.accept()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)


def test_the_smoothquant_switch_smooths_shows_and_restores(window, qtbot):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    qtbot.waitUntil(lambda: window.tree.model.node_count() > 0 and not window.controller.busy, timeout=10000)
    session = window.controller.session
    dialog = window.calibrate_dialog()
    assert not dialog.smoothquant.isChecked() and not dialog.alpha.isEnabled()
    dialog.reject()

    calibrate_with(window, qtbot, True, 0.65)
    smoothed = session.project.smoothing
    assert smoothed and {r.alpha for r in smoothed.values()} == {0.65}
    layer = next(iter(smoothed))
    assert any(view.smoothing.startswith("SmoothQuant alpha=0.65") for view in session.layers() if view.name == layer)
    again = window.calibrate_dialog()
    assert again.smoothquant.isChecked() and again.alpha.value() == pytest.approx(0.65)
    again.reject()

    calibrate_with(window, qtbot, False)
    assert session.project.smoothing == {}
    model, float_model = session.quantized_model(), session.float_model
    assert torch.equal(model.get_submodule(layer).weight, float_model.get_submodule(layer).weight)
