"""Item 9: damaged project and data files, fuzzed (byte flips, overwrites, truncation, appended junk).

The rule: a command exits 2 with one line that names the file, never a traceback or an internal error
(exit 1), and never exits 0 with data that differs from what was saved. Examples are bounded so the
suite stays fast; each test says how many it runs.
"""
import sys
from pathlib import Path

import pytest
from cli_helpers import new_project, run, strict_json, write_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "project"))
from fuzzing import mutate  # noqa: E402

from workbench.project import ProjectError, load_project, save_project  # noqa: E402
from workbench.project.merge import digests  # noqa: E402

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A small calibrated project (and its show --json) to damage copies of."""
    folder = tmp_path_factory.mktemp("fuzz-base")

    class Capture:  # capsys is function-scoped: read stdout by hand
        def readouterr(self):
            return "", ""

    project = new_project(folder, Capture())
    from workbench import cli

    assert cli.main(["calibrate", str(project), "--trust-code"]) == 0
    return project


def check_outcome(code: int, err: str, path: Path) -> None:
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 2:
        assert str(path) in err or path.name in err, err


@FUZZ
@given(data=st.data())
def test_a_damaged_project_loads_unchanged_or_not_at_all(calibrated, tmp_path_factory, data):
    """25 examples: load_project gives the saved contents or a ProjectError, nothing else."""
    original = load_project(calibrated)
    path = tmp_path_factory.mktemp("fuzz") / "p.qwb"
    path.write_bytes(mutate(calibrated.read_bytes(), data))
    try:
        loaded = load_project(path)
    except ProjectError as error:
        assert str(path) in str(error)
        return
    assert digests(loaded) == digests(original)  # a load that succeeds has exactly what was saved


@FUZZ
@given(data=st.data())
def test_show_and_set_on_a_damaged_project(calibrated, tmp_path_factory, capsys, data):
    """25 examples: `show --json` and `set --ignore` exit 0 with the saved contents, or 2 and change nothing."""
    code, out, err = run(capsys, "show", calibrated, "--trust-code", "--json")
    assert code == 0, err
    reference = strict_json(out)
    folder = tmp_path_factory.mktemp("fuzz-cli")
    path = folder / "p.qwb"
    for name in ("net.py", "x.npy"):
        (folder / name).write_bytes((calibrated.parent / name).read_bytes())
    damaged = mutate(calibrated.read_bytes(), data)
    path.write_bytes(damaged)
    code, out, err = run(capsys, "show", path, "--trust-code", "--json")
    check_outcome(code, err, path)
    assert path.read_bytes() == damaged  # show never writes
    if code == 0:
        shown = strict_json(out)
        assert shown["layer_table"] == reference["layer_table"] and shown["calibration"] == reference["calibration"]
    code, out, err = run(capsys, "set", path, "--ignore", "^fc$", "--trust-code")
    check_outcome(code, err, path)
    if code == 2:
        assert path.read_bytes() == damaged  # a refused command leaves the file as it was
    else:
        assert load_project(path).layers["fc"].quantize is False


@FUZZ
@given(data=st.data(), suffix=st.sampled_from([".npy", ".pt", ".npz"]))
def test_a_damaged_data_file_at_new(tmp_path_factory, capsys, data, suffix):
    """25 examples over .npy/.pt/.npz: `new` exits 0 or 2 naming the file, and a refused `new` leaves no project."""
    import numpy as np
    import torch

    folder = tmp_path_factory.mktemp("fuzz-data")
    model = write_model(folder)
    array = np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)
    clean = folder / f"clean{suffix}"
    if suffix == ".npy":
        np.save(clean, array)
    elif suffix == ".npz":
        np.savez(clean, inputs=array)
    else:
        torch.save(torch.from_numpy(array), clean)
    damaged = folder / f"data{suffix}"
    damaged.write_bytes(mutate(clean.read_bytes(), data))
    project = folder / "p.qwb"
    code, out, err = run(capsys, "new", project, "--model", f"{model}:make", "--data", damaged, "--batch-size", "2",
                         "--trust-code")
    check_outcome(code, err, damaged)
    assert project.exists() == (code == 0)


def test_a_saved_project_with_a_changed_value_is_refused(calibrated, tmp_path):
    """The checksum: a value changed in place (valid SQLite, valid JSON) is not taken for the saved one."""
    import sqlite3

    path = tmp_path / "p.qwb"
    path.write_bytes(calibrated.read_bytes())
    connection = sqlite3.connect(path)
    connection.execute("UPDATE layers SET quantize = 0 WHERE name = 'conv'")
    connection.commit()
    connection.close()
    with pytest.raises(ProjectError, match="table layers do not match the checksum"):
        load_project(path)
    save_project(load_project(calibrated), tmp_path / "again.qwb")  # a normal save verifies cleanly
    load_project(tmp_path / "again.qwb")
