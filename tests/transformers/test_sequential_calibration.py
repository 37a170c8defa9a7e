"""``workbench calibrate --sequential`` and the project's ``calibration.sequential`` setting: the Session job the
CLI and GUI share, with the same amax and histograms as the whole-model run and progress per block."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_run import run
from workbench.session import Session

HERE = Path(__file__).resolve().parent


@pytest.fixture
def llama_project(tmp_path, capsys):
    import models  # tests/transformers/models.py (this folder's conftest puts it on the path)

    torch.manual_seed(0)
    folder = tmp_path / "llama"
    models.hf_llama().save_pretrained(folder, safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (12, 16)).astype(np.int64))
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits")
    assert code == 0, err
    code, _, err = run(capsys, "set", project, "--type", "Linear", "--precision", "int8")
    assert code == 0, err
    return project


def _calibration(project: Path):
    run_record = Session.open(project).project.current_calibration
    return run_record, {name: q for name, q in run_record.quantizers.items()}


def test_cli_sequential_equals_the_whole_model_run(llama_project, tmp_path, capsys):
    other = tmp_path / "whole.qwb"
    shutil.copy(llama_project, other)
    code, out, err = run(capsys, "calibrate", other, "--json")  # the project's default method ("auto")
    assert code == 0, err
    whole_sqnr = json.loads(out)["output_sqnr_db"]
    code, out, err = run(capsys, "calibrate", llama_project, "--sequential", "--json")
    assert code == 0, err
    sequential_sqnr = json.loads(out)["output_sqnr_db"]
    whole, whole_quantizers = _calibration(other)
    sequential, sequential_quantizers = _calibration(llama_project)
    assert sequential_quantizers.keys() == whole_quantizers.keys()
    assert "lm_head._input_quantizer" in sequential_quantizers  # after the blocks
    assert len(sequential_quantizers) >= 30  # 14 Linear layers in 2 blocks and lm_head (and attention's matmuls)
    for name, record in whole_quantizers.items():
        assert np.array_equal(record.amax, sequential_quantizers[name].amax), name
        assert record.method == sequential_quantizers[name].method, name
        if record.calibrator_state is not None and "calib_hist" in record.calibrator_state:
            assert np.array_equal(np.asarray(record.calibrator_state["calib_hist"]),
                                  np.asarray(sequential_quantizers[name].calibrator_state["calib_hist"])), name
    # measured by one more walk over the blocks; the float reference is the collecting pass's output, where
    # quantized attention computes its products one by one (the whole-model run's reference, all quantizers off,
    # takes the fused SDPA): the same up to float rounding
    assert sequential_sqnr == pytest.approx(whole_sqnr, abs=1e-4)


def test_the_project_setting_turns_it_on_and_progress_names_the_blocks(llama_project, capsys):
    session = Session.open(llama_project)
    assert "sequential" not in json.dumps(session.project.settings.get("calibration", {}))  # default: not stored
    session.update_setting("calibration", sequential=True)
    messages = []
    session.calibrate(method="max", progress=lambda done, total, message: messages.append(message))
    assert "calibrated block model.layers.0 (1 of 2)" in messages
    assert "calibrated block model.layers.1 (2 of 2)" in messages
    session.save()
    assert Session.open(llama_project).settings.calibration.sequential is True
    code, out, err = run(capsys, "calibrate", llama_project, "--sequential", "off", "--method", "max")
    assert code == 0, err
    assert "sequential" not in err


def test_help_names_the_flag(capsys):
    code, out, err = run(capsys, "calibrate", "--help")
    assert code == 0, err
    assert "--sequential" in out and "one decoder block at a time" in out
