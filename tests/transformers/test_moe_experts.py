"""Mixture-of-experts decoders (transformers 5's 3-D experts): experts and routers quantized, the traced (dense)
routing equal to the eager (sparse) one, calibration naming experts no token reached, export with Q/DQ on every
expert's GEMMs, and ``show`` listing the experts."""
import json
import textwrap
from pathlib import Path

import models as zoo
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from tests.cli_run import run
from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantExperts, QuantRouter, TensorQuantizer, is_experts_module
from workbench.quant.replace import replace_to_quantization_module

pytest.importorskip("transformers")
HERE = Path(__file__).resolve().parent
EXPERTS, HIDDEN, INTER = 4, 16, 32


def _mixtral():
    torch.manual_seed(0)
    return zoo.hf_mixtral()


def test_experts_and_routers_are_replaced_and_compute_what_the_float_model_does():
    model = _mixtral()
    ids = zoo.tokens(vocab=64)
    with torch.no_grad():
        reference = model(ids).logits
    report = replace_to_quantization_module(model)
    kinds = {layer.name: layer.quant_type for layer in report.replaced}
    assert kinds["model.layers.0.mlp.experts"] == "QuantExperts"
    assert kinds["model.layers.1.mlp.gate"] == "QuantMixtralTopKRouter"
    assert report.not_quantizable == []  # the router's [E, H] GEMM is no longer an unknown weight GEMM
    experts = model.get_submodule("model.layers.0.mlp.experts")
    assert len(experts._input_quantizers) == len(experts._weight_quantizers) == 2
    assert set(model.state_dict()) >= {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.gate.weight"}
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.allclose(model(ids).logits, reference, atol=1e-6)
    # a quantized module is not replaced again
    assert replace_to_quantization_module(model).replaced == []


def _calibrated_experts(top_k_index: torch.Tensor) -> tuple[nn.Module, tuple]:
    """A QuantExperts of a tiny Mixtral, calibrated (max) on one batch routed by ``top_k_index``."""
    model = _mixtral()
    float_experts = model.model.layers[0].mlp.experts
    assert is_experts_module(float_experts)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = QuantExperts.from_float(float_experts)

        def forward(self, hidden, index, weights):
            return self.experts(hidden, index, weights)

    wrapper = Wrapper().eval()
    generator = torch.Generator().manual_seed(1)
    tokens = top_k_index.shape[0]
    inputs = (torch.randn(tokens, HIDDEN, generator=generator), top_k_index,
              torch.rand(tokens, top_k_index.shape[1], generator=generator))
    result = calibrate(wrapper, [(inputs,)], num_batches=None, method="max", report_sqnr=False)
    return wrapper, inputs, result


def test_weights_are_quantized_per_expert_and_output_channel():
    index = torch.arange(12).reshape(6, 2) % EXPERTS
    wrapper, _, result = _calibrated_experts(index)
    experts = wrapper.experts
    gate_up = experts._weight_quantizers[0]
    assert tuple(gate_up.amax.shape) == (EXPERTS * 2 * INTER, 1)
    per_row = experts.gate_up_proj.detach().abs().amax(dim=-1).reshape(-1, 1)
    assert torch.equal(gate_up.amax, per_row)  # expert e's channel o is row e * 2I + o
    # each expert's quantized weight depends on its own scales only: scaling expert 3 leaves expert 0 as it was
    before = experts._quantized_weight(0, experts.gate_up_proj).detach().clone()
    with torch.no_grad():
        experts.gate_up_proj[3] *= 100
    experts._weight_quantizers[0].amax = experts.gate_up_proj.detach().abs().amax(dim=-1).reshape(-1, 1)
    after = experts._quantized_weight(0, experts.gate_up_proj).detach()
    assert torch.equal(after[0], before[0]) and not torch.equal(after[3], before[3])
    assert not any("no calibration token" in warning for warning in result.warnings)


def test_calibration_names_the_experts_no_token_was_routed_to():
    index = torch.tensor([[0, 1], [1, 0], [0, 1]])  # experts 2 and 3 never picked
    _, _, result = _calibrated_experts(index)
    warning = next(w for w in result.warnings if "no calibration token" in w)
    assert warning.startswith("experts: ") and "expert(s) 2, 3 of 4" in warning
    assert "experts._input_quantizers.1" in result.quantizers and not result.unused


def test_traced_dense_routing_equals_the_eager_sparse_routing_with_quantization_on():
    index = torch.tensor([[0, 2], [3, 1], [2, 0], [1, 3], [0, 3]])
    wrapper, inputs, _ = _calibrated_experts(index)
    experts = wrapper.experts
    gate_up = experts._quantized_weight(0, experts.gate_up_proj)
    down = experts._quantized_weight(1, experts.down_proj)
    with torch.no_grad():
        sparse = experts._sparse(*inputs, gate_up, down)
        dense = experts._dense(*inputs, gate_up, down)
    assert torch.allclose(dense, sparse, atol=1e-6)
    assert not torch.equal(sparse, torch.zeros_like(sparse))
    # torch.export takes the dense form (no data-dependent shapes); the quantizers are swapped for Q/DQ stand-ins
    # by the exporter, so here they are off, and the exported program computes the float experts
    with quant.disable_quantization(wrapper), torch.no_grad():
        eager = wrapper(*inputs)
        program = torch.export.export(wrapper, inputs)
        exported = program.module()(*inputs)
    assert torch.allclose(exported, eager, atol=1e-6)
    operations = {str(node.target) for node in program.graph.nodes}
    assert not any("nonzero" in op or "index_add" in op or "histc" in op for op in operations)


def test_mixtral_exports_with_qdq_on_every_experts_gemm_and_matches_the_fake_quant_model(tmp_path):
    model = _mixtral()
    ids = zoo.tokens(vocab=64)
    replace_to_quantization_module(model)
    calibrate(model, [(ids,)], num_batches=None, method="max", report_sqnr=False)
    path = tmp_path / "mixtral.onnx"
    report = export_qdq_onnx(model, (ids,), path)
    assert path.is_file() and report.float_weight_gemms == []
    assert report.cosine > 0.999  # onnxruntime vs the fake-quant model
    graph = onnx.load(str(path)).graph
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    scales = [initializers.get(n.input[1], constants.get(n.input[1])) for n in graph.node
              if n.op_type == "DequantizeLinear"]
    sizes = sorted(int(np.size(s)) for s in scales if s is not None)
    # per expert and output channel: gate_up [E * 2I] and down [E * H] scales, in each of the 2 layers
    assert sizes.count(EXPERTS * 2 * INTER) == 2 and sizes.count(EXPERTS * HIDDEN) >= 2
    assert isinstance(model.model.layers[0].mlp.gate, QuantRouter)
    assert all(q.amax is not None for q in model.modules() if isinstance(q, TensorQuantizer) and q.is_enabled)


def test_show_lists_the_experts_and_routers(tmp_path, capsys):
    (tmp_path / "net.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import models

        def make():
            import torch
            torch.manual_seed(0)
            return models.hf_mixtral()
    """))
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 7)).astype(np.int64))
    path = tmp_path / "mixtral.qwb"
    code, out, err = run(capsys, "new", path, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "ids.npy",
                         "--batch-size", "4", "--trust-code")
    assert code == 0, err
    code, out, err = run(capsys, "show", path, "--trust-code", "--json")
    assert code == 0, err
    table = {row["name"]: row for row in json.loads(out)["layer_table"]}
    assert "model.layers.0.mlp.experts" in table and "model.layers.1.mlp.gate" in table


ROUTERS = [("mixtral", "MixtralConfig", "MixtralTopKRouter"), ("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeTopKRouter"),
           ("granitemoe", "GraniteMoeConfig", "GraniteMoeTopKRouter"), ("jamba", "JambaConfig", "JambaTopKRouter"),
           ("phimoe", "PhimoeConfig", "PhimoeTopKRouter")]


@pytest.mark.parametrize("family,config_name,router_name", ROUTERS, ids=[r[0] for r in ROUTERS])
def test_every_family_router_is_quantized_and_routes_as_before_with_quantization_off(family, config_name,
                                                                                     router_name):
    import importlib

    import transformers

    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = getattr(transformers, config_name)(hidden_size=HIDDEN, num_local_experts=EXPERTS, num_experts=EXPERTS,
                                                num_experts_per_tok=2)
    torch.manual_seed(0)
    holder = nn.Sequential(getattr(modeling, router_name)(config).eval())
    nn.init.normal_(holder[0].weight)
    hidden = torch.randn(10, HIDDEN)
    with torch.no_grad():
        reference = holder(hidden)
    report = replace_to_quantization_module(holder)
    assert [layer.quant_type for layer in report.replaced] == [f"Quant{router_name}"] and not report.not_quantizable
    router = holder[0]
    with quant.disable_quantization(holder), torch.no_grad():
        for got, expected in zip(router(hidden), reference):
            assert torch.equal(got, expected)
    calibrate(holder, [hidden], num_batches=None, method="max", report_sqnr=False)
    assert tuple(router._weight_quantizer.amax.shape) == (EXPERTS, 1) and router._input_quantizer.amax is not None
    with torch.no_grad():
        logits = router(hidden)[0].float()
    assert not torch.equal(logits, reference[0].float())  # the gate GEMM runs on quantized operands
    assert torch.allclose(logits, reference[0].float(), atol=0.2)
    assert set(holder.state_dict()) >= {"0.weight"}
