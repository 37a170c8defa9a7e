"""The local modules a trusted file imports, found by reading its source (nothing is run).

Trust is given to code as it is (:mod:`workbench.sources.trust`); a factory in ``usehelper.py`` that does
``from helper import build`` runs ``helper.py`` too, so the trust must cover that file's bytes as well.
The closure is followed through ``import``/``from ... import`` statements anywhere in a module (inside
functions too: they run when the factory is called), resolved the way Python would against the user's
folders only (the entry file's folder and the project's folder). Installed packages (site-packages, the
standard library) are not followed: they are not the project's code and change only when the user
installs something.

What reading cannot see is said, not guessed: ``importlib.import_module(name)`` or ``__import__(name)``
with a computed name, and ``exec``/``runpy`` of another file, are reported as not covered.
"""
from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ModuleClosure", "module_closure", "MAX_FILES"]

MAX_FILES = 2000  # a folder with more local modules than this is not walked further (said in the notes)
_DYNAMIC_CALLS = {"import_module", "__import__", "exec", "run_path", "run_module", "spec_from_file_location"}


@dataclass
class ModuleClosure:
    """The files an entry file runs when imported (itself first), and what reading could not follow."""

    files: list[Path] = field(default_factory=list)
    not_covered: list[str] = field(default_factory=list)


def _is_installed(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def _module_files(dotted: str, roots: Sequence[Path]) -> list[Path]:
    """The files ``import dotted`` runs when it is found under one of ``roots``: each package's
    ``__init__.py`` on the way and the module itself; [] when it is not a local module."""
    parts = dotted.split(".")
    for root in roots:
        found: list[Path] = []
        folder = root
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            package = folder / part / "__init__.py"
            module = folder / f"{part}.py"
            if package.is_file():
                found.append(package)
                folder = folder / part
            elif module.is_file() and last:
                found.append(module)
            elif (folder / part).is_dir() and not last:  # a namespace package: no __init__ to run
                folder = folder / part
            else:
                break
        else:
            if found:
                return [f.resolve() for f in found if not _is_installed(f.resolve())]
        if found and index > 0:  # `import pkg.missing`: the package part is still run
            return [f.resolve() for f in found if not _is_installed(f.resolve())]
    return []


def _package_of(path: Path, level: int) -> Path:
    folder = path.parent
    for _ in range(level - 1):
        folder = folder.parent
    return folder


def _imports(path: Path, tree: ast.AST, roots: Sequence[Path]) -> tuple[list[Path], list[str]]:
    files: list[Path] = []
    dynamic: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                files += _module_files(alias.name, roots)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package the file is in
                base = [_package_of(path, node.level)]
                module = node.module or ""
                if module:
                    files += _module_files(module, base)
                prefix = f"{module}." if module else ""
                for alias in node.names:  # `from . import helper` imports a submodule
                    files += _module_files(prefix + alias.name, base)
            elif node.module:
                files += _module_files(node.module, roots)
                for alias in node.names:
                    if alias.name != "*":
                        files += _module_files(f"{node.module}.{alias.name}", roots)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _DYNAMIC_CALLS:
                computed = not (node.args and isinstance(node.args[0], ast.Constant))
                if name in ("import_module", "__import__") and not computed:
                    files += _module_files(str(node.args[0].value), roots)
                else:
                    dynamic.append(f"{path.name}:{node.lineno} runs {name}(...), which reading cannot follow")
    return files, dynamic


def module_closure(entry: Path, roots: Sequence[Path]) -> ModuleClosure:
    """``entry`` and every local module it imports, transitively, resolved against ``roots`` in order.

    Nothing is imported or run. Files under site-packages/dist-packages are left out (installed code).
    """
    entry = Path(entry).resolve()
    roots = [Path(r).resolve() for r in roots]
    closure = ModuleClosure()
    seen: set[Path] = set()
    queue = [entry]
    while queue:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        closure.files.append(path)
        if len(seen) > MAX_FILES:
            closure.not_covered.append(f"more than {MAX_FILES} local modules: the rest are not covered")
            break
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError):
            continue  # its bytes are still hashed: any change to it is seen
        # a module finds its siblings first (the entry's folder is first on sys.path; a package's own
        # folder for relative imports is handled in _imports)
        found, dynamic = _imports(path, tree, roots)
        closure.not_covered += dynamic
        queue += [f for f in found if f not in seen]
    return closure
