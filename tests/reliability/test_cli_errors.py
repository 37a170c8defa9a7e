"""Items 2, 3, 4, 7 and 8 through the command line: exit codes, one-line errors that name the file,
strict JSON, exports that land where the project says."""
import errno
import sqlite3

import numpy as np
import pytest
from cli_helpers import new_project, run, strict_json, write_data, write_model

from workbench.project import load_project
from workbench.session import Session
from workbench.sources.data_source import DataSpec


@pytest.fixture
def project(tmp_path, capsys):
    return new_project(tmp_path, capsys)


def assert_user_error(code, err, *words):
    assert code == 2, err
    assert "internal error" not in err and "Traceback" not in err
    for word in words:
        assert str(word) in err, (word, err)


# ----- item 3: NaN data and strict JSON -------------------------------------------------------------


def test_all_nan_calibration_data_is_an_error_naming_the_quantizer(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    nan = write_data(tmp_path, "nan.npy", fill=float("nan"))
    # the project's calibration data replaced by all-NaN data (the CLI has no option for it; the GUI does)
    session = Session.open(project, trust_code=True)
    session.set_data("calibration", DataSpec("tensors", str(nan), batch_size=4))
    session.save()
    before = project.read_bytes()
    code, out, err = run(capsys, "calibrate", project, "--trust-code", "--json")
    assert_user_error(code, err, "conv._input_quantizer", "NaN or Inf")
    assert out == "" and project.read_bytes() == before


def test_calibrate_json_is_strict_and_carries_nonfinite_warnings(tmp_path, capsys):
    model = write_model(tmp_path)
    data = np.random.default_rng(0).standard_normal((8, 3, 6, 6)).astype(np.float32)
    data[:6] = np.nan  # 6 of 8 samples: batches 0 and 1 (of 4) are all NaN, the others clean
    np.save(tmp_path / "mostly_nan.npy", data)
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{model}:make", "--data", tmp_path / "mostly_nan.npy",
                       "--batch-size", "4", "--trust-code")
    assert code == 0, err
    code, out, err = run(capsys, "calibrate", project, "--trust-code", "--json")
    assert code == 0, err
    result = strict_json(out)  # raises on a bare NaN/Infinity
    assert any("mostly NaN/Inf" in w for w in result["warnings"]), result["warnings"]


def test_show_json_is_strict_with_an_infinite_sqnr(project, capsys):
    code, out, err = run(capsys, "calibrate", project, "--trust-code")
    assert code == 0, err
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--trust-code", "--json")
    assert code == 0, err
    strict_json(out)  # the FP32 model's SQNR is +inf: text, not Infinity


# ----- item 7: user code that prints or exits ----------------------------------------------------------


def test_a_printing_factory_does_not_corrupt_json(tmp_path, capsys):
    model, data = write_model(tmp_path), write_data(tmp_path)
    code, out, err = run(capsys, "new", tmp_path / "p.qwb", "--model", f"{model}:chatty", "--data", data,
                         "--batch-size", "4", "--trust-code", "--json")
    assert code == 0, err
    assert strict_json(out)["layers"] == 2 and "hello from the factory" in err


@pytest.mark.parametrize("factory, shown", [("exits", "sys.exit(0)"), ("exits_with_text", "sys.exit('bye')"),
                                            ("Quitter", "sys.exit(4)")])
def test_user_code_calling_sys_exit_is_an_error(tmp_path, capsys, factory, shown):
    model, data = write_model(tmp_path), write_data(tmp_path)
    code, out, err = run(capsys, "new", tmp_path / "p.qwb", "--model", f"{model}:{factory}", "--data", data,
                         "--trust-code")
    assert_user_error(code, err, shown)
    if factory != "Quitter":  # a function entry point is named; a class is caught as the command's error
        assert f"{model}:{factory}" in err
    assert out == "" and not (tmp_path / "p.qwb").exists()


# ----- item 4: evaluation data checked at new; full disk at export ---------------------------------------


def test_evaluation_data_with_the_wrong_channels_is_refused_at_new(tmp_path, capsys):
    model, data = write_model(tmp_path), write_data(tmp_path)
    gray = write_data(tmp_path, "gray.npy", channels=1)
    code, _, err = run(capsys, "new", tmp_path / "p.qwb", "--model", f"{model}:make", "--data", data,
                       "--eval-data", gray, "--trust-code")
    assert_user_error(code, err, "gray.npy", "(1, 6, 6)", "(3, 6, 6)")
    assert not (tmp_path / "p.qwb").exists()


