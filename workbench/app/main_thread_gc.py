"""Python's cyclic garbage collector, run on the GUI thread only while the app has worker threads.

Automatic collection runs in whichever thread happens to allocate. When that is a job's worker
thread and the garbage holds a Qt widget (a closed dialog whose Python wrapper sits in a reference
cycle), the widget's C++ destructor runs there: it takes a Qt lock and then waits for the GIL, while
the GUI thread, holding the GIL, waits for that lock. The app froze exactly so in a test run. The
cure PySide/PyQt users settled on is to turn automatic collection off and collect from a timer on
the GUI thread, with the thresholds the automatic collector would use.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication, QObject, QTimer

__all__ = ["acquire", "release", "MainThreadGarbageCollector"]

CHECK_INTERVAL_MS = 250


class MainThreadGarbageCollector(QObject):
    """Collects on the GUI thread's timer, generation by generation as CPython would."""

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.check)
        self.timer.start(CHECK_INTERVAL_MS)

    def check(self) -> int | None:
        """Collect the oldest generation whose count passed its threshold; the generation, or None."""
        counts = gc.get_count()
        if counts[0] <= self.thresholds[0]:
            return None
        generation = 0
        if counts[1] > self.thresholds[1]:
            generation = 1
            if counts[2] > self.thresholds[2]:
                generation = 2
        gc.collect(generation)
        return generation


_collector: MainThreadGarbageCollector | None = None
_users = 0


def acquire() -> bool:
    """One more owner of worker threads (a controller): automatic collection off, the GUI thread's timer
    on. False, and nothing changed, without a Qt application (no event loop to collect from)."""
    global _collector, _users
    app = QCoreApplication.instance()
    if app is None:
        return False
    if _collector is None:
        _collector = MainThreadGarbageCollector(app)
        gc.disable()
    _users += 1
    return True


def release() -> None:
    """The owner is done with its threads; the last one turns automatic collection back on."""
    global _collector, _users
    if _users == 0:
        return
    _users -= 1
    if _users == 0 and _collector is not None:
        _collector.timer.stop()
        _collector.deleteLater()
        _collector = None
        gc.enable()
        gc.collect()  # here, on the GUI thread
