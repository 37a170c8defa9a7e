"""Load a user's function from ``module:function`` or ``path/to/file.py:function``.

How a user plugs in their own metric (COCO mAP, a task-specific score) without writing a plugin: the
same spelling as a console-script entry point, or a plain file next to their project.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["EntryPointError", "load_entry_point", "parse_entry_point"]


class EntryPointError(ValueError):
    """The entry point is malformed, or its module, file or function cannot be loaded."""


def parse_entry_point(spec: str) -> tuple[str, str]:
    """Split ``"module:function"`` or ``"file.py:function"`` into its target and attribute path.

    The split is at the last colon, so Windows paths (``C:\\metrics\\coco.py:mean_ap``) work.

    Raises:
        EntryPointError: no colon, or an empty side.
    """
    if not isinstance(spec, str):
        raise EntryPointError(f"An entry point is a string such as 'package.module:function', got {spec!r}.")
    target, colon, attribute = spec.strip().rpartition(":")
    if not colon or not target or not attribute:
        raise EntryPointError(f"Entry point {spec!r} must look like 'package.module:function' or "
                              f"'path/to/file.py:function'.")
    return target, attribute


def _is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise EntryPointError(f"Cannot load {spec!r}: no file {str(path)!r}.")
    # a name of its own per path, so two projects' metrics.py do not replace each other in sys.modules
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module_name = f"_workbench_user_{path.stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise EntryPointError(f"Cannot load {spec!r}: {str(path)!r} is not a Python file.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling inside the file look themselves up there
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise EntryPointError(f"Cannot load {spec!r}: running {str(path)!r} raised "
                              f"{type(error).__name__}: {error}") from error
    return module


def load_entry_point(spec: str) -> Callable[..., Any]:
    """The callable that ``spec`` names.

    ``"package.module:function"`` imports the module (it must be importable); ``"path/file.py:function"``
    runs that file as a fresh module each call (so edits are picked up). The attribute may be dotted
    (``"module:Class.method"``).

    Raises:
        EntryPointError: the module or file cannot be loaded, the attribute is missing or not callable.
    """
    target, attribute = parse_entry_point(spec)
    if _is_file_target(target):
        module = _load_file(Path(target).expanduser().resolve(), spec)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as error:  # ImportError, or the module's own code failing
            raise EntryPointError(f"Cannot import module {target!r} for {spec!r}: "
                                  f"{type(error).__name__}: {error}") from error
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EntryPointError(f"Cannot load {spec!r}: {target!r} has no attribute {attribute!r}.") from None
    if not callable(obj):
        raise EntryPointError(f"{spec!r} is a {type(obj).__name__}, not a function.")
    return obj
