"""Export targets outside a project's folder that the user named on this machine, remembered per project file.

A project stores its export path; a project file received from someone else must not be able to send an
export anywhere (:func:`workbench.session.exports.check_confined`). A path the user typed (``-o``, the
export dialog) is theirs: after it was written, it is remembered here, in the user's config folder next to
the trust store (``quant-workbench/export-targets.json``), keyed by the project file's absolute path, so a
later plain ``export`` (or the GUI's Export) to the same place needs no ``-o``. The project cannot forge this
record: it lives outside the project file.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from workbench import bounded_json
from workbench.sources.trust import trust_store_path

__all__ = ["targets_path", "confirmed", "remember"]


def targets_path() -> Path:
    """``$XDG_CONFIG_HOME/quant-workbench/export-targets.json`` (beside the trust store)."""
    return trust_store_path().parent / "export-targets.json"


def _read() -> dict[str, list[str]]:
    try:
        data = bounded_json.read_json_file(targets_path())
    except (OSError, ValueError):  # none yet, or damaged: nothing is confirmed
        return {}
    return {str(k): [str(p) for p in v] for k, v in data.items() if isinstance(v, list)} \
        if isinstance(data, dict) else {}


def confirmed(project_path: Path, target: Path) -> bool:
    """Whether the user named ``target`` for this project file on this machine before."""
    return str(target.resolve()) in _read().get(str(Path(project_path).resolve()), [])


def remember(project_path: Path, target: Path) -> None:
    """Record that the user named ``target`` for this project file (written atomically, mode 0600)."""
    data = _read()
    key, value = str(Path(project_path).resolve()), str(target.resolve())
    if value in data.get(key, []):
        return
    data.setdefault(key, []).append(value)
    path = targets_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".export-targets.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
