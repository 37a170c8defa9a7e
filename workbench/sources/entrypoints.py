"""Resolve ``path/to/file.py:name`` or ``package.module:name`` to a Python object (runs the user's code)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from workbench.sources.errors import EntryPointError

_FORM = "'path/to/file.py:function' or 'package.module:function'"


def split_entrypoint(spec: str) -> tuple[str, str]:
    """``"a/b.py:make"`` -> ``("a/b.py", "make")``; ``"pkg.mod:Class.make"`` -> ``("pkg.mod", "Class.make")``.

    The split is at the last colon, so Windows paths (``C:\\metrics\\coco.py:mean_ap``) work.

    Raises:
        EntryPointError: not a string, no colon, an empty side, or an attribute that is not a (dotted) name.
    """
    if not isinstance(spec, str):
        raise EntryPointError(f"An entry point is a string that must look like {_FORM}, got {spec!r}.")
    target, colon, name = spec.strip().rpartition(":")
    if not colon or not target or not all(part.isidentifier() for part in name.split(".")):
        raise EntryPointError(f"Entry point {spec!r} must look like {_FORM}.")
    return target, name


def is_file_target(target: str) -> bool:
    """Whether the first part of an entry point is a file path (rather than a module name)."""
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


@contextlib.contextmanager
def running_user_code(spec: str) -> Iterator[None]:
    """Run the user's code with its prints on stderr (stdout may carry ``--json`` output) and ``sys.exit``
    turned into an error that names the entry point (user code must not end the program).

    Raises:
        EntryPointError: the code called ``sys.exit`` (or raised SystemExit).
    """
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except SystemExit as exit_:
        raise EntryPointError(f"entry point {spec!r} called sys.exit({exit_.code!r}): user code must return, not end "
                              "the program; nothing was done with its result.") from exit_


def _guarded(function: Callable, spec: str) -> Callable:
    """``function`` that runs under :func:`running_user_code` on every call."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with running_user_code(spec):
            result = function(*args, **kwargs)
        return _guarded_steps(result, spec) if inspect.isgenerator(result) else result

    return call


def _guarded_steps(generator: Iterator, spec: str) -> Iterator:
    """A generator's body runs when it is iterated: each step runs under :func:`running_user_code`."""
    while True:
        with running_user_code(spec):
            try:
                item = next(generator)
            except StopIteration:
                return
        yield item


def load_entrypoint(spec: str, base_dir: Path | None = None) -> Any:
    """The object named by ``spec``. Relative file paths are relative to ``base_dir`` (default: cwd).

    A file is run as a fresh module on each call (so edits are picked up), under a name of its own per
    path so that two projects' ``model.py`` do not replace each other; a module is imported with
    ``base_dir`` on the import path. The attribute may be dotted (``"module:Class.method"``).

    Raises:
        EntryPointError: the spec is malformed, the file or module does not exist or fails to import
            (its error is quoted), or it has no such attribute.
    """
    target, name = split_entrypoint(spec)
    if is_file_target(target):
        path = Path(target).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise EntryPointError(f"{path}: no such Python file (from entry point {spec!r}).")
        module_name = "_workbench_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise EntryPointError(f"{path}: cannot be imported as a Python module (from entry point {spec!r}).")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # dataclasses and pickling inside the file look themselves up there
        try:
            with extra_import_path(path.resolve().parent), running_user_code(spec):
                module_spec.loader.exec_module(module)
        except EntryPointError:
            sys.modules.pop(module_name, None)
            raise
        except Exception as error:
            sys.modules.pop(module_name, None)
            raise EntryPointError(f"{path}: importing it raised {type(error).__name__}: {error} (from entry point "
                                  f"{spec!r}).") from error
        where = str(path)
    else:
        try:
            with extra_import_path(base_dir), running_user_code(spec):
                module = importlib.import_module(target)
        except EntryPointError:
            raise
        except Exception as error:  # ImportError, or the module's own code failing
            raise EntryPointError(f"module {target!r} cannot be imported (from entry point {spec!r}): "
                                  f"{type(error).__name__}: {error}") from error
        where = f"module {target!r}"
    obj: Any = module
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EntryPointError(f"{where} has no attribute {name!r} (from entry point {spec!r}).") from None
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return _guarded(obj, spec)
    return obj
