"""The bench scripts are not run by CI (they take minutes), so at least check that they still import
against the current package: a moved module otherwise breaks them unnoticed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def test_there_are_bench_scripts():
    assert {p.stem for p in SCRIPTS} >= {"fake_quant", "calibration", "sensitivity", "project_io"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_bench_script_imports_and_has_a_main(script):
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # top-level imports only: the benchmark runs under __main__
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
