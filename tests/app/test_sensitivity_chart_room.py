"""The sensitivity bar chart stays readable once a fallback result is shown below it (the result's text and plot
do not squeeze it), and the ladder chart names its kinds of point (pytest-qt, offscreen, on the demo)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import open_demo, shown  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


def test_a_fallback_result_leaves_the_bar_chart_its_room(controller, qtbot):
    open_demo(controller, qtbot, method="max")
    tab = shown(SensitivityTab(controller), qtbot, 700, 480)  # the tab of a laptop-sized window
    tab.batches_spin.setValue(1)
    with qtbot.waitSignal(controller.sensitivity_changed, timeout=60000):
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    qtbot.wait(50)
    before = tab.chart.height()
    panel = tab.fallback_panel
    panel.goal_spin.setValue(round(controller.session.latest_sensitivity().quantized + 3.0, 1))
    with qtbot.waitSignal(controller.fallback_changed, timeout=60000):
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    qtbot.wait(50)
    assert tab.chart.height() >= 200 and tab.chart.height() >= before - 2, (before, tab.chart.height())
    # a tab opened on the project with its result (as after a reopen) too
    again = shown(SensitivityTab(controller), qtbot, 700, 480)
    qtbot.wait(50)
    assert again.chart.height() >= 200
    # the ladder chart says what its points are
    names = [label.text for _item, label in panel.ladder_legend.items]
    assert names == ["mixes kept", "steps undone (worse)", "mix chosen"]


def test_a_running_job_does_not_widen_the_tab(controller, qtbot):
    """The progress shown while a sensitivity job runs must not widen the tab: the main window would take that
    width from the model tree's dock (the tree narrowed after every run)."""
    open_demo(controller, qtbot, method="max")
    tab = shown(SensitivityTab(controller), qtbot, 700, 480)
    idle = tab.minimumSizeHint().width()
    tab.batches_spin.setValue(1)
    widths = []
    controller.jobs.progress.connect(lambda _p: widths.append(tab.minimumSizeHint().width()))
    with qtbot.waitSignal(controller.sensitivity_changed, timeout=60000):
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    assert widths and max(widths) <= idle
