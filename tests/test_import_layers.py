"""The package's import graph keeps DESIGN.md's contracts: imports only go downward, Qt only under app/, the leaf
helpers import no layer, no job module imports the Session back, and no import circle between the modules of a
package.

The contracts are declared in pyproject.toml (``[tool.importlinter]``) and checked by import-linter, which reads the
import graph from the source (grimp): an import inside a function or under ``if TYPE_CHECKING:`` counts as much as
one at the top, since the dependency is the same and moving an import into a function is no way out of a circle.
``lint-imports`` runs the same check from a shell.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

import workbench.session

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


@pytest.fixture(scope="module")
def lint_output() -> str:
    """``lint-imports`` on this checkout (in a fresh interpreter, without its cache: the source as it is now)."""
    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


@pytest.mark.parametrize("name", [contract["name"] for contract in _contracts()])
def test_design_contract_is_kept(lint_output, name):
    flat = " ".join(lint_output.split())
    verdict = re.search(re.escape(" ".join(name.split())) + r" (KEPT|BROKEN)", flat)
    assert verdict is not None, lint_output[-3000:]
    assert verdict.group(1) == "KEPT", f"broken contract '{name}':\n{lint_output[-6000:]}"


def test_every_top_level_module_is_placed_in_a_layer_or_among_the_leaf_helpers():
    """A new top-level module or package is placed in DESIGN.md's picture (pyproject.toml) before it can be
    checked: the layers contract says nothing about a module it does not name."""
    contracts = _contracts()
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    named = {part.strip() for layer in layers for part in layer.replace(":", "|").split("|")}
    leaves = set(next(c for c in contracts if c["name"].startswith("The leaf helpers"))["source_modules"])
    graph = grimp.build_graph("workbench")
    top = {module for module in graph.modules if module.count(".") == 1}
    assert top - named - leaves == set()


def test_the_layers_contract_sees_an_upward_import_inside_a_function():
    """The check is not blind: an upward import hidden in a function body (the quant core reaching for the
    session) is in the graph the contracts read."""
    graph = grimp.build_graph("workbench")
    graph.add_import(importer="workbench.quant.replace", imported="workbench.session.core", line_number=1,
                     line_contents="    from workbench.session.core import Session")
    assert graph.find_shortest_chain(importer="workbench.quant.replace", imported="workbench.session.core")


# ----- the session layer: the Session composes its job modules, and no job imports it back (issue 29 point 1) -----
# Read from the source too, so an import a type checker alone sees, or one inside a function, counts.

SESSION_DIR = Path(workbench.session.__file__).parent
CORE = "workbench.session.core"


def _session_imports(path: Path) -> set[str]:
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
                       if name not in ("workbench.session", CORE) and CORE in _session_imports(path))
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
    assert CORE in _session_imports(typing_only) and CORE in _session_imports(relative)
    assert CORE not in _session_imports(unrelated)


def test_the_package_face_still_offers_the_session():
    from workbench.session import Session
    from workbench.session.core import Session as CoreSession

    assert Session is CoreSession
