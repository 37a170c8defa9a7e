"""Issue 36, point 2: the ladder's Apply in the GUI shows what it changes before the click, asks before overriding
layers set by hand (and can keep them), can be undone, and shows as applied after a save and reopen (a second
click cannot wipe the edits made since)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import shown  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


@pytest.fixture
def project(calibrated_block_project):
    return calibrated_block_project


def _open(controller, qtbot, project):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.open_project(project, trust_code=True)
    tab = shown(SensitivityTab(controller), qtbot, 1100, 800)
    panel = tab.fallback_panel
    panel._metric = lambda: "sqnr"
    panel.metric_changed()
    return panel


def _precisions(controller):
    return {k: v.value for k, v in controller.session.precisions().items()}


def test_apply_shows_asks_keeps_hand_edits_undoes_and_stays_applied_after_reopen(controller, qtbot, project):
    from workbench.app.controller import Controller

    panel = _open(controller, qtbot, project)
    panel.ladder_box.setCurrentText("int8,fp8,float")
    panel.goal_box.setCurrentIndex(panel.goal_box.findData("target"))
    panel.goal_spin.setValue(25)
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000) as blocker:
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    assert blocker.args[0].precisions == {"fc": "fp8", "head": "int8"}
    # what Apply changes, before the click
    assert panel.apply_button.text() == "Apply: set 1 layer"
    assert "fc: int8 -> fp8" in panel.apply_button.toolTip() and "fc: int8 -&gt; fp8" in panel.fallback_label.text()

    # a hand edit made after the search: head to FP8; Apply would put it back to INT8, so it asks first
    assert controller.set_precision(["head"], "fp8") is not None
    panel.show_ladder(panel.ladder_result)
    assert panel.apply_button.text() == "Apply: set 2 layers" and "set by hand" in panel.apply_button.toolTip()
    asked = []
    panel.ask_override = lambda hand, changes: asked.append([c.layer for c in hand]) or "keep"
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    assert asked == [["head"]]
    assert _precisions(controller) == {"fc": "fp8", "head": "fp8"}  # the hand edit kept
    assert not panel.apply_button.isEnabled() and "Applied" in panel.fallback_label.text()

    # undo: the layers as before the Apply, and the search can be applied again
    assert panel.undo_apply_button.isEnabled()
    qtbot.mouseClick(panel.undo_apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    assert _precisions(controller) == {"fc": "int8", "head": "fp8"}
    assert panel.apply_button.isEnabled() and not panel.undo_apply_button.isEnabled()

    # cancel changes nothing; "override" applies the whole mix
    panel.ask_override = lambda hand, changes: None
    assert panel.apply_ladder() is None and _precisions(controller) == {"fc": "int8", "head": "fp8"}
    panel.ask_override = lambda hand, changes: "all"
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    assert _precisions(controller) == {"fc": "fp8", "head": "int8"}
    # an edit made since, then save and reopen: the search shows as applied, Apply stays off, the edit stays
    assert controller.set_precision(["head"], "fp8") is not None
    assert controller.save() is not None

    again = Controller()
    try:
        reopened = _open(again, qtbot, project)
        assert reopened.ladder_result is not None and reopened.ladder_result.applied
        assert not reopened.apply_button.isEnabled() and "Applied" in reopened.fallback_label.text()
        assert reopened.apply_ladder() is None
        assert _precisions(again) == {"fc": "fp8", "head": "fp8"}
    finally:
        again.shutdown()
