"""File paths inside sources, written relative to the project's folder and resolved against it.

A project stores the files it reads (a model's code and weights, data, a metric's file) relative to its
own folder where they lie under it, so that the folder can move; on "Save As" elsewhere every such path
is first made absolute against the old folder, then relative to the new one. Entry points
(``path/to/file.py:function``) carry a path in their first part; ``package.module:function`` carries none
and is left as it is.
"""
from __future__ import annotations

from pathlib import Path

from workbench.sources.entrypoints import is_file_target

__all__ = ["absolute_path", "relative_path", "absolute_entrypoint", "relative_entrypoint"]


def absolute_path(value: str | None, base_dir: Path) -> str | None:
    """``value`` as an absolute path: a relative one is taken relative to ``base_dir`` (None stays None)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def relative_path(value: str | None, base_dir: Path) -> str | None:
    """An absolute ``value`` under ``base_dir`` written relative to it; anything else as it was."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        return value
    try:
        return str(path.resolve().relative_to(base_dir.resolve()))
    except ValueError:  # outside the folder: an absolute path is the one that still finds it
        return str(path)


def _split(spec: str) -> tuple[str, str] | None:
    """(file part, attribute) of a file entry point; None for a module entry point or no entry point."""
    target, colon, attribute = spec.rpartition(":")
    if not colon or not target or not is_file_target(target):
        return None
    return target, attribute


def absolute_entrypoint(spec: str, base_dir: Path) -> str:
    """``file.py:function`` with the file's path made absolute against ``base_dir``; other specs unchanged."""
    parts = _split(spec)
    if parts is None:
        return spec
    return f"{absolute_path(parts[0], base_dir)}:{parts[1]}"


def relative_entrypoint(spec: str, base_dir: Path) -> str:
    """``file.py:function`` with the file's path relative to ``base_dir`` where it lies under it."""
    parts = _split(spec)
    if parts is None:
        return spec
    return f"{relative_path(parts[0], base_dir)}:{parts[1]}"
