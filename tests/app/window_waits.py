"""Waiting for the main window in GUI tests: until its job is done and its views have re-read the session."""
from __future__ import annotations


def settle(window, qtbot, timeout: int = 60000) -> None:
    """Wait until no job runs and the tree, the layer panel and its plot have refreshed (they refresh once per
    burst of change signals, on timers)."""
    qtbot.waitUntil(lambda: not window.controller.busy and not window.tree._refresh.scheduled()
                    and not window.layer_panel._refresh.scheduled()
                    and not window.layer_panel._plot_timer.isActive(), timeout=timeout)
