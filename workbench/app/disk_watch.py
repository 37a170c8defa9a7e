"""Notice when another process saves the open project (the CLI, a second window, a torchrun rank).

A :class:`QFileSystemWatcher` on the project file wakes :class:`ProjectFileWatcher`; it then asks the
session whether the file's revision moved past the one it loaded or saved (its own saves do not
count), and emits ``changed(path)`` once per new revision. The window offers to reload; a user who
keeps working gets a save that merges what does not conflict, or refuses and says what does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QFileSystemWatcher, QObject, Signal

from workbench.project import file_revision

__all__ = ["ProjectFileWatcher"]


class ProjectFileWatcher(QObject):
    """Emits ``changed(path)`` when the watched session's project file gets a revision it did not write."""

    changed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._watcher = QFileSystemWatcher(self)
        self._watcher.fileChanged.connect(lambda _path: self.check())
        self._session: Any = None
        self._told: int | None = None  # the revision already reported (or the user chose to keep working)

    def watch(self, session: Any) -> None:
        """Watch ``session``'s project file (None, or a session without a file: watch nothing)."""
        if self._watcher.files():
            self._watcher.removePaths(self._watcher.files())
        self._session, self._told = session, None
        path = getattr(session, "path", None)
        if path is not None and Path(path).is_file():
            self._watcher.addPath(str(path))

    def check(self) -> bool:
        """Emit ``changed`` if the file holds a revision this session neither loaded nor wrote (once per revision)."""
        session = self._session
        if session is None or session.path is None:
            return False
        if str(session.path) not in self._watcher.files() and Path(session.path).is_file():
            self._watcher.addPath(str(session.path))  # some writers replace the file: follow the new one
        if not session.changed_on_disk():
            return False
        revision = file_revision(session.path)
        if revision == self._told:
            return False
        self._told = revision
        self.changed.emit(str(session.path))
        return True
