"""SmoothQuant and AWQ on a bf16 model (issue 37 point 1): the scales are computed in float32, the layers' weights
stay bf16, and the input's 1/s (a float32 Mul before the Q/DQ pair) hands the GEMM a bf16 tensor again, in the fake
quant as in the exported graph. Before, calibrating failed with "expected m1 and m2 to have the same dtype"."""
import json

import numpy as np
import onnx
import pytest
import torch

from tests.cli_run import run
from tests.transformers.checkpoints import new_project, save_bf16_llama
from workbench.session import Session

pytest.importorskip("transformers")


def _llama_project(tmp_path, capsys, hidden: int, precision: str):
    return new_project(capsys, tmp_path, save_bf16_llama(tmp_path, hidden), precision=precision)


def _bf16_weights_and_output(project):
    session = Session.open(project)
    model = session.quantized_model()
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.bfloat16}
    with torch.no_grad():
        logits = model(session.sample_inputs(batch=2)).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    return session


def test_smoothquant_calibrates_and_exports_a_bf16_llama(tmp_path, capsys):
    project = _llama_project(tmp_path, capsys, 32, "int8")
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--smoothquant", "0.5", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert len(result["smoothing"]) == 15  # 14 Linear layers in 2 blocks and lm_head
    assert result["output_sqnr_db"] > 25
    session = _bf16_weights_and_output(project)
    scales = session.project.smoothing["model.layers.0.self_attn.q_proj"].scales
    assert scales.dtype == np.float32 and not np.all(scales == 1)  # computed in float32

    code, out, err = run(capsys, "export", project, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["validated"], report
    graph = onnx.load(report["path"]).graph
    muls = [node for node in graph.node if node.op_type == "Mul" and "q_proj" in node.name]
    assert muls  # 1/s before q_proj's QuantizeLinear


def test_awq_calibrates_a_bf16_llama(tmp_path, capsys):
    project = _llama_project(tmp_path, capsys, 128, "int4w")  # INT4 blocks of 128 need 128 input features
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--awq", "on", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert len(result["smoothing"]) == 15
    assert {item["method"] for item in result["smoothing"].values()} == {"awq"}
    assert result["output_sqnr_db"] > 5
    _bf16_weights_and_output(project)


def test_a_bf16_gpt2_folds_into_its_layernorms_as_in_float32():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
    import models

    from workbench.quant.algorithms.sequential_smoothing import plan_smoothing_sequential
    from workbench.quant.algorithms.smoothing import apply_smoothing, is_linear_like, plan_smoothing

    batches = [{"input_ids": models.tokens(2, 8, 50, seed=i)} for i in range(3)]
    folds = {}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model = models.hf_gpt2().to(dtype)
        layers = [name for name, module in model.named_modules() if is_linear_like(module)]
        items = plan_smoothing(model, layers, batches, method="smoothquant", alpha=0.5)
        folds[dtype] = {item.layer: item.folded_into for item in items}
        walked = plan_smoothing_sequential(model, layers, batches, method="smoothquant", alpha=0.5)
        assert {item.layer: item.folded_into for item in walked} == folds[dtype]
    # the rounding of bf16 weights no longer reads as a wrong fold: ln_1 and ln_2 of both blocks carry 1/s
    assert folds[torch.bfloat16] == folds[torch.float32]
    assert sum(1 for producer in folds[torch.bfloat16].values() if producer) == 4

    smoothed = models.hf_gpt2().to(torch.bfloat16)
    smoothed.load_state_dict(model.state_dict())
    apply_smoothing(smoothed, items)
    assert smoothed.transformer.h[0].ln_1.weight.dtype == torch.bfloat16  # folded in the model's dtype
    with torch.no_grad():
        reference = model(**batches[0]).logits.float()
        folded = smoothed(**batches[0]).logits.float()
    assert float((folded - reference).abs().max()) < 0.05 * float(reference.abs().max())