def test_a_full_disk_during_export_names_the_file_and_leaves_nothing(project, tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "calibrate", project, "--trust-code")
    assert code == 0, err
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    import onnx

    def full_disk(proto, path, *args, **kwargs):
        with open(path, "wb") as handle:
            handle.write(b"\x08\x07partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(onnx, "save", full_disk)
    monkeypatch.setattr(onnx, "save_model", full_disk)
    before = project.read_bytes()
    code, out, err = run(capsys, "export", project, "-o", out_dir / "m.onnx", "--trust-code")
    assert_user_error(code, err, "No space left on device", out_dir / "m.onnx")
    assert list(out_dir.iterdir()) == []  # no .onnx, no temporary file
    assert project.read_bytes() == before


# ----- item 8: a failed new leaves nothing -----------------------------------------------------------------


def test_a_failed_new_leaves_no_stub(tmp_path, capsys, monkeypatch):
    import workbench.project.store as store

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "write_project", disk_full)
    model, data = write_model(tmp_path), write_data(tmp_path)
    args = ["new", tmp_path / "p.qwb", "--model", f"{model}:make", "--data", data, "--trust-code"]
    code, _, err = run(capsys, *args)
    assert_user_error(code, err, "disk is full", "p.qwb")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("p.qwb")) == []
    monkeypatch.undo()
    code, _, err = run(capsys, *args)  # no --force needed: nothing was left behind
    assert code == 0, err


def test_a_moved_project_says_where_it_looked_for_its_model(project, tmp_path, capsys):
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "p.qwb").write_bytes(project.read_bytes())  # moved without its code
    code, _, err = run(capsys, "show", moved / "p.qwb", "--trust-code")
    assert_user_error(code, err, moved / "net.py", "no such Python file", f"it was saved in {tmp_path}")
    (moved / "net.py").write_bytes((tmp_path / "net.py").read_bytes())
    (moved / "x.npy").write_bytes((tmp_path / "x.npy").read_bytes())
    code, _, err = run(capsys, "show", moved / "p.qwb", "--trust-code")
    assert code == 0, err  # moved with its code: relative entry points still lead to it


# ----- item 2: export paths -----------------------------------------------------------------------------


@pytest.fixture
def calibrated(project, capsys):
    code, _, err = run(capsys, "calibrate", project, "--trust-code")
    assert code == 0, err
    return project


def test_export_path_is_stored_relative_to_the_project(calibrated, tmp_path, capsys, monkeypatch):
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path / "models")
    code, _, err = run(capsys, "export", calibrated, "-o", "m.onnx", "--trust-code")
    assert code == 0, err
    target = tmp_path / "models" / "m.onnx"
    assert target.is_file()
    stored = load_project(calibrated)
    assert stored.settings["export"]["path"] == "models/m.onnx" and stored.exports[-1].path == "models/m.onnx"
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    stamp = target.stat().st_mtime_ns
    code, _, err = run(capsys, "export", calibrated, "--trust-code")  # the same file, from anywhere
    assert code == 0, err
    assert list(elsewhere.iterdir()) == [] and target.stat().st_mtime_ns >= stamp
    assert len(load_project(calibrated).exports) == 2


def test_export_refuses_to_overwrite_a_file_it_did_not_write(calibrated, tmp_path, capsys):
    foreign = tmp_path / "other_project.onnx"
    foreign.write_bytes(b"another project's model")
    code, _, err = run(capsys, "export", calibrated, "-o", foreign, "--trust-code")
    assert_user_error(code, err, foreign, "did not write", "--force")
    assert foreign.read_bytes() == b"another project's model"
    code, _, err = run(capsys, "export", calibrated, "-o", foreign, "--trust-code", "--force")
    assert code == 0, err
    assert foreign.read_bytes() != b"another project's model"


def test_export_overwrites_its_own_file_but_not_an_edited_one(calibrated, tmp_path, capsys):
    target = tmp_path / "m.onnx"
    assert run(capsys, "export", calibrated, "-o", target, "--trust-code")[0] == 0
    code, _, err = run(capsys, "export", calibrated, "-o", target, "--trust-code")
    assert code == 0, err  # its own, unchanged: fine
    target.write_bytes(target.read_bytes() + b"edited")
    code, _, err = run(capsys, "export", calibrated, "-o", target, "--trust-code")
    assert_user_error(code, err, target, "changed since this project exported it")
