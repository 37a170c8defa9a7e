"""`workbench finetune`, `workbench set --fold-bn` and what `workbench show` says about both."""
import json
import textwrap

import pytest

from workbench import cli


def run(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def project(tmp_path, capsys):
    path = tmp_path / "digits.qwb"
    code, _, err = run(capsys, "new", path, "--model", "demo:digits", "--data", "demo:digits:train", "--eval-data",
                       "demo:digits:test", "--batch-size", "64", "--num-batches", "2", "--metric", "top1")
    assert code == 0, err
    code, _, err = run(capsys, "calibrate", path, "--method", "percentile", "--percentile", "95")
    assert code == 0, err
    return path


def test_finetune_show_and_reset(project, capsys):
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


def test_fold_setting_and_the_table_text(project, capsys):
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


def test_user_loss_needs_trust_and_bad_options_are_one_line(project, tmp_path, capsys):
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
    # the loss is a project setting now: later runs need trust too, or another loss
    code, _, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4")
    assert code == 2 and "--trust-code" in err
    code, _, err = run(capsys, "finetune", project, "--epochs", "0", "--lr", "1e-4", "--loss", "cross_entropy")
    assert code == 2 and "epochs must be a positive integer" in err and "Traceback" not in err
    code, _, err = run(capsys, "finetune", project, "--original-epochs", "90")
    assert code == 2 and "--original-lr" in err
    code, _, err = run(capsys, "finetune", project, "--epochs", "1", "--lr", "1e-4", "--loss", "cross_entropy",
                       "--learn-amax", "nothing_here")
    assert code == 2 and "no quantizer name matches" in err
