"""Waiting for the main window in GUI tests: until its job is done and its views have re-read the session."""
from __future__ import annotations


def settle(window, qtbot, timeout: int = 60000) -> None:
    """Wait until no job runs and the tree, the layer panel and its plot have refreshed (they refresh once per
    burst of change signals, on timers)."""
    qtbot.waitUntil(lambda: not window.controller.busy and not window.tree._refresh.scheduled()
                    and not window.layer_panel._refresh.scheduled()
                    and not window.layer_panel._plot_timer.isActive(), timeout=timeout)


def open_calibrated_bert(window, qtbot, tmp_path) -> None:
    """A new project on the tests' tiny BERT in ``window``, calibrated with max, views settled."""
    from bert_project import bert_specs

    model, data = bert_specs(tmp_path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="max")
    settle(window, qtbot)


def run_ladder(panel, controller, qtbot, ladder: str = "int8,fp8,float", target_db: float = 25) -> None:
    """Run the precision ladder from the sensitivity tab's fallback panel as a user does: the SQNR metric, a ladder,
    a target in dB, the button; returns once the controller has the result."""
    from PySide6.QtCore import Qt

    panel._metric = lambda: "sqnr"
    panel.metric_changed()
    panel.ladder_box.setCurrentText(ladder)
    panel.goal_box.setCurrentIndex(panel.goal_box.findData("target"))
    panel.goal_spin.setValue(target_db)
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000):
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
