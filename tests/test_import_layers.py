"""The package's import graph: no circles between modules, and imports only go downward (DESIGN.md).

The graph is read from the source with `ast`, not by importing, so a circle that import order happens to survive
still shows. Every import of a workbench module is an edge, wherever it is written:
- under `if TYPE_CHECKING:`: the module is written against the other's interface, so the two cannot be
  understood (or moved) apart; the app's circles were of this kind, and are broken with a Protocol naming the
  shape needed instead;
- inside a function: it runs later, so it cannot fail at load time, but the dependency is the same, and moving an
  import into a function is not a way out of a circle (DESIGN.md). Lazy imports of optional ecosystems
  (transformers, timm, TensorRT) are not workbench modules, and lazy downward imports (the CLI's per-command
  ones) form no circle, so counting these costs nothing legitimate.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import workbench.session

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"

# DESIGN.md's layers, top to bottom: a module may import its own layer and those listed after it. The launcher
# sits under the session (session/workers.py starts local ranks through it; it imports only quant.distributed).
LAYERS = (
    "cli", "app", "session", "launcher", "training", "analysis", "engine", "project", "graph", "export",
    "sources", "quant",
)
# Leaf helpers at the package root that any layer may use (they import nothing of the package's layers).
SHARED = {"workbench", "workbench.strict_json", "workbench.resources", "workbench.opsets",
          "workbench.lazy_imports"}
# The other modules at the package root and the layer they belong to.
ROOT_MODULES = {"workbench.__main__": "cli", "workbench.demo_run": "session", "workbench.launcher": "launcher"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str, is_package: bool, top_level_only: bool) -> set[str]:
    """Absolute names this module imports (`from a import b` yields `a.b`: the module b, or a name in a's face)."""
    found: set[str] = set()
    package_parts = module.split(".") if is_package else module.split(".")[:-1]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package_parts[: len(package_parts) - node.level + 1]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import submodule` depends on the submodule; `from pkg import name` on pkg's face. (The
                # parent package a module lives in always loads first: not a choice, so not an edge.)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not top_level_only:
                    visit(node.body)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([child for child in getattr(node, field, []) if isinstance(child, ast.AST)])

    visit(tree.body)
    return found


def import_graph(top_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the workbench modules it imports (names that are not modules resolve to their package)."""
    sources = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    # compiled extensions (quant/_cpu_kernels.*.so) are modules too: leaves, not their package's face
    extensions = {".".join(p.relative_to(ROOT).parent.parts + (p.name.split(".")[0],))
                  for p in PACKAGE.rglob("*") if p.suffix in (".so", ".pyd")}
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = set()
        for target in _imports(tree, name, path.name == "__init__.py", top_level_only):
            while target and target not in sources and target not in extensions:  # `from pkg import func` -> pkg
                target = target.rpartition(".")[0]
            if target.startswith("workbench") and target != name and target in sources:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def layer_of(module: str) -> str | None:
    if module in SHARED:
        return None
    if module in ROOT_MODULES:
        return ROOT_MODULES[module]
    part = module.split(".")[1]
    if part.startswith("cli"):
        return "cli"
    return part if part in LAYERS else None


def test_walker_sees_a_relative_import_circle():
    """The walker itself: a two-module circle written with relative imports is found."""
    tree_a = ast.parse("from . import b\nfrom .c import thing\n")
    assert _imports(tree_a, "workbench.pkg.a", False, True) == {"workbench.pkg.b", "workbench.pkg.c.thing"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    hinted = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n")
    assert "workbench.pkg.d.D" in _imports(hinted, "workbench.pkg.a", False, True)
    lazy = ast.parse("def f():\n    import workbench.app\n")
    assert _imports(lazy, "workbench.x", False, True) == set()
    assert _imports(lazy, "workbench.x", False, False) == {"workbench.app"}


def test_no_import_circles():
    assert cycles(import_graph()) == [], "import circles"


def test_imports_only_go_downward():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, targets in import_graph().items():
        here = layer_of(module)
        if here is None:
            continue
        for target in targets:
            there = layer_of(target)
            if there is not None and rank[there] < rank[here]:
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports going up a layer:\n" + "\n".join(sorted(upward))


def test_qt_only_under_app():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name.startswith("workbench.app"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in {"PySide6", "PyQt5", "PyQt6", "pyqtgraph", "shiboken6"} for n in names):
                offenders.append(name)
    assert offenders == [], f"Qt imported outside workbench/app: {sorted(set(offenders))}"


def test_every_module_has_a_layer():
    """A new top-level module or package is placed in DESIGN.md's picture (here) before it can be checked."""
    unplaced = [m for m in import_graph() if m not in SHARED and layer_of(m) is None]
    assert unplaced == [], f"modules in no layer of DESIGN.md: {unplaced}"


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
