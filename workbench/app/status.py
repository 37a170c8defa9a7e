"""The window's reporting pieces: the log panel, the job status in the status bar (progress, ETA, Cancel),
and the hook that turns an uncaught exception from any thread into an error dialog.
"""
from __future__ import annotations

import html
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QFont, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.formatting import WIDEST_JOB_TIMES, job_count_text, job_times_text
from workbench.app.jobs import JobProgress

logger = logging.getLogger(__name__)

__all__ = ["LogPanel", "JobStatus", "install_excepthook"]


class LogPanel(QWidget):
    """Timestamped lines from ``controller.log`` (and every error shown), newest at the bottom."""

    COLORS = {"debug": "#808080", "info": "#303030", "warning": "#b9770e", "error": "#c0392b", "critical": "#c0392b"}

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(5000)  # a long session never grows the document without bound
        self.text.setObjectName("logText")
        font = QFont("monospace")
        font.setStyleHint(QFont.StyleHint.Monospace)
        font.setPointSize(max(8, font.pointSize() - 1))
        self.text.setFont(font)
        clear = QToolButton()
        clear.setText("Clear")
        clear.setToolTip("Clear the log")
        clear.clicked.connect(self.text.clear)
        side = QVBoxLayout()
        side.setContentsMargins(0, 0, 0, 0)
        side.addWidget(clear)
        side.addStretch(1)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 4)
        layout.addWidget(self.text, 1)
        layout.addLayout(side)
        self.lines: list[tuple[str, str]] = []

    def append(self, level: str, message: str) -> None:
        level = level.lower()
        self.lines.append((level, message))
        if len(self.lines) > 5000:
            del self.lines[:1000]
        stamp = time.strftime("%H:%M:%S")
        color = self.COLORS.get(level, "#303030")
        body = html.escape(message).replace("\n", "<br>")
        self.text.appendHtml(f"<span style='color:#909090'>{stamp}</span> "
                             f"<span style='color:{color}'><b>{level:<7}</b> {body}</span>")
        self.text.moveCursor(QTextCursor.MoveOperation.End)

    def plain_text(self) -> str:
        return self.text.toPlainText()


class JobStatus(QWidget):
    """Status bar part shown while a job runs: what, a progress bar, elapsed/ETA, and Cancel."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.label = QLabel()
        self.bar = QProgressBar()
        self.bar.setFixedWidth(220)
        self.bar.setTextVisible(True)
        self.eta = QLabel()
        # wide enough for the longest clock ("1 min 05 s elapsed · ETA 8 min 20 s" was cut to "ETA 8 min 2…")
        self.eta.setMinimumWidth(self.eta.fontMetrics().horizontalAdvance(WIDEST_JOB_TIMES) + 8)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the job at its next batch (Esc)")
        self.cancel_button.clicked.connect(self.cancel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 6, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.bar)
        layout.addWidget(self.eta)
        layout.addWidget(self.cancel_button)
        self.last: JobProgress | None = None
        self.started_at = time.monotonic()
        # the elapsed time moves on its own: a job between two progress reports (one long step such as
        # tracing a model or exporting it) must not look hung with a frozen clock
        self.clock = QTimer(self)
        self.clock.setInterval(500)
        self.clock.timeout.connect(self._tick)
        jobs = controller.jobs
        jobs.started.connect(self._started)
        jobs.progress.connect(self.show_progress)
        controller.busy_changed.connect(self._busy)
        self.setVisible(False)

    def _started(self, name: str) -> None:
        self.last = None
        self.started_at = time.monotonic()
        self.label.setText(name + "…")
        self.bar.setRange(0, 0)  # busy indicator until the first report gives a total
        self.bar.setFormat("")
        self.eta.setText(job_times_text(0.0, None, 0.0))
        self.cancel_button.setEnabled(True)
        self.cancel_button.setText("Cancel")
        self.setVisible(True)
        self.clock.start()

    def show_progress(self, progress: JobProgress) -> None:
        self.last = progress
        self.label.setText(f"{progress.name}: {progress.message}" if progress.message else progress.name)
        if progress.total > 1:
            self.bar.setRange(0, progress.total)
            self.bar.setValue(min(progress.done, progress.total))
            self.bar.setFormat(job_count_text(progress.done, progress.total))
        else:  # one step (or an unknown count): a moving busy bar, never a "0/1" that looks stuck
            self.bar.setRange(0, 0)
            self.bar.setFormat("")
        self._show_times()

    def _show_times(self) -> None:
        progress = self.last
        elapsed = time.monotonic() - self.started_at
        if progress is None:
            self.eta.setText(job_times_text(elapsed, None, 0.0))
        else:
            self.eta.setText(job_times_text(elapsed, progress.eta_s, elapsed - progress.elapsed_s))

    def _tick(self) -> None:
        if self.isVisible():
            self._show_times()

    def cancel(self) -> None:
        self.controller.cancel_job()
        self.cancel_button.setEnabled(False)
        self.cancel_button.setText("Cancelling…")

    def _busy(self, busy: bool) -> None:
        if not busy:
            self.clock.stop()
            self.setVisible(False)


class ShowsErrors(Protocol):
    """Where the hook reports: the main window (typed by shape, so that this module need not import it)."""

    def show_error(self, title: str, message: str, details: str = "") -> Any: ...


class _ExceptionBridge(QObject):
    """Carries an exception from any thread to the GUI thread (a queued signal)."""

    raised = Signal(str, str, str)


def install_excepthook(window: ShowsErrors) -> Callable[[], None]:
    """Route uncaught exceptions (GUI slots, other threads) to an error dialog; returns an undo function.

    Args:
        window: shows the dialog (``window.show_error(title, message, details)``, called on the GUI thread); when
            it is a QObject it owns the bridge, so the hook stops reporting once the window is gone.
    Returns:
        A function that puts the previous ``sys.excepthook`` and ``threading.excepthook`` back.
    """
    bridge = _ExceptionBridge(window if isinstance(window, QObject) else None)
    bridge.raised.connect(window.show_error)
    previous_sys, previous_thread = sys.excepthook, threading.excepthook

    def report(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            previous_sys(kind, value, tb)
            return
        details = "".join(traceback.format_exception(kind, value, tb))
        logger.error("Unexpected error: %s", details)
        try:
            bridge.raised.emit("Unexpected error", f"{kind.__name__}: {value}\n\nThe project is unchanged where the "
                               "action failed; save your work under a new name if in doubt.", details)
        except RuntimeError:  # the window is gone (shutting down)
            previous_sys(kind, value, tb)

    def report_thread(args: threading.ExceptHookArgs) -> None:
        report(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)

    sys.excepthook = report
    threading.excepthook = report_thread

    def undo() -> None:
        sys.excepthook, threading.excepthook = previous_sys, previous_thread

    return undo
