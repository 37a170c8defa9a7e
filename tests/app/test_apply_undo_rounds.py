"""Issue 36 round 3, point 6: the main window driven through the ladder's Apply, Undo apply and Calibrate, round after
round (a first version of such a bench crashed inside PySide6 with "deallocating None", before the torch.fx fix of
workbench/graph/fx_guard.py). Every round ends where it began: no error dialog, the same precisions and amax."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402
from window_waits import run_ladder, settle  # noqa: E402

ROUNDS = 4


def _amax(session):
    return {name: record.amax.copy() for name, record in session.project.current_calibration.quantizers.items()}


def test_apply_undo_calibrate_rounds_in_the_window(window, qtbot, calibrated_block_project):
    controller = window.controller
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        window.open_project(calibrated_block_project, trust_code=True, confirmed=True)
    settle(window, qtbot)
    controller.session.update_setting("calibration", method="max")
    panel = window.extra_tabs["Sensitivity"].fallback_panel
    run_ladder(panel, controller, qtbot)
    start = {name: p.value for name, p in controller.session.precisions().items()}
    amax = _amax(controller.session)
    for _ in range(ROUNDS):
        with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
            qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not controller.busy and not panel.applying, timeout=60000)
        assert {name: p.value for name, p in controller.session.precisions().items()} != start
        qtbot.mouseClick(panel.undo_apply_button, Qt.MouseButton.LeftButton)
        settle(window, qtbot)
        with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
            window.calibrate_action.trigger()  # the toolbar's Calibrate
        settle(window, qtbot)
        assert not window.error_dialogs, window.error_dialogs[-1].message
        assert {name: p.value for name, p in controller.session.precisions().items()} == start
        now = _amax(controller.session)
        assert now.keys() == amax.keys() and all(np.array_equal(now[k], amax[k]) for k in amax)
        assert controller.session.build_report.stale == []
