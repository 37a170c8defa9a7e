"""Issue 38's "unclear, to settle" list, as settled: each test is the user's view of the decision."""
from cli_helpers import new_project, run
from test_crafted_schema import craft


def test_set_num_batches_alone_changes_the_calibration_setting(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    code, out, err = run(capsys, "set", project, "--num-batches", "40", "--trust-code")
    assert code == 0, err
    assert "calibration batches: 40" in out
    code, out, _ = run(capsys, "show", project, "--trust-code")
    assert "calibration auto on 40 batches" in out


def test_set_batch_size_alone_rebatches_the_data(tmp_path, capsys):
    project = new_project(tmp_path, capsys)  # 8 samples in batches of 4
    code, out, err = run(capsys, "set", project, "--batch-size", "2", "--trust-code")
    assert code == 0, err
    assert "batch size: calibration 2" in out
    code, out, err = run(capsys, "calibrate", project, "--trust-code", "--method", "max")
    assert code == 0, err
    assert "on 4 batches" in out  # 8 samples, 2 a batch


def test_more_batches_than_the_data_has_is_said(tmp_path, capsys):
    project = new_project(tmp_path, capsys)  # 2 batches
    code, out, err = run(capsys, "calibrate", project, "--trust-code", "--method", "max", "--num-batches", "40")
    assert code == 0, err
    assert "40 calibration batches asked for, the data has 2: calibrated on 2." in out + err


def test_the_default_batch_count_on_small_data_is_not_a_warning(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    code, out, err = run(capsys, "calibrate", project, "--trust-code", "--method", "max")
    assert code == 0, err
    assert "asked for" not in out + err


def test_show_caps_a_huge_project_name(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    craft(project, "UPDATE meta SET value = printf('%.*c', 2000000, 'x') WHERE key = 'name';")
    for trust in ((), ("--trust-code",)):
        code, out, err = run(capsys, "show", project, *trust)
        assert code == 0, err
        first = out.splitlines()[0]
        assert len(first) < 400 and "... (2,000,000 characters)" in first


RANDOM_FACTORY = """
from torch import nn

def make():  # no seed, no weights file: other weights at every command
    return nn.Sequential(nn.Flatten(), nn.Linear(108, 4))
"""


def test_a_calibration_applied_to_other_weights_is_warned_about(tmp_path, capsys, caplog):
    (tmp_path / "rnd.py").write_text(RANDOM_FACTORY)
    data = tmp_path / "x.npy"
    import numpy as np

    np.save(data, np.random.default_rng(0).standard_normal((8, 3, 6, 6)).astype(np.float32))
    project = tmp_path / "r.qwb"
    assert run(capsys, "new", project, "--model", f"{tmp_path}/rnd.py:make", "--data", data, "--batch-size", "4",
               "--trust-code")[0] == 0
    assert run(capsys, "calibrate", project, "--trust-code", "--method", "max")[0] == 0
    caplog.clear()
    code, out, err = run(capsys, "evaluate", project, "--trust-code")
    assert code == 0, err
    assert "calibration 1 was computed on other weights than the model built now" in caplog.text
    code, out, err = run(capsys, "show", project, "--trust-code")
    assert "computed on other weights" in out


def test_a_seeded_factory_keeps_its_calibration_without_a_warning(tmp_path, capsys, caplog):
    project = new_project(tmp_path, capsys)  # its factory seeds torch: the same weights every time
    assert run(capsys, "calibrate", project, "--trust-code", "--method", "max")[0] == 0
    caplog.clear()
    assert run(capsys, "evaluate", project, "--trust-code")[0] == 0
    assert "other weights" not in caplog.text


def test_a_fine_tune_that_kept_the_starting_model_leaves_the_calibration_current(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    (tmp_path / "lossf.py").write_text("def sq(outputs, targets):\n    return outputs.pow(2).mean()\n")
    assert run(capsys, "calibrate", project, "--trust-code", "--method", "max")[0] == 0
    code, out, err = run(capsys, "finetune", project, "--trust-code", "--epochs", "1", "--lr", "1e-30",
                         "--loss", f"{tmp_path}/lossf.py:sq")
    assert code == 0, err
    code, out, err = run(capsys, "show", project, "--trust-code")
    assert "kept the starting model" in out
    assert "stale" not in out, out


def test_int4_blocks_that_do_not_divide_the_inputs_are_refused(tmp_path, capsys):
    """A partial last block is settled by refusal: an INT4 block must be one TensorRT builds (64, 128) and divide the
    layer's input features, so no block is ever partial (issue 35 point 6)."""
    project = new_project(tmp_path, capsys)  # fc: 4 inputs
    before = project.read_bytes()
    code, out, err = run(capsys, "set", project, "--layer", "fc", "--precision", "int4w", "--block-size", "3",
                         "--trust-code")
    assert code == 2 and "fc" in err and "64" in err and "128" in err
    assert "last one" not in out and project.read_bytes() == before


def exported(folder):
    return sorted(p.name for p in folder.iterdir() if ".onnx" in p.name or p.name.endswith((".json", ".cache")))


def test_an_export_interrupted_before_it_is_recorded_leaves_no_file(tmp_path, capsys, monkeypatch):
    import workbench.session.exports as exports

    project = new_project(tmp_path, capsys)
    assert run(capsys, "calibrate", project, "--trust-code", "--method", "max")[0] == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the export's headline is measured: the files are complete

    with monkeypatch.context() as patch:
        patch.setattr(exports, "headline", interrupted)
        code, out, err = run(capsys, "export", project, "-o", tmp_path / "m.onnx", "--amax-json", "--trust-code")
    assert code == 130
    assert exported(tmp_path) == []
    code, out, err = run(capsys, "export", project, "-o", tmp_path / "m.onnx", "--amax-json", "--trust-code")
    assert code == 0, err  # no --force needed: nothing unknown was left behind


def test_an_export_whose_save_fails_removes_its_new_files(tmp_path, capsys, monkeypatch):
    import workbench.session.core as core
    from workbench.project import ProjectError

    project = new_project(tmp_path, capsys)
    assert run(capsys, "calibrate", project, "--trust-code", "--method", "max")[0] == 0
    before = project.read_bytes()

    def full_disk(project_, path, **kwargs):
        raise ProjectError(f"{path}: saving failed (database or disk is full); the previous save is unchanged.")

    with monkeypatch.context() as patch:
        patch.setattr(core, "save_project", full_disk)
        code, out, err = run(capsys, "export", project, "-o", tmp_path / "m.onnx", "--trust-code")
    assert code == 2 and "disk is full" in err and "new files were removed" in err
    assert exported(tmp_path) == [] and project.read_bytes() == before
    assert run(capsys, "export", project, "-o", tmp_path / "m.onnx", "--trust-code")[0] == 0
