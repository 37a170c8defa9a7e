"""Long jobs off the GUI thread: one at a time, with progress, ETA and cancel.

A job is a plain function ``fn(progress, cancel) -> result`` (the same signature the session's jobs
take), run in a QThread. Its progress callback is called from the worker thread; it only emits a
queued signal, so the GUI thread repaints between batches and never waits on the job.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

JobFunction = Callable[[Callable[[int, int, str], None], threading.Event], Any]


@dataclass
class JobProgress:
    """What the status bar shows."""

    name: str
    done: int
    total: int
    message: str
    elapsed_s: float
    eta_s: float | None  # None until the rate is known (or when the total is unknown)

    @property
    def fraction(self) -> float | None:
        return None if not self.total else min(1.0, self.done / self.total)


class _Worker(QObject):
    progressed = Signal(int, int, str)
    succeeded = Signal(object)
    failed = Signal(object, str)

    def __init__(self, fn: JobFunction, cancel: threading.Event) -> None:
        super().__init__()
        self._fn = fn
        self._cancel = cancel

    @Slot()
    def run(self) -> None:
        try:
            result = self._fn(self._report, self._cancel)
        except BaseException as error:  # noqa: BLE001 - every failure must reach the user
            self.failed.emit(error, "".join(traceback.format_exception(error)))
        else:
            self.succeeded.emit(result)

    def _report(self, done: int, total: int, message: str) -> None:
        self.progressed.emit(int(done), int(total or 0), str(message))


class JobRunner(QObject):
    """Runs one job at a time in a worker thread and reports on the GUI thread.

    Signals:
        started(name), progress(JobProgress), finished(name, result), failed(name, exception,
        traceback_text), cancelled(name, exception), busy_changed(bool).
    """

    started = Signal(str)
    progress = Signal(object)
    finished = Signal(str, object)
    failed = Signal(str, object, str)
    cancelled = Signal(str, object)
    busy_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None, cancelled_types: tuple[type[BaseException], ...] = ()) -> None:
        super().__init__(parent)
        self._thread: QThread | None = None
        self._worker: _Worker | None = None
        self._cancel = threading.Event()
        self._name = ""
        self._started_at = 0.0
        self._on_done: Callable[[Any], None] | None = None
        self._cancelled_types = cancelled_types

    @property
    def busy(self) -> bool:
        return self._thread is not None

    @property
    def job_name(self) -> str:
        return self._name

    def start(self, name: str, fn: JobFunction, on_done: Callable[[Any], None] | None = None) -> bool:
        """Start ``fn`` unless a job is running (then return False and do nothing); ``on_done(result)``
        when it succeeds (failures are the ``failed`` and ``cancelled`` signals)."""
        if self.busy:
            return False
        self._cancel = threading.Event()
        self._name = name
        self._started_at = time.monotonic()
        self._on_done = on_done
        thread = QThread()
        worker = _Worker(fn, self._cancel)
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        worker.progressed.connect(self._on_progress)
        worker.succeeded.connect(self._on_success)
        worker.failed.connect(self._on_failure)
        # keep Python references: the worker and thread must outlive the job
        self._thread, self._worker = thread, worker
        thread.start()
        self.started.emit(name)
        self.busy_changed.emit(True)
        return True

    def cancel(self) -> None:
        """Ask the running job to stop at its next check (between batches or units)."""
        self._cancel.set()

    def wait(self, timeout_ms: int = 30000) -> bool:
        """Block until the worker thread ends (for shutdown and tests)."""
        return self._thread.wait(timeout_ms) if self._thread is not None else True

    @Slot(int, int, str)
    def _on_progress(self, done: int, total: int, message: str) -> None:
        elapsed = time.monotonic() - self._started_at
        eta = None
        if total and 0 < done <= total and elapsed > 0:
            eta = elapsed / done * (total - done)
        self.progress.emit(JobProgress(self._name, done, total, message, elapsed, eta))

    @Slot(object)
    def _on_success(self, result: Any) -> None:
        name, on_done = self._name, self._on_done
        self._cleanup()
        if on_done is not None:
            on_done(result)
        self.finished.emit(name, result)

    @Slot(object, str)
    def _on_failure(self, error: BaseException, text: str) -> None:
        name = self._name
        self._cleanup()
        if isinstance(error, self._cancelled_types):
            self.cancelled.emit(name, error)
            return
        self.failed.emit(name, error, text)

    def _cleanup(self) -> None:
        thread = self._thread
        self._thread, self._worker = None, None
        if thread is not None:
            thread.quit()
            thread.wait()
        self.busy_changed.emit(False)
