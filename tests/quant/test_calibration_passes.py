"""How many passes over the model a calibration takes (issue 37: calibration within 3x a forward of its batches):
the output SQNR's float reference is the collect pass's output, not a third forward per batch; same numbers."""
import copy
import sys
from pathlib import Path

import pytest
import torch

from workbench.quant import QuantDescriptor, TensorQuantizer, replace_to_quantization_module
from workbench.quant.algorithms import calibration_collect
from workbench.quant.algorithms.batches import run_model, sqnr_db
from workbench.quant.algorithms.calibrate import calibrate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models  # noqa: E402  (tests/transformers/models.py: the tiny HF builders)


def bf16_llama():
    torch.manual_seed(0)
    model = models.hf_llama().to(torch.bfloat16).eval()
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor())
    return model


def token_batches(n=3):
    return [{"input_ids": models.tokens(2, 8, 50, seed=i)} for i in range(n)]


def counted_forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


def explicit_sqnr(model, batches):
    """The SQNR as a user would measure it: each batch quantized, then with every quantizer off."""
    quantizers = [m for m in model.modules() if isinstance(m, TensorQuantizer)]
    references, outputs = [], []
    with torch.no_grad():
        for batch in batches:
            outputs.append(run_model(model, batch, torch.device("cpu")).logits)
            for q in quantizers:
                q.disable()
            references.append(run_model(model, batch, torch.device("cpu")).logits)
            for q in quantizers:
                q.enable()
    return sqnr_db(references, outputs)


def test_whole_model_calibration_runs_each_batch_twice_with_the_same_sqnr():
    model = bf16_llama()
    calls, handle = counted_forwards(model)
    try:
        result = calibrate(model, token_batches(), num_batches=None, method="max")
    finally:
        handle.remove()
    assert len(calls) == 2 * 3  # collect, then quantized: the float outputs are the collect pass's
    assert result.sqnr_batches == 3
    assert result.output_sqnr_db == pytest.approx(explicit_sqnr(model, token_batches()), abs=1e-9)


def test_outputs_over_the_budget_run_again_in_float_with_the_same_result(monkeypatch):
    model = bf16_llama()
    kept = copy.deepcopy(model)
    expected = calibrate(kept, token_batches(), num_batches=None, method="max")
    monkeypatch.setattr(calibration_collect, "REFERENCE_BYTES", 0)  # no output fits: the old third pass
    calls, handle = counted_forwards(model)
    try:
        result = calibrate(model, token_batches(), num_batches=None, method="max")
    finally:
        handle.remove()
    assert len(calls) == 3 * 3
    assert result.output_sqnr_db == expected.output_sqnr_db and result.sqnr_batches == 3
    for name, item in expected.quantizers.items():
        assert torch.equal(item.amax, result.quantizers[name].amax), name


def test_no_sqnr_asked_keeps_no_outputs():
    model = bf16_llama()
    calls, handle = counted_forwards(model)
    try:
        result = calibrate(model, token_batches(), num_batches=None, method="max", report_sqnr=False)
    finally:
        handle.remove()
    assert len(calls) == 3 and result.output_sqnr_db is None
