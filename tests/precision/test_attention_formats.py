"""Issue 35, point 3: a precision of an attention covers all four of its quantizers (the probabilities too), and
the lint flags any product or elementwise operation whose inputs are in different formats (INT8 x FP8)."""
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.cli_run import run
from workbench.export.lint import lint_qdq_graph
from workbench.quant.algorithms.precision import E4M3_BITS
from workbench.session import Session

MODELS = Path(__file__).resolve().parents[1] / "transformers"


@pytest.fixture
def llama_project(tmp_path, capsys):
    pytest.importorskip("transformers")
    (tmp_path / "net.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(MODELS)!r})
        import models

        def make():
            import torch
            torch.manual_seed(0)
            return models.hf_llama("eager")
    """))
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    path = tmp_path / "llama.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--trust-code")
    assert code == 0, err
    return path


def test_an_fp8_llama_is_fp8_in_every_attention_quantizer_and_export(llama_project, tmp_path):
    session = Session.open(llama_project, trust_code=True)
    session.set_precision([layer.name for layer in session.layers()], "fp8")
    attentions = {name: module for name, module in session.quantized_model().named_modules()
                  if name.endswith("self_attn.sdpa")}
    assert len(attentions) == 2
    for name, module in attentions.items():
        # the probabilities quantizer stayed INT8 (scale 1/127) before, feeding an INT8 x FP8 P @ V
        assert [q.num_bits for q in module.quantizers()] == [E4M3_BITS] * 4, name
    # what the export writes: every quantizer of the attention calibrated in FP8 (max), none left INT8
    session.calibrate(method="max", num_batches=2)
    for name in attentions:
        record = session.project.current_calibration.quantizers[f"{name}._probs_quantizer"]
        assert record.descriptor["num_bits"] == list(E4M3_BITS), record.descriptor


def _dq(name: str, zero_type: int, shape: list[int]) -> tuple[list, list]:
    """A Q/DQ pair on graph input ``name`` in INT8 or FP8 (the zero point's type), named after a quantizer."""
    zero = helper.make_tensor(f"{name}_zero", zero_type, [], [0])
    scale = helper.make_tensor(f"{name}_scale", TensorProto.FLOAT, [], [0.1])
    nodes = [helper.make_node("QuantizeLinear", [name, f"{name}_scale", f"{name}_zero"], [f"{name}_q"],
                              name=f"attn.matmul_1._input{'0' if name == 'p' else '1'}_quantizer/QuantizeLinear"),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"], [f"{name}_dq"],
                              name=f"attn.matmul_1._input{'0' if name == 'p' else '1'}_quantizer/DequantizeLinear")]
    return nodes, [zero, scale]


def test_the_lint_flags_a_product_of_an_int8_and_an_fp8_input():
    p_nodes, p_inits = _dq("p", TensorProto.INT8, [1, 4, 4])
    v_nodes, v_inits = _dq("v", TensorProto.FLOAT8E4M3FN, [1, 4, 4])
    matmul = helper.make_node("MatMul", ["p_dq", "v_dq"], ["out"], name="attn.matmul_1/MatMul")
    graph = helper.make_graph(p_nodes + v_nodes + [matmul], "mixed",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 4]) for n in ("p", "v")],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 4])],
                              initializer=p_inits + v_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    found = [w for w in lint_qdq_graph(model) if w.kind == "mixed_formats"]
    assert len(found) == 1
    assert "INT8 and FP8" in found[0].message or "FP8 and INT8" in found[0].message
    assert found[0].severity == "warning"
    # the same product in one format says nothing
    same_nodes, same_inits = _dq("v", TensorProto.INT8, [1, 4, 4])
    graph = helper.make_graph(p_nodes + same_nodes + [matmul], "same", graph.input, graph.output,
                              initializer=p_inits + same_inits)
    assert not [w for w in lint_qdq_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
                if w.kind == "mixed_formats"]
