"""Where a project's files are: its relative paths follow it when it is saved elsewhere, an open from
another folder says where they led, and model files that changed since it was saved are noted.

Functions of a :class:`~workbench.session.Session` or its project (the session's methods call them).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.project import Project
from workbench.sources.paths import absolute_entrypoint, absolute_path, relative_entrypoint, relative_path
from workbench.sources.trust import CodeReference, code_references

if TYPE_CHECKING:
    from workbench.session.core import Session

logger = logging.getLogger("workbench.session.core")  # the logger these messages always came from

__all__ = ["rebase", "check_digests", "moved_hint", "project_code"]


def rebase(session: Session, new_base: Path) -> None:
    """Rewrite relative paths of the sources so that they stay valid next to the new file."""
    session.project.model = session.project.model.absolute(session.base_dir).relative_to(new_base)
    for role, spec in list(session.project.data.items()):
        session.project.data[role] = spec.absolute(session.base_dir).relative_to(new_base)
    settings = session.settings
    for section, field_name in ((settings.metric, "name"), (settings.finetune, "loss")):  # user functions in files
        moved = relative_entrypoint(absolute_entrypoint(getattr(section, field_name), session.base_dir), new_base)
        if moved != getattr(section, field_name):
            session.project.settings[section.KEY] = replace(section, **{field_name: moved}).to_stored()
    if settings.export.path is not None:  # exports stay where they were
        session.project.settings["export"] = replace(settings.export, path=relative_path(
            absolute_path(settings.export.path, session.base_dir), new_base)).to_stored()
    for record in session.project.exports:
        record.path = relative_path(absolute_path(record.path, session.base_dir), new_base) or record.path
    session.base_dir = new_base
    session._data.clear()


def check_digests(session: Session) -> None:
    """Note (and log) each model or weights file whose sha256 differs from the one the project recorded."""
    recorded = {Path(d.path).name: d for d in session.project.model_digests}
    for digest in session._loaded.digests:
        old = recorded.get(Path(digest.path).name)
        if old is not None and old.sha256 != digest.sha256:
            session.file_changes.append(f"{digest.path} changed since the project was saved (sha256 "
                                        f"{old.sha256[:12]}... is now {digest.sha256[:12]}...); its calibration may "
                                        "no longer fit: recalibrate.")
    for message in session.file_changes:
        logger.warning(message)


def moved_hint(project: Project, base_dir: Path) -> str:
    """For a project opened from another folder than it was saved in: where its relative paths led before."""
    saved_in = Path(project.saved_in) if project.saved_in else None
    if saved_in is None or saved_in == base_dir.resolve():
        return ""
    return (f" Relative paths in a project are taken from its own folder ({base_dir}); it was saved in {saved_in}: "
            "copy its code and data along with it, or open it there.")


def project_code(project: Project, base_dir: Path) -> list[CodeReference]:
    """The code a project runs (model, data, metric, loss), read without running any of it."""
    return code_references(project.model, project.data, project.settings, base_dir)
