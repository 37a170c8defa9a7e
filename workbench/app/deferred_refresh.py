"""A view's refresh that runs once per burst of change signals, and never while a job owns the session."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer

if TYPE_CHECKING:
    from workbench.app.controller import Controller

__all__ = ["DeferredRefresh"]


class DeferredRefresh(QObject):
    """A view's refresh: a burst of change signals runs it once, and never while a job runs.

    The session is not thread-safe, and reading it can rebuild its quantized model under the job's
    feet, so a refresh asked for during a job happens when the job ends. The view's refresh starts
    with ``if not self._refresh.begin(): return``.
    """

    def __init__(self, controller: Controller, refresh: Callable[[], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._after_job = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)  # the signals of one change (opening a project: four) refresh once
        self._timer.timeout.connect(refresh)
        controller.busy_changed.connect(self._busy)

    def schedule(self) -> None:
        """Refresh in the next turn of the event loop (or after the running job)."""
        self._timer.start()

    def scheduled(self) -> bool:
        return self._timer.isActive()

    @property
    def waiting_for_job(self) -> bool:
        """A refresh was asked for during a job and runs when it ends."""
        return self._after_job

    def idle(self) -> bool:
        """True when no job runs; otherwise False, and the refresh runs once the job ends."""
        if self._controller.busy:
            self._after_job = True
            return False
        return True

    def begin(self) -> bool:
        """At the top of the refresh itself: whether it may read the session now."""
        self._timer.stop()
        if not self.idle():
            return False
        self._after_job = False
        return True

    def when_idle(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` now, or refresh everything once the running job ends."""
        if self.idle():
            fn()

    def _busy(self, busy: bool) -> None:
        if not busy and self._after_job:
            self._timer.start()
