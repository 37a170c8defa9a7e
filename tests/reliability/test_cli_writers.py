"""Item 1 end to end: two real CLI processes on one project. Every success they report is in the file
afterwards, or the loser exits non-zero and the file keeps the winner's state."""
import pytest
from cli_helpers import new_project, run_process, start_held, wait_ready

from workbench.project import load_project

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length


@pytest.fixture
def project(tmp_path, capsys):
    return new_project(tmp_path, capsys)


def finish(process, go):
    go.touch()
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def test_set_ignore_during_calibration_keeps_both(project, tmp_path):
    """The issue's lost update: `set --ignore` while `calibrate` runs; calibrate saves last."""
    calibrating, ready, go = start_held(tmp_path, "cal", "calibrate", project, "--trust-code")
    wait_ready(calibrating, ready)  # calibrate has loaded and calibrated: it is about to save
    setting = run_process(tmp_path, "set", project, "--ignore", "^fc$", "--trust-code")
    assert setting.returncode == 0 and "ignored: fc" in setting.stdout, setting.stderr
    code, out, err = finish(calibrating, go)
    assert code == 0, err
    stored = load_project(project)
    assert stored.layers["fc"].quantize is False  # set's success is still there
    assert len(stored.calibrations) == 1  # and so is calibrate's


def test_two_calibrations_at_once_both_land(project, tmp_path):
    first, ready_1, go_1 = start_held(tmp_path, "a", "calibrate", project, "--method", "max", "--trust-code")
    second, ready_2, go_2 = start_held(tmp_path, "b", "calibrate", project, "--method", "percentile", "--trust-code")
    wait_ready(first, ready_1)
    wait_ready(second, ready_2)  # both loaded revision 1 and calibrated
    go_1.touch()
    go_2.touch()  # both save at once: the write lock orders them, the revision check merges the second
    results = [p.communicate(timeout=300) + (p.returncode,) for p in (first, second)]
    assert [code for _, _, code in results] == [0, 0], results
    methods = sorted(run.method for run in load_project(project).calibrations)
    assert methods == ["max", "percentile"]


def test_conflicting_edits_the_loser_exits_2_and_changes_nothing(project, tmp_path):
    ignoring, ready, go = start_held(tmp_path, "ign", "set", project, "--ignore", "^fc$", "--trust-code")
    wait_ready(ignoring, ready)
    other = run_process(tmp_path, "set", project, "--layer", "fc", "--input-desc", "num_bits=8,calib_method=max",
                        "--trust-code")
    assert other.returncode == 0, other.stderr
    before = project.read_bytes()
    code, out, err = finish(ignoring, go)
    assert code == 2 and "changed since this command opened it (by another process)" in err, err
    assert "nothing was saved; run it again" in err and "layer fc" in err and "Traceback" not in err
    assert out == ""  # no success reported
    assert project.read_bytes() == before
    stored = load_project(project)
    assert stored.layers["fc"].quantize is True and stored.layers["fc"].input_desc["calib_method"] == "max"
