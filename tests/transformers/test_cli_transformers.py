"""CLI and session on a ViT-like model: attention quantizers listed with their roles, the residual-add
switch, calibration reaching them, histograms for them, and export."""
import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.cli_run import run
from workbench import cli

HERE = Path(__file__).resolve().parent


@pytest.fixture
def vit_project(tmp_path, capsys):
    (tmp_path / "net.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import models

        def make():
            import torch
            torch.manual_seed(0)
            return models.ViTLike(fused=False)
    """))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32))
    path = tmp_path / "vit.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "x.npy",
                       "--batch-size", "4", "--trust-code")
    assert code == 0, err
    return path


def test_attention_quantizers_roles_switch_calibration_histograms_and_export(vit_project, tmp_path, capsys):
    code, out, err = run(capsys, "show", vit_project, "--trust-code", "--json")
    assert code == 0, err
    summary = json.loads(out)
    table = {row["name"]: row for row in summary["layer_table"]}
    assert table["blocks.0.attn.matmul"]["role"] == "query x key"
    assert table["blocks.0.attn.matmul_1"]["role"] == "probabilities x value"
    assert "blocks.0.add" not in table  # residual adds in transformer blocks: float by default
    assert summary["settings"]["functional"]["residual_adds_in_transformer_blocks"] is False
    assert summary["functional"]["matmuls"] == 4

    code, out, err = run(capsys, "set", vit_project, "--trust-code", "--quantize-residual-adds", "on")
    assert code == 0, err
    code, out, _ = run(capsys, "show", vit_project, "--trust-code")
    assert "blocks.1.add_1" in out and "4 adds" in out and "4 matrix products" in out
    code, _, err = run(capsys, "set", vit_project, "--trust-code", "--functional", "matmul=maybe")
    assert code == 2 and "on or off" in err
    code, _, err = run(capsys, "set", vit_project, "--trust-code", "--functional", "softmax=on")
    assert code == 2 and "residual_adds_in_transformer_blocks" in err

    code, _, err = run(capsys, "calibrate", vit_project, "--trust-code", "--method", "max")
    assert code == 0, err
    code, out, err = run(capsys, "sensitivity", vit_project, "--trust-code", "--units", "transformer_blocks")
    assert code == 0, err
    ranked = [line.split()[1] for line in out.splitlines() if line.strip()[:2].rstrip(".").isdigit()]
    assert sorted(ranked) == ["blocks.0", "blocks.1", "head", "patch_embed"]
    from workbench.quant.algorithms.snapshot import quantizer_names
    from workbench.session import Session, descriptor_of

    session = Session.open(vit_project, trust_code=True)
    assert session.project.settings["defaults"]["input"]["calib_method"] == "histogram"
    quantizers = quantizer_names(session.quantized_model())
    for block in (0, 1):  # the probabilities: QuantSDPA's probabilities descriptor (max), the value: the default
        probs = quantizers[f"blocks.{block}.attn.matmul_1._input0_quantizer"]
        assert descriptor_of(probs) == {"num_bits": 8, "name": None}
        values = quantizers[f"blocks.{block}.attn.matmul_1._input1_quantizer"]
        assert descriptor_of(values)["calib_method"] == "histogram"
        assert 0 < float(probs.amax) <= 1.0
    assert session.histogram("blocks.0.attn.matmul_1._input0_quantizer") is None  # max calibration: no histogram
    histogram = session.histogram("blocks.0.attn.matmul_1._input1_quantizer")  # the value
    assert histogram is not None and histogram["counts"].sum() > 0
    output = tmp_path / "vit.onnx"
    code, _, err = run(capsys, "export", vit_project, "--trust-code", "-o", output)
    assert code == 0, err
    kinds = [n.op_type for n in onnx.load(str(output)).graph.node]
    assert kinds.count("QuantizeLinear") >= 4 * 2 + 4 * 2  # attention products and residual adds included


def test_set_help_lists_the_functional_switches(capsys):
    try:
        cli.main(["set", "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert "--quantize-residual-adds" in out and "residual_adds_in_transformer_blocks" in out


def test_show_names_every_operation_left_in_float_and_layers_used_through_their_weight(tmp_path, capsys):
    """HF Mamba (torch path): its mixer's forward is not traceable; the layers used only through their weight are
    quantized where it is used, and ``show`` lists each operation left in float with its module and reason."""
    pytest.importorskip("transformers")
    (tmp_path / "net.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import models

        def make():
            import torch
            torch.manual_seed(0)
            return models.hf_mamba()
    """))
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 7)).astype(np.int64))
    path = tmp_path / "mamba.qwb"
    code, out, err = run(capsys, "new", path, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "ids.npy",
                         "--batch-size", "4", "--trust-code")
    assert code == 0, err
    assert "left in floating point: layers.0.mixer.dt_proj" not in out  # quantized where its weight is used
    code, out, err = run(capsys, "show", path, "--trust-code")
    assert code == 0, err
    assert "found by running the model (torch.fx cannot trace their forward): 2 modules" in out
    assert ("left in float: layers.0.mixer: Tensor.matmul(parameter layers.0.mixer.dt_proj.weight, output of "
            "layers.0.mixer.x_proj), found at run time: not a product of two activations") in out
    assert "(and 6 more like it): inside a loop of tensor operations" in out
    code, out, err = run(capsys, "show", path, "--trust-code", "--json")
    summary = json.loads(out)
    rows = summary["functional"]["left_float_operations"]
    assert sum(row["count"] for row in rows) == summary["functional"]["left_float"]
    assert all(row["module"] and row["reason"] for row in rows)
    table = {row["name"] for row in summary["layer_table"]}
    assert "layers.0.mixer.in_proj" in table and "layers.0.mixer.dt_proj" in table
