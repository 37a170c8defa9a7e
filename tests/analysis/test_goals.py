"""One rule for a tolerance where FP32 is infinite (SQNR), followed alike by the library, the CLI and the session
the GUI calls (issue 29 point 4)."""
import json
import math

import pytest

from tests.cli_run import run
from workbench import cli
from workbench.analysis.goals import Goal, resolve_goal
from workbench.session import Session


def test_a_finite_fp32_or_a_target_leaves_the_goal_as_given():
    assert resolve_goal(tolerance=0.01, target=None, fp32=0.9, quantized=0.8, higher_is_better=True,
                        metric_name="top1") == Goal(0.01, None)
    assert resolve_goal(tolerance=None, target=30.0, fp32=math.inf, quantized=25.0, higher_is_better=True,
                        metric_name="sqnr") == Goal(None, 30.0)


def test_a_tolerance_on_an_infinite_fp32_counts_from_the_quantized_value_in_the_metric_s_direction():
    up = resolve_goal(tolerance=2.0, target=None, fp32=math.inf, quantized=25.0, higher_is_better=True,
                      metric_name="sqnr")
    assert (up.tolerance, up.target) == (None, 27.0)
    assert "counts from the all-INT8 value 25" in up.note and "target is 27" in up.note
    down = resolve_goal(tolerance=0.5, target=None, fp32=-math.inf, quantized=3.0, higher_is_better=False,
                        metric_name="loss")
    assert (down.tolerance, down.target) == (None, 2.5)


def test_nothing_finite_to_count_from_is_a_clear_error():
    with pytest.raises(ValueError, match="nothing to count from: give a target"):
        resolve_goal(tolerance=1.0, target=None, fp32=math.inf, quantized=math.inf, higher_is_better=True,
                     metric_name="sqnr")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = tmp_path_factory.mktemp("goals") / "digits.qwb"
    assert cli.main([str(a) for a in ("new", path, "--model", "demo:digits", "--data", "demo:digits:train",
                                      "--eval-data", "demo:digits:test", "--batch-size", "64", "--num-batches",
                                      "2")]) == 0
    assert cli.main(["calibrate", str(path), "--method", "max"]) == 0
    return path


def test_cli_and_session_read_an_sqnr_tolerance_alike(calibrated, capsys):
    code, out, err = run(capsys, "sensitivity", calibrated, "--metric", "sqnr", "--tolerance", "2", "--json")
    assert code == 0, err
    by_cli = json.loads(out)["fallback"]
    start = json.loads(out)["sensitivity"]["quantized"]
    assert by_cli["tolerance"] is None and by_cli["target"] == pytest.approx(start + 2)

    # the GUI's path: the controller calls the session with the tolerance the panel holds
    session = Session.open(calibrated)
    by_session = session.fallback(tolerance=2.0, metric="sqnr")
    assert by_session.tolerance is None and by_session.target == pytest.approx(by_cli["target"])
    assert by_session.chosen_names == [unit["name"] for unit in by_cli["chosen"]]
    assert by_session.reached == by_cli["reached"]
    assert any("counts from the all-INT8 value" in note for note in by_session.notes)
    assert "counts from the all-INT8 value" in by_cli["goal_note"]
