"""Load a user's function from ``module:function`` or ``path/to/file.py:function``.

How a user plugs in their own metric (COCO mAP, a task-specific score) or loss without writing a plugin:
the same spelling as a console-script entry point, or a plain file next to their project. Loading is
:func:`workbench.sources.entrypoints.load_entrypoint`, the one loader of user code (models, data,
metrics, losses); this module only adds that the object must be callable.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.sources.entrypoints import load_entrypoint
from workbench.sources.errors import EntryPointError

__all__ = ["EntryPointError", "load_entry_point"]


def load_entry_point(spec: str, base_dir: Path | None = None) -> Callable[..., Any]:
    """The callable that ``spec`` names; a relative file path is relative to ``base_dir`` (default: cwd).

    Raises:
        EntryPointError: the module or file cannot be loaded, the attribute is missing or not callable.
    """
    obj = load_entrypoint(spec, base_dir)
    if not callable(obj):
        raise EntryPointError(f"{spec!r} is a {type(obj).__name__}, not a function.")
    return obj
