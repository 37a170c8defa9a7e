"""Resolve ``path/to/file.py:name`` or ``package.module:name`` to a Python object (runs the user's code)."""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.sources.errors import SourceError


def split_entrypoint(spec: str) -> tuple[str, str]:
    """``"a/b.py:make"`` -> ``("a/b.py", "make")``; ``"pkg.mod:make"`` -> ``("pkg.mod", "make")``."""
    if not isinstance(spec, str) or ":" not in spec:
        raise SourceError(f"{spec!r} is not an entry point: expected 'path/to/file.py:function' or "
                          "'package.module:function'.")
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise SourceError(f"{spec!r} is not an entry point: expected 'path/to/file.py:function' or "
                          "'package.module:function'.")
    return target, name


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


@contextlib.contextmanager
def extra_import_path(folder: Path | None) -> Iterator[None]:
    """Put ``folder`` first on sys.path while importing (so the user's module finds its siblings)."""
    if folder is None:
        yield
        return
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def load_entrypoint(spec: str, base_dir: Path | None = None) -> Any:
    """The object named by ``spec``. Relative file paths are relative to ``base_dir`` (default: cwd).

    Raises:
        SourceError: the file or module does not exist, fails to import (its error is quoted), or has
            no such name.
    """
    target, name = split_entrypoint(spec)
    if is_file_target(target):
        path = Path(target)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise SourceError(f"{path}: no such Python file (from entry point {spec!r}).")
        # a stable, unique module name per file so that two projects' model.py do not collide
        module_name = "_workbench_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise SourceError(f"{path}: cannot be imported as a Python module.")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            with extra_import_path(path.resolve().parent):
                module_spec.loader.exec_module(module)
        except Exception as error:
            sys.modules.pop(module_name, None)
            raise SourceError(f"{path}: importing it raised {type(error).__name__}: {error}") from error
        where = str(path)
    else:
        try:
            with extra_import_path(base_dir):
                module = importlib.import_module(target)
        except ImportError as error:
            raise SourceError(f"module {target!r} cannot be imported: {error}") from error
        except Exception as error:
            raise SourceError(f"module {target!r}: importing it raised {type(error).__name__}: {error}") from error
        where = f"module {target}"
    if not hasattr(module, name):
        raise SourceError(f"{where} has no {name!r} (from entry point {spec!r}).")
    return getattr(module, name)
