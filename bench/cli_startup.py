"""How much the ``workbench`` command loads before it does anything: modules imported and wall time of
``workbench --help``, ``workbench show P.qwb`` and ``workbench calibrate --help``, this tree against a
baseline commit, measured in one run.

The baseline defaults to the last commit with the old single-module CLI (``workbench/cli.py``, before the
``workbench/cli/`` package); it is extracted from git into a temporary folder, with this tree's compiled
kernels copied in. Each run is a fresh ``python -c`` process (interpreter start included, as a user waits
for it); before and after alternate, and the table shows the median of ``--repeats``. P.qwb is the demo
digits project, created first.

    python bench/cli_startup.py [--baseline REF] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# run in the tree under test: the command's output is thrown away, what it loaded is printed as JSON
PROBE = """
import contextlib, io, json, sys
from workbench.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(json.loads(sys.argv[1]))
ours = sorted(name for name in sys.modules if name == "workbench" or name.startswith("workbench."))
print(json.dumps({"code": code, "workbench": len(ours), "all": len(sys.modules),
                  "heavy": [name for name in ("torch", "onnx", "workbench.session", "workbench.export",
                                              "workbench.analysis", "workbench.training") if name in sys.modules]}))
"""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def default_baseline() -> str:
    """The parent of the commit that removed ``workbench/cli.py`` (the old CLI's last state)."""
    removal = git("log", "-1", "--format=%H", "--diff-filter=D", "--", "workbench/cli.py")
    if not removal:
        raise SystemExit("no commit removed workbench/cli.py here: give --baseline REF")
    return f"{removal}^"


def extract(ref: str, folder: Path) -> Path:
    """The ``workbench`` package at ``ref`` in ``folder``, with this tree's compiled extensions."""
    archive = subprocess.run(["git", "archive", ref, "workbench"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    for built in (ROOT / "workbench").rglob("*.so"):
        target = folder / built.relative_to(ROOT)
        if target.parent.is_dir():
            shutil.copy2(built, target)
    return folder


def probe(tree: Path, argv: list[str], env: dict[str, str]) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=tree, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"{' '.join(argv)} failed in {tree}:\n{done.stderr[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git ref of the 'before' tree (default: the last single-module CLI)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    baseline = args.baseline or default_baseline()
    folder = Path(tempfile.mkdtemp(prefix="qwb-cli-startup-"))
    try:
        (folder / "before").mkdir()
        before = extract(baseline, folder / "before")
        # resources (the demo weights) come from this tree for both
        env = {**os.environ, "WORKBENCH_RESOURCES": str(ROOT / "resources")}
        project = folder / "P.qwb"
        subprocess.run([sys.executable, "-m", "workbench", "new", str(project), "--model", "demo:digits", "--data",
                        "demo:digits"], cwd=ROOT, env=env, check=True, capture_output=True)
        cases = {"workbench --help": ["--help"], "workbench show P.qwb": ["show", str(project)],
                 "workbench calibrate --help": ["calibrate", "--help"]}
        trees = {"before": before, "after": ROOT}
        runs: dict[tuple[str, str], list[dict]] = {}
        for name, argv in cases.items():
            for tree in trees.values():  # warm the file cache and write the baseline's .pyc files once
                probe(tree, argv, env)
            for _ in range(args.repeats):
                for label, tree in trees.items():
                    runs.setdefault((name, label), []).append(probe(tree, argv, env))
        total = sum(1 for _ in (ROOT / "workbench").rglob("*.py"))
        print(f"baseline {git('rev-parse', '--short', baseline)} vs this tree ({git('rev-parse', '--short', 'HEAD')}"
              f"{', with changes' if git('status', '--porcelain', '--', 'workbench') else ''}); "
              f"median of {args.repeats} runs; this tree has {total} workbench modules")
        print(f"{'command':<28} {'tree':<7} {'wall s':>7} {'workbench mods':>15} {'all mods':>9}  heavy parts loaded")
        for name in cases:
            walls = {}
            for label in trees:
                results = runs[(name, label)]
                walls[label] = statistics.median(r["wall"] for r in results)
                last = results[-1]
                print(f"{name:<28} {label:<7} {walls[label]:>7.2f} {last['workbench']:>15} {last['all']:>9}  "
                      f"{', '.join(last['heavy']) or '-'}")
            print(f"{'':<28} {'ratio':<7} {walls['after'] / walls['before']:>7.2f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
