"""``calibrate --smoothquant/--awq --sequential`` on a lazily opened bf16 checkpoint (issue 37 point 3): the
smoothing is planned and the model calibrated one block at a time, never reading every weight, with the records
and amax of the eager whole-model run; the smoothed weights are computed from the checkpoint each time their block
is loaded, and a later job that reads every weight sees them too."""
import json

import numpy as np
import pytest
import torch

from tests.cli_run import run
from tests.transformers.checkpoints import new_project, save_bf16_llama
from workbench.session import Session
from workbench.sources import model_source
from workbench.sources.lazy_checkpoint import LazyCheckpoint

pytest.importorskip("accelerate")



def _project(capsys, tmp_path, folder, name, precision):
    return new_project(capsys, tmp_path, folder, name, precision=precision)


@pytest.fixture(autouse=True)
def lazy_variable(monkeypatch):
    """Projects made with transformers' own load; each test opens them lazily where it says so."""
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "never")


@pytest.mark.parametrize("precision,option,hidden", [("int8", {"smoothquant": 0.5}, 32),
                                                      ("int4w", {"awq": True}, 128)], ids=["smoothquant", "awq"])
def test_lazily_opened_bf16_model_smoothed_and_calibrated_block_by_block(tmp_path, capsys, monkeypatch, precision,
                                                                         option, hidden):
    folder = save_bf16_llama(tmp_path, hidden)
    eager_path = _project(capsys, tmp_path, folder, "eager.qwb", precision)
    lazy_path = _project(capsys, tmp_path, folder, "lazy.qwb", precision)

    eager = Session.open(eager_path)  # transformers' own load, every weight in memory
    assert eager._loaded.checkpoint is None
    expected = eager.calibrate(method="max", **option)

    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    lazy = Session.open(lazy_path)
    assert lazy._loaded.checkpoint is not None
    with monkeypatch.context() as patch:
        patch.setattr(LazyCheckpoint, "materialise", lambda self, model: pytest.fail("every weight was read"))
        result = lazy.calibrate(method="max", sequential=True, **option)
    assert all(p.is_meta for p in lazy.float_model.parameters())  # every block released again
    assert lazy.build_report.derived_weights  # the smoothed weights: computed per block, on meta between

    assert lazy.project.smoothing.keys() == eager.project.smoothing.keys() and len(lazy.project.smoothing) == 15
    for name, record in eager.project.smoothing.items():
        other = lazy.project.smoothing[name]
        assert np.array_equal(record.scales, other.scales), name
        assert (record.method, record.alpha, record.folded_into) == (other.method, other.alpha, other.folded_into)
    assert result.quantizers.keys() == expected.quantizers.keys()
    for name, item in expected.quantizers.items():
        assert torch.equal(item.amax, result.quantizers[name].amax), name  # bit-identical amax
    # the walk's float reference is the collecting pass's output, whose quantized attention computes its products
    # one by one, where the whole-model reference takes the fused SDPA: in bf16 the two round apart (0.02 dB on
    # this model without smoothing too)
    assert result.output_sqnr_db == pytest.approx(expected.output_sqnr_db, abs=0.1)

    # a job that reads every weight (evaluate) gets the smoothed weights computed too
    lazy.save()
    reopened = Session.open(lazy_path)
    assert reopened.evaluate().output_sqnr_db == pytest.approx(eager.evaluate().output_sqnr_db, abs=1e-6)


def test_cli_smoothquant_with_sequential_on_a_lazy_checkpoint(tmp_path, capsys, monkeypatch):
    folder = save_bf16_llama(tmp_path, 32)
    project = _project(capsys, tmp_path, folder, "p.qwb", "int8")
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    monkeypatch.setattr(LazyCheckpoint, "materialise", lambda self, model: pytest.fail("every weight was read"))
    messages = []
    session = Session.open(project)
    session.calibrate(method="max", smoothquant=0.5, sequential=True,
                      progress=lambda done, total, message: messages.append(message))
    assert "smoothing: planned block model.layers.1 (2 of 2)" in messages
    assert "calibrated block model.layers.1 (2 of 2)" in messages
    session.save()
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--smoothquant", "0.5", "--sequential",
                         "--json")
    assert code == 0, err
    assert len(json.loads(out)["smoothing"]) == 15
