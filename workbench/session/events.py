"""What changed in a session, told to whoever listens: plain callbacks, no Qt.

The session emits an :class:`Event` after each change it makes; the GUI's controller turns them into Qt
signals in one place, and any other front end (a script, a test) can listen the same way::

    session.events.connect(lambda event: print(event.kind, event.data))

Callbacks run in the thread that made the change (a job's worker thread for a calibration): a listener
that touches a GUI hands the event over to its own thread.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["SessionEvent", "Event", "EventEmitter"]


class SessionEvent(str, Enum):
    """The kinds of change a session reports."""

    SETTINGS = "settings"        # data: keys (the settings that changed)
    LAYERS = "layers"            # layer decisions or descriptors, or the quantizers they build, changed
    DATA = "data"                # data: role (a data source was replaced)
    CALIBRATION = "calibration"  # amax values changed (a calibration, another amax method)
    SENSITIVITY = "sensitivity"  # a sensitivity run was stored
    FALLBACK = "fallback"        # a fallback search was stored
    FINETUNE = "finetune"        # fine-tuned weights were stored or dropped
    EXPORT = "export"            # data: path (an export was recorded in the project)
    LINT = "lint"                # a fusion lint was kept in the project
    SAVED = "saved"              # data: path (the project file was written)


@dataclass(frozen=True)
class Event:
    kind: SessionEvent
    data: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[Event], None]


class EventEmitter:
    """A list of listeners called with every event, in the order they connected."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def connect(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` on every event; returns a function that disconnects it."""
        with self._lock:
            self._listeners.append(listener)
        return lambda: self.disconnect(listener)

    def disconnect(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def emit(self, kind: SessionEvent, **data: Any) -> None:
        """Tell every listener; a listener that raises is logged and the others still hear of it (the
        change has happened either way)."""
        event = Event(kind, data)
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - one broken listener must not undo or hide a change
                logger.exception("A listener of %s events failed", kind.value)
