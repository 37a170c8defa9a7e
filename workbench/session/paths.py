"""Where a project's files are: its relative paths follow it when it is saved elsewhere, an open from
another folder says where they led, and model files that changed since it was saved are noted.

Functions of a project and the values they need (the :class:`~workbench.session.Session`'s methods call
them and keep what they return); nothing here touches the session itself.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from workbench.project import Project
from workbench.project.settings import ProjectSettings
from workbench.sources.model_source import FileDigest
from workbench.sources.paths import absolute_entrypoint, absolute_path, relative_entrypoint, relative_path
from workbench.sources.trust import CodeReference, changed_code_files, code_references

logger = logging.getLogger("workbench.session.core")  # the logger these messages always came from

__all__ = ["rebase", "changed_files", "trust_changed_hint", "moved_hint", "project_code"]


def rebase(project: Project, settings: ProjectSettings, old_base: Path, new_base: Path) -> None:
    """Rewrite the relative paths of ``project``'s sources (taken from ``old_base``; ``settings``: its typed
    settings) so that they stay valid next to a file in ``new_base``."""
    project.model = project.model.absolute(old_base).relative_to(new_base)
    for role, spec in list(project.data.items()):
        project.data[role] = spec.absolute(old_base).relative_to(new_base)
    for section, field_name in ((settings.metric, "name"), (settings.finetune, "loss")):  # user functions in files
        moved = relative_entrypoint(absolute_entrypoint(getattr(section, field_name), old_base), new_base)
        if moved != getattr(section, field_name):
            project.settings[section.KEY] = replace(section, **{field_name: moved}).to_stored()
    if settings.export.path is not None:  # exports stay where they were
        project.settings["export"] = replace(settings.export, path=relative_path(
            absolute_path(settings.export.path, old_base), new_base)).to_stored()
    for record in project.exports:
        record.path = relative_path(absolute_path(record.path, old_base), new_base) or record.path


def changed_files(project: Project, digests: list[FileDigest]) -> list[str]:
    """A note (also logged) for each model or weights file among ``digests`` (the loaded model's) whose sha256
    differs from the one the project recorded."""
    recorded = {Path(d.path).name: d for d in project.model_digests}
    changes = []
    for digest in digests:
        old = recorded.get(Path(digest.path).name)
        if old is not None and old.sha256 != digest.sha256:
            changes.append(f"{digest.path} changed since the project was saved (sha256 "
                           f"{old.sha256[:12]}... is now {digest.sha256[:12]}...); its calibration may "
                           "no longer fit: recalibrate.")
    for message in changes:
        logger.warning(message)
    return changes


def trust_changed_hint(path: Path, references: list[CodeReference]) -> str:
    """For a project whose code was trusted before and changed since: which files changed, to check them first."""
    changed = changed_code_files(path, references)
    files = ", ".join(Path(f).name for f in changed) if changed else \
        (", ".join(Path(f).name for r in references for f in r.files) or "its references")
    return f"It was trusted before, but its code changed since ({files}): check it before trusting it again."


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
