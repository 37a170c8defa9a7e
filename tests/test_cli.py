"""The command line end to end on the demo: every command (fine-tuning and BatchNorm folding
included), --json, exit codes and error lines."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.cli_run import run


@pytest.fixture
def project(tmp_path, capsys):
    path = tmp_path / "digits.qwb"
    code, out, err = run(capsys, "new", path, "--model", "demo:digits", "--data", "demo:digits:train",
                         "--eval-data", "demo:digits:test", "--batch-size", "64", "--num-batches", "2",
                         "--metric", "top1", "--json")
    assert code == 0, err
    assert json.loads(out)["layers"] == 7
    return path


def test_version(capsys):
    code, out, _ = run(capsys, "version")
    assert code == 0 and "Quant Workbench" in out


def test_whole_workflow(project, tmp_path, capsys):
    code, out, err = run(capsys, "show", project)
    assert code == 0 and "calibration: none yet" in out and "block.add" in out

    code, out, err = run(capsys, "set", project, "--ignore", "fc", "--type", "Conv2d", "--weight-desc",
                         "num_bits=8,axis=0", "--input-desc", "calib_method=histogram", "--rule", "maxpool=false",
                         "--json")
    assert code == 0, err
    changed = json.loads(out)
    assert changed["ignored"] == ["fc"] and changed["rules"] == ["maxpool=False"]

    code, out, err = run(capsys, "calibrate", project, "--method", "mse", "--evaluate", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["method"] == "mse" and result["batches"] == 2
    evaluation = result["evaluation"]
    assert evaluation["metric"]["kind"] == "top1" and evaluation["int8"] > 0.9 and evaluation["fp32"] > 0.9
    assert "fc._input_quantizer" not in result["quantizers"]

    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--tolerance", "0.0", "--target", "40",
                         "--json")
    assert code == 2 and "tolerance" in err  # both: refused with one line
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--target", "35", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["sensitivity"]["scheme"] == "one-off" and "fallback" in data

    onnx_path = tmp_path / "out" / "model.onnx"
    onnx_path.parent.mkdir()
    code, out, err = run(capsys, "export", project, "-o", onnx_path, "--amax-json", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert onnx_path.is_file() and report["cosine"] > 0.999 and report["quantize_nodes"] > 0

    code, out, err = run(capsys, "show", project, "--json")
    summary = json.loads(out)
    assert summary["float_layers"] == ["fc"] and summary["calibration"]["method"] == "mse"
    assert summary["sensitivity_runs"] == 1 and summary["exports"] == [str(onnx_path)]


def test_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    code, _, err = run(capsys, "show", tmp_path / "missing.qwb")
    assert code == 2 and "no such project file" in err and "Traceback" not in err
    (tmp_path / "text.qwb").write_text("hello")
    code, _, err = run(capsys, "show", tmp_path / "text.qwb")
    assert code == 2 and "not a Quant Workbench project" in err
    code, _, err = run(capsys, "new", tmp_path / "p.qwb", "--model", "demo:nothing", "--data", "demo:digits")
    assert code == 2 and "unknown demo model" in err
    code, _, err = run(capsys, "no-such-command")
    assert code == 2


def test_user_code_needs_trust(tmp_path, capsys):
    (tmp_path / "net.py").write_text(textwrap.dedent("""
        from torch import nn
        def make():
            return nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten())
    """))
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 5, 5), dtype=np.float32))
    args = ["new", tmp_path / "p.qwb", "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "x.npy"]
    code, _, err = run(capsys, *args)
    assert code == 2 and "--trust-code" in err and not (tmp_path / "p.qwb").exists()
    code, _, err = run(capsys, *args, "--trust-code")
    assert code == 0, err
    code, _, err = run(capsys, "calibrate", tmp_path / "p.qwb", "--no-trust")  # trust remembered, but not used
    assert code == 2 and "--trust-code" in err
    code, out, err = run(capsys, "show", tmp_path / "p.qwb")  # remembered
    assert code == 0 and "layers:" in out, err


def test_existing_project_is_not_overwritten_without_force(project, capsys):
    code, _, err = run(capsys, "new", project, "--model", "demo:digits", "--data", "demo:digits")
    assert code == 2 and "--force" in err


def test_demo_command(tmp_path, capsys):
    code, out, err = run(capsys, "demo", "--out", tmp_path, "--calib-batches", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["fp32_top1"] > 0.95 and report["int8_top1"] > 0.9
    assert (tmp_path / "digits-demo.qwb").is_file() and (tmp_path / "digits-demo.qdq.onnx").is_file()
    assert report["export"]["cosine"] > 0.999 and len(report["sensitivity"]) == 7


def test_the_demo_runs_again_into_its_own_folder_but_never_over_a_file_it_did_not_write(tmp_path, capsys):
    """README's main command run twice: the second run replaces the first's file (before: refused, nothing
    exported); a folder holding someone else's file of that name, and no demo project, is still refused."""
    for _ in range(2):
        code, _, err = run(capsys, "demo", "--out", tmp_path / "demo", "--calib-batches", "1", "--json")
        assert code == 0, err
    other = tmp_path / "other"
    other.mkdir()
    (other / "digits-demo.qdq.onnx").write_bytes(b"someone else's")
    code, _, err = run(capsys, "demo", "--out", other, "--calib-batches", "1", "--json")
    assert code != 0 and "--force" in err
    assert (other / "digits-demo.qdq.onnx").read_bytes() == b"someone else's"


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "workbench", "version"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "Quant Workbench" in result.stdout


