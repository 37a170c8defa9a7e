"""Errors of the project file: each message names the file and the reason."""
from __future__ import annotations

from pathlib import Path


class ProjectError(Exception):
    """A project file that cannot be read or written; the message names the file and the reason."""


class ProjectChangedError(ProjectError):
    """Another process saved the project after this one opened it, and the two changed the same thing.

    Nothing was saved. ``conflicts`` names what both changed (``"layer fc"``, ``"setting rules"``).
    """

    def __init__(self, path: Path, conflicts: list[str], who: str = "this command") -> None:
        self.path = Path(path)
        self.conflicts = list(conflicts)
        detail = f" (both changed {', '.join(conflicts[:5])}{', ...' if len(conflicts) > 5 else ''})" if conflicts \
            else ""
        super().__init__(f"{self.path} changed since {who} opened it (by another process); nothing was saved; "
                         f"run it again{detail}.")
