"""Imports go one way inside the session layer: the Session (``workbench.session.core``) composes its job
modules, and no job module imports it back (issue 29: jobs receive what they need, not the session).

Read from the source with :mod:`ast`, so an import a type checker alone sees (``if TYPE_CHECKING:``) or one
inside a function counts too: each would be the same circle, hidden.
"""
import ast
from pathlib import Path

import workbench.session

SESSION_DIR = Path(workbench.session.__file__).parent
CORE = "workbench.session.core"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as a.b too, since b may be a module)."""
    package = "workbench.session"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package (level 1) or above
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _session_modules() -> dict[str, Path]:
    return {f"workbench.session.{path.stem}" if path.stem != "__init__" else "workbench.session": path
            for path in sorted(SESSION_DIR.glob("*.py"))}


def test_no_session_module_imports_the_session_core_but_the_package_face():
    modules = _session_modules()
    assert CORE in modules and len(modules) > 10  # the walk sees the package's modules
    offenders = sorted(name for name, path in modules.items()
                       if name not in ("workbench.session", CORE) and CORE in _imports(path))
    assert offenders == []


def test_no_job_module_reaches_into_the_sessions_private_members():
    """``session._x`` in a job module is the session's state handled outside it: pass values in instead."""
    offenders = []
    for name, path in _session_modules().items():
        if name == CORE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.value, ast.Name) and node.value.id == "session":
                offenders.append(f"{name}:{node.lineno} session.{node.attr}")
    assert offenders == []


def test_the_walk_finds_an_import_of_the_core_hidden_from_runtime(tmp_path):
    """The check is not blind: a TYPE_CHECKING import and a relative one inside a function are both seen."""
    typing_only = tmp_path / "typing_only.py"
    typing_only.write_text("from typing import TYPE_CHECKING\n"
                           "if TYPE_CHECKING:\n    from workbench.session.core import Session\n")
    relative = tmp_path / "relative.py"
    relative.write_text("def job():\n    from . import core\n    return core\n")
    unrelated = tmp_path / "unrelated.py"
    unrelated.write_text("from workbench.session.build import build_quantized\nimport workbench.session.errors\n")
    assert CORE in _imports(typing_only) and CORE in _imports(relative) and CORE not in _imports(unrelated)


def test_the_package_face_still_offers_the_session():
    from workbench.session import Session
    from workbench.session.core import Session as CoreSession

    assert Session is CoreSession