# ----- fine-tuning and BatchNorm folding ------------------------------------------------------------

@pytest.fixture
def calibrated_project(project, capsys):
    code, _, err = run(capsys, "calibrate", project, "--method", "percentile", "--percentile", "95")
    assert code == 0, err
    return project


def test_finetune_show_and_reset(calibrated_project, capsys):
    project = calibrated_project
    code, out, err = run(capsys, "show", project)
    assert code == 0, err
    assert "BatchNorm folding: on, 4 folded: stem.1 -> stem.0, block.bn1 -> block.conv1" in out
    assert "(folded bn1)" in out and "fine-tune:" not in out

    code, out, err = run(capsys, "finetune", project, "--epochs", "2", "--original-lr", "0.1", "--optimizer", "adam",
                         "--steps-per-epoch", "6", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["settings"]["lr"] == pytest.approx(1e-3)  # the recipe: 1% of the original rate
    assert result["settings"]["schedule"] == "cosine" and result["steps"] == 12
    assert [e["epoch"] for e in result["history"]] == [1, 2] and result["baseline"]["metric"] is not None
    assert result["summary"].startswith("fine-tuned 2 of 2 epochs")

    code, out, err = run(capsys, "show", project, "--json")
    summary = json.loads(out)
    assert summary["finetune"]["id"] == 1 and summary["finetune"]["status"].startswith("fine-tuned weights of run 1")
    assert summary["settings"]["finetune"]["optimizer"] == "adam"
    code, out, _ = run(capsys, "show", project)
    assert "fine-tune: run 1: fine-tuned 2 of 2 epochs" in out

    code, out, err = run(capsys, "finetune", project, "--reset")
    assert code == 0 and "back to the calibrated weights" in out
    code, out, _ = run(capsys, "show", project, "--json")
    assert json.loads(out)["finetune"] is None and json.loads(out)["finetune_runs"] == 1


def test_fold_setting_and_the_table_text(calibrated_project, capsys):
    project = calibrated_project
    code, out, err = run(capsys, "set", project, "--fold-bn", "off", "--json")
    assert code == 0, err
    changed = json.loads(out)
    assert changed["fold_bn"] == ["off"] and "stem.0._weight_quantizer" in changed["recalibrate"]
    code, out, _ = run(capsys, "show", project)
    assert "BatchNorm folding: off" in out and "recalibrate: " in out
    code, out, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--steps-per-epoch", "2")
    assert code == 2 and "not calibrated" in err  # stale weight amax must be recalibrated first
    run(capsys, "calibrate", project, "--method", "max")
    code, out, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--steps-per-epoch", "3",
                         "--learn-amax", r"fc\._input_quantizer")
    assert code == 0, err
    assert "epoch  train loss" in out and "learned amax fc._input_quantizer" in out


def test_user_loss_needs_trust_and_bad_options_are_one_line(calibrated_project, tmp_path, capsys):
    project = calibrated_project
    (tmp_path / "losses.py").write_text(textwrap.dedent("""
        import torch.nn.functional as F
        def smooth(outputs, targets):
            return F.cross_entropy(outputs, targets, label_smoothing=0.1)
    """))
    loss = f"{tmp_path}/losses.py:smooth"
    code, _, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--loss", loss)
    assert code == 2 and "--trust-code" in err
    code, out, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--loss", loss,
                         "--steps-per-epoch", "2", "--trust-code", "--json")
    assert code == 0, err
    assert json.loads(out)["settings"]["loss"] == loss
    code, out, _ = run(capsys, "show", project, "--json")  # the project keeps it relative to its folder
    assert json.loads(out)["settings"]["finetune"]["loss"] == "losses.py:smooth"
    # the loss is a project setting now: later runs need trust too (remembered, unless --no-trust), or another loss
    code, _, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--no-trust")
    assert code == 2 and "--trust-code" in err
    code, _, err = run(capsys, "finetune", project, "--epochs", "0", "--lr", "1e-4", "--loss", "cross_entropy")
    assert code == 2 and "finetune.epochs is a positive integer, got 0" in err and "Traceback" not in err
    code, _, err = run(capsys, "finetune", project, "--original-epochs", "90")
    assert code == 2 and "--original-lr" in err
    code, _, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--loss", "cross_entropy",
                       "--learn-amax", "nothing_here")
    assert code == 2 and "no quantizer name matches" in err


