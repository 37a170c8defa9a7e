"""What the window showed of a project, remembered per project file: the tab, the tree's filter (text, regex, type)
and the selected layers. Reopened, the project comes back as it was left (the tree's column widths and open rows are
:mod:`workbench.app.tree_layout`'s).

Kept in the application's settings, not in the project file: it is how one user looked at the project, not a
decision about it (a colleague opening the file gets their own).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings

__all__ = ["ViewState", "ViewMemory", "project_key"]


@dataclass
class ViewState:
    """The window's view of one project: the tab's title, the tree filter and the selected layers."""

    tab: str = ""
    filter_text: str = ""
    regex: bool = False
    type_name: str = ""  # "" : all types
    selection: list[str] = field(default_factory=list)


def project_key(path: Any) -> str:
    """The settings key of a project file: its absolute path, hashed (settings keys cannot hold every character a
    path can). Resolved, so that ``workbench gui proj.qwb`` finds what was kept for ``/home/me/proj.qwb`` (a
    project opened by a relative path came back as never seen: first tab, no filter, first layer)."""
    return hashlib.sha1(str(Path(path).expanduser().resolve()).encode()).hexdigest()[:16]


def _group(path: Any) -> str:
    return "view_state/" + project_key(path)


class ViewMemory:
    """:class:`ViewState` per project file in ``settings`` (None: nothing is remembered)."""

    def __init__(self, settings: QSettings | None) -> None:
        self.settings = settings

    def remember(self, path: Any, state: ViewState) -> None:
        if self.settings is None or path is None:
            return
        self.settings.setValue(_group(path), json.dumps(asdict(state)))

    def recall(self, path: Any) -> ViewState | None:
        """The state remembered for ``path``; None for a project never left here (or a value this version cannot
        read: the project then opens as new)."""
        if self.settings is None or path is None:
            return None
        raw = self.settings.value(_group(path))
        if not raw:
            return None
        try:
            data = json.loads(str(raw))
            state = ViewState(tab=str(data.get("tab", "")), filter_text=str(data.get("filter_text", "")),
                              regex=bool(data.get("regex", False)), type_name=str(data.get("type_name", "")),
                              selection=[str(name) for name in data.get("selection", [])])
        except (ValueError, TypeError, AttributeError):
            return None
        return state
