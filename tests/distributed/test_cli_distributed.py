"""`workbench calibrate|sensitivity` with --workers 2 and under torchrun, against the same commands in one process.

The commands run as real subprocesses (that is how users start them), on a tiny project whose model
and data are entry points in the test's folder; the data entry point can be told to fail on one rank.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from worker_code import write_worker_code

from workbench import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def run_process(*args: str, fail_on_rank: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", WORKBENCH_DIST_TIMEOUT="60")
    env.pop("FAIL_ON_RANK", None)
    if fail_on_rank is not None:
        env["FAIL_ON_RANK"] = str(fail_on_rank)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def project(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_worker_code(tmp_path, batches=5)
    path = tmp_path / "tiny.qwb"
    code, _, err = run_cli(capsys, "new", path, "--model", "net.py:make", "--data", "data.py:batches",
                           "--trust-code", "--metric", "mse")
    assert code == 0, err
    code, _, err = run_cli(capsys, "set", path, "--type", "Conv2d", "--input-desc", "calib_method=histogram",
                           "--trust-code")
    assert code == 0, err
    return path


def twin(path: Path, name: str) -> Path:
    """A copy of the project next to it (its entry points are found relative to the folder)."""
    copy = path.with_name(name)
    shutil.copyfile(path, copy)
    return copy


def test_calibrate_with_two_workers_equals_one_process(project, capsys):
    single = twin(project, "single.qwb")
    code, out, err = run_cli(capsys, "calibrate", single, "--trust-code", "--json")
    assert code == 0, err
    expected = json.loads(out)

    done = run_process("-m", "workbench", "calibrate", str(project), "--workers", "2", "--trust-code", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # one JSON document: only rank 0 reports
    assert result["world_size"] == 2 and expected["world_size"] == 1
    assert result["batches"] == expected["batches"] == 5
    assert result["quantizers"].keys() == expected["quantizers"].keys()
    for name, item in expected["quantizers"].items():
        assert result["quantizers"][name]["amax"] == item["amax"], name  # entropy and max alike
        assert result["quantizers"][name]["samples"] == item["samples"], name

    # rank 0 saved the project: reopened, it holds the calibration the two processes found
    code, out, err = run_cli(capsys, "show", project, "--trust-code", "--json")
    assert code == 0, err
    assert json.loads(out)["calibration"]["method"] == "auto"  # a new project's default: the same pick in both


def test_torchrun_sensitivity_equals_one_process(project, capsys):
    code, _, err = run_cli(capsys, "calibrate", project, "--trust-code")
    assert code == 0, err
    single = twin(project, "single.qwb")
    code, out, err = run_cli(capsys, "sensitivity", single, "--trust-code", "--json")
    assert code == 0, err
    expected = json.loads(out)

    done = run_process("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "workbench",
                       "sensitivity", str(project), "--trust-code", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["world_size"] == 2 and expected["world_size"] == 1
    units = {u["name"]: u for u in result["sensitivity"]["units"]}
    assert sorted(units) == sorted(u["name"] for u in expected["sensitivity"]["units"])
    for unit in expected["sensitivity"]["units"]:
        assert units[unit["name"]]["rank"] == unit["rank"]
        assert units[unit["name"]]["value"] == pytest.approx(unit["value"], rel=1e-6)
    code, out, _ = run_cli(capsys, "show", project, "--trust-code", "--json")
    assert json.loads(out)["sensitivity_runs"] == 1  # written once, by rank 0


def test_a_failing_rank_leaves_the_project_byte_identical(project):
    before = project.read_bytes()
    done = run_process("-m", "workbench", "calibrate", str(project), "--workers", "2", "--trust-code", "--json",
                       fail_on_rank=1)
    assert done.returncode == 1
    assert "rank 1 failed" in done.stderr and "the data disk of this rank is full" in done.stderr
    assert "The project was not changed" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""  # no result printed
    assert project.read_bytes() == before


def test_workers_must_be_positive(project, capsys):
    code, _, err = run_cli(capsys, "calibrate", project, "--workers", "0", "--trust-code")
    assert code == 2 and "--workers must be at least 1" in err


def test_commands_that_do_not_run_distributed_are_refused_under_torchrun(project, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    before = project.read_bytes()
    code, out, err = run_cli(capsys, "export", project, "--trust-code")
    assert code == 2 and "only calibrate and sensitivity run in several processes" in err
    assert project.read_bytes() == before and not list(project.parent.glob("*.onnx"))