@pytest.mark.parametrize("metric, direction, message", [
    ("bogus", None, "Unknown metric 'bogus'"),
    ("metrics.py:score", None, "Say whether a higher or a lower value"),
    ("metrics.py:not-a-name", "higher", "must look like"),
])
def test_new_refuses_a_bad_metric_and_writes_nothing(tmp_path, capsys, metric, direction, message):
    path = tmp_path / "p.qwb"
    args = ["new", path, "--model", "demo:digits", "--data", "demo:digits:train", "--metric", metric]
    code, out, err = run(capsys, *args, *(["--metric-direction", direction] if direction else []))
    assert code == 2 and message in err and err.startswith("workbench: error:") and len(err.splitlines()) == 1
    assert not path.exists()


def test_set_refuses_a_bad_metric_and_keeps_the_project(project, capsys):
    code, _, err = run(capsys, "set", project, "--metric", "bogus")
    assert code == 2 and "Unknown metric 'bogus'" in err
    code, out, _ = run(capsys, "show", project, "--json")
    assert code == 0 and json.loads(out)["settings"]["metric"] == {"name": "top1", "direction": None}


def test_files_typed_on_the_command_line_are_found_from_where_they_were_typed(project, tmp_path, capsys,
                                                                             monkeypatch):
    """`workbench set proj/p.qwb --metric proj/m.py:fn` from the folder above the project: the file is
    proj/m.py there, and the project keeps it relative to its own folder so it works from anywhere."""
    (tmp_path / "metrics.py").write_text(textwrap.dedent("""
        def minus_one(model, batches):
            return -1.0
    """))
    np.savez(tmp_path / "train.npz", x=np.zeros((16, 1, 8, 8), np.float32), y=np.zeros(16, np.int64))
    above = tmp_path.parent
    monkeypatch.chdir(above)
    typed_project = f"{tmp_path.name}/{project.name}"
    code, out, err = run(capsys, "set", typed_project, "--metric", f"{tmp_path.name}/metrics.py:minus_one",
                         "--metric-direction", "higher", "--trust-code")
    assert code == 0, err
    run(capsys, "calibrate", typed_project, "--method", "max")
    monkeypatch.chdir("/")  # and from anywhere else
    code, out, err = run(capsys, "sensitivity", project, "--trust-code", "--json")
    assert code == 0, err
    assert json.loads(out)["sensitivity"]["fp32"] == -1.0
    code, out, _ = run(capsys, "show", project, "--json")
    assert json.loads(out)["settings"]["metric"]["name"] == "metrics.py:minus_one"

    monkeypatch.chdir(above)
    code, out, err = run(capsys, "finetune", typed_project, "--epochs", "1", "--lr", "1e-4", "--steps-per-epoch",
                         "1", "--train-data", f"{tmp_path.name}/train.npz", "--trust-code", "--json")
    assert code == 0, err


def test_sensitivity_text_leaves_out_the_delta_to_an_infinite_fp32(calibrated_project, capsys):
    code, out, err = run(capsys, "sensitivity", calibrated_project, "--metric", "sqnr", "--top", "2")
    assert code == 0, err
    assert "vs all quantized" in out and "vs FP32" not in out and "inf)" not in out
    code, out, err = run(capsys, "sensitivity", calibrated_project, "--metric", "top1", "--top", "2")
    assert code == 0 and "vs FP32" in out


def test_evaluate_prints_the_metrics_fp32_and_int8_values(project, tmp_path, capsys):
    """`workbench evaluate`: the project's metric by default, any registered or user metric on request."""
    code, _, err = run(capsys, "evaluate", project)
    assert code == 2 and "calibrate first" in err
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0

    code, out, err = run(capsys, "evaluate", project, "--json")
    assert code == 0, err
    top1 = json.loads(out)
    assert top1["metric"]["kind"] == "top1" and 0.9 < top1["fp32"] <= 1.0 and 0.8 < top1["int8"] <= 1.0
    assert top1["delta"] == pytest.approx(top1["int8"] - top1["fp32"]) and 10 < top1["output_sqnr_db"] < 80

    code, out, err = run(capsys, "evaluate", project, "--metric", "mse", "--json")
    assert code == 0, err
    mse = json.loads(out)
    assert mse["metric"]["kind"] == "mse" and mse["fp32"] == 0.0 and mse["int8"] > 0.0
    assert mse["output_sqnr_db"] == pytest.approx(top1["output_sqnr_db"])

    (tmp_path / "score.py").write_text("def mean_logit(model, batches):\n"
                                       "    return float(sum(model(b[0]).mean() for b in batches))\n")
    code, _, err = run(capsys, "evaluate", project, "--metric", f"{tmp_path}/score.py:mean_logit",
                       "--metric-direction", "higher")
    assert code == 2 and "--trust-code" in err
    code, out, err = run(capsys, "evaluate", project, "--metric", f"{tmp_path}/score.py:mean_logit",
                         "--metric-direction", "higher", "--trust-code")
    assert code == 0, err
    assert "FP32" in out and "INT8" in out and "score.py:mean_logit" in out and "output SQNR" in out
