"""Issue 36 round 3, the GPT-2 run: scrolling the sensitivity tab's pane down with the mouse wheel, the pointer passed
over the fallback search's Target box and changed the goal from 40 to 42 dB, unseen; the next search would have
searched another goal than the one typed. The goal's fields take a wheel turn only once the user is in them; the
pane scrolls instead."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import shown  # noqa: E402
from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QWheelEvent  # noqa: E402
from PySide6.QtWidgets import QApplication, QScrollArea  # noqa: E402

from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


def _wheel_down(widget) -> None:
    """One notch of the wheel turned towards the user, the pointer over ``widget``'s middle."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0), QPoint(0, -120),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_a_wheel_turn_over_the_goal_scrolls_the_pane_and_leaves_the_goal(controller, qtbot):
    tab = shown(SensitivityTab(controller), qtbot, 900, 420)  # short: the fallback panel is scrolled
    panel = tab.fallback_panel
    pane = next(area for area in tab.findChildren(QScrollArea) if area.widget() is panel)
    bar = pane.verticalScrollBar()
    assert bar.maximum() > 0
    panel.goal_box.setCurrentIndex(panel.goal_box.findData("target"))
    panel.goal_spin.setValue(40)
    goal, units, ladder = panel.goal_box.currentIndex(), panel.max_units_spin.value(), panel.ladder_box.currentIndex()
    before = bar.value()
    for widget in (panel.goal_spin, panel.goal_box, panel.max_units_spin, panel.ladder_box):
        _wheel_down(widget)
    assert panel.goal_spin.value() == 40 and panel.goal_box.currentIndex() == goal
    assert panel.max_units_spin.value() == units and panel.ladder_box.currentIndex() == ladder
    assert bar.value() > before  # the turns scrolled the pane

    tab.activateWindow()
    qtbot.mouseClick(panel.goal_spin, Qt.MouseButton.LeftButton)  # in the field: the wheel is the user's to use
    panel.goal_spin.setFocus()
    qtbot.waitUntil(panel.goal_spin.hasFocus)
    _wheel_down(panel.goal_spin)
    assert panel.goal_spin.value() < 40
