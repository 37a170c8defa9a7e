"""What the command line loads before it works, and how its modules depend on each other.

Each command's options are added when it is chosen and each handler imports what it runs, so that
``workbench --help`` starts in a fraction of a second instead of loading torch; these tests run the CLI in a
fresh interpreter (a module loaded by another test would hide an import) and read ``sys.modules``.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import run
from workbench import cli

ROOT = Path(__file__).resolve().parents[1]
CLI_PACKAGE = ROOT / "workbench" / "cli"

# prints the command's exit code, its output and the modules loaded by it (beyond those loaded by SETUP)
PROBE = """
import contextlib, io, json, sys
{setup}
before = set(sys.modules)
from workbench.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(json.loads(sys.argv[1]))
print(json.dumps({{"code": code, "out": out.getvalue(), "loaded": sorted(set(sys.modules) - before)}}))
"""


def probe(argv: list[str], setup: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup), json.dumps(argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def ours(modules: list[str]) -> list[str]:
    return [name for name in modules if name == "workbench" or name.startswith("workbench.")]


def test_help_loads_the_cli_alone():
    result = probe(["--help"])
    assert result["code"] == 0
    assert "calibrate" in result["out"] and "engine-report" in result["out"]  # every command listed
    assert set(ours(result["loaded"])) == {"workbench", "workbench.cli", "workbench.cli.common",
                                            "workbench.cli.entry", "workbench.cli.project", "workbench.cli.jobs",
                                            "workbench.cli.engine", "workbench.cli.trust"}
    assert not {"torch", "numpy", "onnx", "tqdm"} & set(result["loaded"])


def test_a_command_help_loads_its_registries_but_not_the_session():
    result = probe(["calibrate", "--help"])
    assert result["code"] == 0
    assert "--percentile" in result["out"] and "entropy" in result["out"]  # choices from the methods registry
    loaded = set(result["loaded"])
    assert "workbench.quant.calib.methods" in loaded
    assert not {"workbench.session", "workbench.export", "workbench.training", "onnx"} & loaded
    # the registries --help reads (methods, precisions, settings' defaults) are light: the core is not loaded
    assert not {"torch", "workbench.quant.tensor_quant", "workbench.quant.calib.histogram"} & loaded
    export_help = probe(["export", "--help"])
    assert export_help["code"] == 0 and "--opset" in export_help["out"]
    assert "torch" not in export_help["loaded"]


def test_show_loads_no_more_than_opening_the_project_does(tmp_path, capsys):
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", "demo:digits", "--data", "demo:digits")
    assert code == 0, err
    # the session (and what it imports) is what show needs; the CLI must add no workbench module of its own,
    # such as the exporter, the trainer or analysis for their error classes
    result = probe(["show", str(project)], setup="import workbench.cli, workbench.session")
    assert result["code"] == 0
    assert "p (" in result["out"] and "layers: " in result["out"]
    assert ours(result["loaded"]) == []


def test_commands_chosen_lazily_get_the_same_options_and_help_as_the_complete_parser(capsys):
    complete = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    for name, parser in complete.items():
        code, out, _ = run(capsys, name, "--help")
        assert code == 0
        assert out == parser.format_help(), name


def test_a_command_gets_its_options_when_parsed_from_a_lazy_parser():
    parser = cli.build_parser(complete=False)
    args = parser.parse_args(["calibrate", "p.qwb", "--method", "percentile", "--percentile", "99.9", "--json"])
    assert (args.command, args.project, args.method, args.percentile, args.json) == ("calibrate", "p.qwb",
                                                                                   "percentile", 99.9, True)
    assert callable(args.func)
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "p.qwb", "--method", "nonsense"])  # the registry's choices apply


def _cli_imports() -> dict[str, list[tuple[str, str]]]:
    """Each module of the CLI package: the (module, name) pairs it imports from workbench.cli, at any depth."""
    modules = {path.stem for path in CLI_PACKAGE.glob("*.py")}
    found = {}
    for path in sorted(CLI_PACKAGE.glob("*.py")):
        pairs = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench.cli"):
                for alias in node.names:  # `from workbench.cli import jobs` imports the module jobs
                    submodule = node.module == "workbench.cli" and alias.name in modules
                    pairs.append((f"workbench.cli.{alias.name}" if submodule else node.module, alias.name))
            elif isinstance(node, ast.Import):
                pairs += [(alias.name, "") for alias in node.names if alias.name.startswith("workbench.cli")]
        found[path.stem] = pairs
    return found


def test_no_private_name_crosses_the_cli_modules():
    crossing = [f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}"
                for path in sorted((ROOT / "workbench").rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench.cli")
                for alias in node.names if alias.name.startswith("_")]
    assert crossing == []


def test_the_cli_modules_import_one_way():
    imports = _cli_imports()
    assert set(imports) >= {"__init__", "entry", "common", "project", "jobs", "engine", "trust"}
    assert imports["common"] == []  # the shared helpers depend on no command
    edges = {name: {module.removeprefix("workbench.cli").lstrip(".") or "__init__" for module, _ in pairs}
             for name, pairs in imports.items()}
    # no circle: taking away, again and again, the modules that import no remaining one empties the graph
    remaining = dict(edges)
    while remaining:
        leaves = {name for name, targets in remaining.items() if not targets & set(remaining)}
        assert leaves, f"import circle among {sorted(remaining)}"
        remaining = {name: targets for name, targets in remaining.items() if name not in leaves}


def test_show_loads_no_onnx(tmp_path, capsys):
    """Showing a project opens the session; its export and lint modules load onnx only when they read or write
    a file, and the session reaches the export package only for its light naming helpers."""
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", "demo:digits", "--data", "demo:digits")
    assert code == 0, err
    result = probe(["show", str(project)])
    assert result["code"] == 0 and "layers: " in result["out"]
    loaded = set(result["loaded"])
    assert "workbench.session" in loaded and "workbench.export.naming" in loaded  # what it needs did load
    assert not {"onnx", "onnxscript", "onnxruntime", "workbench.export.onnx_export", "workbench.export.lint",
                "workbench.engine"} & loaded
