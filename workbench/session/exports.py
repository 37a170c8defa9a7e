"""Where a project's exports go, and which existing files an export may replace.

Export paths are stored relative to the project's folder (absolute where they lie outside it), so an
``export`` from any working directory writes the same file. A path typed by the user is taken from
where it was typed. An existing file is only replaced when the project's export history says that
this project wrote it and it is unchanged since (same path, same sha256); anything else needs
``force``: an export must not silently overwrite another project's ONNX or a file the user edited.
"""
from __future__ import annotations

from pathlib import Path

from workbench.project import ExportRecord
from workbench.session.errors import SessionError
from workbench.sources.model_source import sha256_of
from workbench.sources.paths import absolute_path, relative_path

__all__ = ["resolve_export_path", "stored_export_path", "check_overwrite", "export_digest"]


def resolve_export_path(typed: str | Path | None, configured: str | None, project_dir: Path, default_name: str) -> Path:
    """The absolute target: ``typed`` (from the working directory), else the project's setting (from the
    project's folder), else ``default_name`` next to the project."""
    if typed is not None:
        return Path(typed).expanduser().resolve()
    if configured:
        return Path(absolute_path(configured, project_dir) or configured).resolve()
    return (project_dir / default_name).resolve()


def stored_export_path(target: Path, project_dir: Path) -> str:
    """``target`` as the project stores it: relative to the project's folder where it lies under it."""
    return relative_path(str(target), project_dir) or str(target)


def export_digest(target: Path) -> str:
    """The sha256 the export history keeps of a written file."""
    return sha256_of(target).sha256


def check_overwrite(target: Path, history: list[ExportRecord], project_dir: Path, force: bool) -> None:
    """Refuse to replace ``target`` unless this project wrote it and it is unchanged since (or ``force``).

    Raises:
        SessionError: ``target`` exists and the history does not show it as this project's, unchanged.
    """
    if force or not target.exists():
        return
    ours = [record for record in history
            if Path(absolute_path(record.path, project_dir) or record.path).resolve() == target]
    if not ours:
        raise SessionError(f"{target} exists and this project did not write it; nothing was exported. Choose another "
                           "path, or overwrite it with --force.")
    recorded = (ours[-1].settings or {}).get("sha256")
    if recorded is not None and recorded != export_digest(target):
        raise SessionError(f"{target} changed since this project exported it (its sha256 differs); nothing was "
                           "exported. Choose another path, or overwrite it with --force.")
