"""Issue 36, point 5 (the rest): the fallback search and the ladder count their steps in the Sensitivity tab from
the first report and name the candidate being measured (not a busy bar for the whole search), their charts fill as
each measurement arrives, and the ladder's Apply says at once that it works (busy cursor, text, the tab's progress)
until the model update and calibration it starts are done."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import shown  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


@pytest.fixture
def project(calibrated_block_project):
    return calibrated_block_project


def _tab(controller, qtbot, project):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.open_project(project, trust_code=True)
    tab = shown(SensitivityTab(controller), qtbot, 1100, 800)
    tab.fallback_panel._metric = lambda: "sqnr"
    tab.fallback_panel.metric_changed()
    return tab


def _points(item) -> int:
    xs = item.getData()[0]
    return 0 if xs is None else len(xs)


def _goal(panel, ladder: str, target: float) -> None:
    panel.ladder_box.setCurrentText(ladder)
    panel.goal_box.setCurrentIndex(panel.goal_box.findData("target"))
    panel.goal_spin.setValue(target)


def test_the_ladder_counts_its_steps_in_the_tab_and_names_the_candidate(controller, qtbot, project):
    tab = _tab(controller, qtbot, project)
    panel = tab.fallback_panel
    _goal(panel, "int8,fp8,float", 25)
    seen = []  # (total, the tab's bar: visible, maximum, value, its tooltip) at every report, after the tab took it
    controller.jobs.progress.connect(lambda p: seen.append(
        (p.total, tab.progress.isVisible(), tab.progress.maximum(), tab.progress.value(), p.message)))
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000):
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    assert seen
    # every report, the first included, has a count: a determinate bar in the tab, never a busy one
    assert all(total > 1 and visible and maximum == total for total, visible, maximum, _, _ in seen), seen[:3]
    messages = [message for *_, message in seen]
    assert any(m.startswith("calibrating the fp8 rung (1/1): ") for m in messages)  # the rung's calibration
    assert "measuring the FP32 reference" in messages
    assert "measuring fc in fp8" in messages  # the candidate, before its pass


def test_the_fallback_chart_fills_as_each_measurement_arrives(controller, qtbot, project):
    tab = _tab(controller, qtbot, project)
    panel = tab.fallback_panel
    _goal(panel, "int8,float", 30)  # all quantized: 14 dB; fc in float: 40 dB
    drawn = []  # (points on the curve, the job still running, the label) as each measurement arrives
    controller.search_partial.connect(lambda _r: drawn.append(
        (_points(panel.fallback_curve), controller.busy, panel.fallback_label.text())))
    with qtbot.waitSignal(controller.fallback_changed, timeout=120000) as blocker:
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    final = blocker.args[0]
    assert [p.unit for p in final.curve] == [None, "fc"]  # all quantized, then fc in float
    assert [points for points, _, _ in drawn] == [1, 2]  # one more point on the chart per measurement
    assert all(running and text.startswith("<b>Searching…</b>") for _, running, text in drawn)
    assert _points(panel.fallback_curve) == 2 and panel.fallback_label.text().startswith("<b>Reached</b>")


def test_the_ladder_chart_fills_as_it_runs(controller, qtbot, project):
    tab = _tab(controller, qtbot, project)
    panel = tab.fallback_panel
    _goal(panel, "int8,fp8,float", 25)
    drawn = []
    controller.search_partial.connect(lambda r: drawn.append(
        (len(r.steps), panel.ladder_plot.isVisible(), _points(panel.ladder_curve))))
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000):
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    assert drawn and drawn[0][0] == 1 and all(visible and points >= 1 for _, visible, points in drawn)
    assert [steps for steps, _, _ in drawn] == sorted({steps for steps, _, _ in drawn})  # one draw per new step


def test_the_ladders_apply_says_at_once_that_it_works_until_its_calibration_is_done(controller, qtbot, project):
    tab = _tab(controller, qtbot, project)
    panel = tab.fallback_panel
    _goal(panel, "int8,fp8,float", 25)
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000):
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    assert panel.apply_button.isEnabled()
    shown_jobs = []  # (job, the tab's progress visible) at each of its reports
    controller.jobs.progress.connect(lambda p: shown_jobs.append((p.name, tab.progress.isVisible())))
    qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    # right after the click, before the calibration it started has run
    cursor = QApplication.overrideCursor()
    assert cursor is not None and cursor.shape() == Qt.CursorShape.BusyCursor
    assert panel.fallback_label.text().startswith("<b>Applying…</b>")
    assert controller.busy
    qtbot.waitUntil(lambda: not controller.busy and not panel.applying, timeout=60000)
    assert ("Calibrating", True) in shown_jobs  # the calibration's progress showed in the tab
    assert QApplication.overrideCursor() is None
    assert "Applying" not in panel.fallback_label.text() and "Applied" in panel.fallback_label.text()


def test_apply_stays_in_view_under_a_long_ladder_result(controller, qtbot, project):
    """Seen with real input under Xvfb: a ladder's notes pushed Apply below the scrolled pane's view, and the click
    on it missed; Apply sits under Search now, above the text."""
    tab = _tab(controller, qtbot, project)
    tab.resize(680, 700)  # the tab's size in a 1500x950 window beside the model tree
    panel = tab.fallback_panel
    _goal(panel, "int8,fp8,float", 25)
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000) as blocker:
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    result = blocker.args[0]
    result.notes = [f"note {i}: " + "a long explanation of a fusion move " * 4 for i in range(4)]
    panel.show_ladder(result)
    qtbot.wait(50)
    assert panel.apply_button.isEnabled()
    assert not panel.apply_button.visibleRegion().isEmpty()
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
