"""`workbench sensitivity --ladder`: the mixed-precision search through the CLI, on a block where INT8 hurts
the one layer that reads outlier activation channels."""
import json

import numpy as np
import pytest

from tests.cli_run import run
from tests.test_cli_smoothing import MODEL
from workbench.session import Session


@pytest.fixture
def project(tmp_path, capsys):
    (tmp_path / "block.py").write_text(MODEL)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 16, 64), dtype=np.float32))
    path = tmp_path / "block.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/block.py:make", "--data", tmp_path / "x.npy",
                       "--batch-size", "8", "--trust-code")
    assert code == 0, err
    code, _, err = run(capsys, "calibrate", path, "--method", "max")
    assert code == 0, err
    return path


def test_the_ladder_puts_the_outlier_layer_in_fp8_and_nothing_in_float(project, capsys):
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--target", "25",
                         "--ladder", "int8,fp8,float", "--apply", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["precisions"] == {"fc": "fp8", "head": "int8"}  # every layer, nothing left in float
    assert data["value"] >= 25 and data["ladder"]["reached"]
    assert data["ladder"]["steps"][0]["value"] < 20  # all INT8 is far from it
    assert data["float_bytes"] > data["weight_bytes"]
    assert data["weight_bytes"] == (64 * 64 + 4 * 64) + (8 * 64 + 4 * 8) + 4 * (64 + 8 + 2 * 64)  # +biases, ln
    assert any("fp8 needs TensorRT" in note and "8.9" in note for note in data["ladder"]["notes"])
    session = Session.open(project, trust_code=True)  # applied and calibrated: the mix is the project's
    assert {k: v.value for k, v in session.precisions().items()} == {"fc": "fp8", "head": "int8"}
    assert session.latest_ladder().precisions == {"fc": "fp8", "head": "int8"}
    assert session.latest_fallback() is None  # a ladder is not a fallback search
    code, out, _ = run(capsys, "evaluate", project, "--metric", "sqnr", "--json")
    assert json.loads(out)["output_sqnr_db"] >= 25


def test_the_default_ladder_is_the_fallback_search_and_reports_its_mix(project, capsys):
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--target", "25", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "fallback" in data and data["precisions"]["fc"] == "float" and data["precisions"]["head"] == "int8"
    code, out2, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--target", "25", "--ladder",
                          "int8,float", "--json")
    assert code == 0, err
    assert json.loads(out2)["precisions"] == data["precisions"]


def test_a_size_budget_gets_the_best_metric_that_fits(project, capsys):
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--ladder", "int8,fp8,float",
                         "--budget-bytes", "8000", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["weight_bytes"] <= 8000  # fc in float (17728 bytes) would not fit
    assert data["precisions"]["fc"] == "fp8"  # the promotion that helps, at no extra bytes
    kept = [s for s in data["ladder"]["steps"] if s["kept"]]
    assert all(b["value"] > a["value"] for a, b in zip(kept, kept[1:]))  # each kept step improved the metric
    # a budget under even the cheapest rung is said, and exits 3 (not reached)
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--ladder", "int8,fp8,float",
                         "--budget-bytes", "100")
    assert code == 3 and "over the budget of 100" in out


def test_bad_ladders_are_refused(project, capsys):
    code, _, err = run(capsys, "sensitivity", project, "--target", "30", "--ladder", "int8,fp9")
    assert code == 2 and "unknown precision 'fp9'" in err
    code, _, err = run(capsys, "sensitivity", project, "--target", "30", "--ladder", "int8,int8,float")
    assert code == 2 and "int8 is repeated" in err
    code, _, err = run(capsys, "sensitivity", project, "--ladder", "int8,fp8,float")
    assert code == 2 and "--ladder needs a goal" in err
