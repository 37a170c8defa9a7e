"""Spin boxes and combo boxes in a scrolled pane that a mouse wheel passing over them does not change.

Qt gives a wheel turn to the widget under the pointer: scrolling the sensitivity tab's pane down over the fallback
search's Target box changed the goal from 40 to 42 dB, unseen (the GPT-2 run, issue 36 round 3). A guarded widget
takes the wheel only once it has the focus (a click or Tab into it); otherwise the turn goes on to the pane, which
scrolls.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QWidget

__all__ = ["guard_wheel"]


class _WheelGuard(QObject):
    def eventFilter(self, watched: Any, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            pane = watched.parentWidget()
            while pane is not None and not isinstance(pane, QAbstractScrollArea):
                pane = pane.parentWidget()
            if pane is not None:  # not for this widget: for the pane around it, which scrolls
                QApplication.sendEvent(pane.viewport(), event)
            return True
        return super().eventFilter(watched, event)


def guard_wheel(*widgets: QWidget) -> None:
    """Let ``widgets`` take a wheel turn only while they have the focus (and take the focus by click or Tab only,
    not by the wheel)."""
    for widget in widgets:
        guard = _WheelGuard(widget)  # owned by the widget: it lives as long as the widget does
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        widget.installEventFilter(guard)
