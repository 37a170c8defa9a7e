"""A dozen representative architectures of the conformance sweep (bench/zoo_sweep.py), end to end as a user runs
them: real library code from a tiny config, ``new -> calibrate -> export`` through the Session with the defaults.

Each asserts the sweep row's checks on the file written: every weight GEMM (Conv/Gemm/MatMul with a constant
weight) has Q/DQ on its weight, every attention product (MatMul between two activations) has Q/DQ on both inputs,
every tensor the model returns is an ONNX output, and the file was written and validated (onnxruntime parity).
Those that fail today because of issue 34's points 1-4 (placement, whole-model export, parity) are strict xfails
with the reason, so that they pass, and must be un-marked, when those fixes land. Models of libraries absent here
(timm, torchvision, ultralytics: the sweep's own environment has them) are skipped.
"""
from pathlib import Path

import pytest
import zoo_catalog
from zoo_checks import run_entry

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = {entry.name: entry for entry in zoo_catalog.all_entries()}
LIBRARY = {"hf": "transformers", "timm": "timm", "torchvision": "torchvision", "diffusers": "diffusers",
           "ultralytics": "ultralytics"}

PLACEMENT = "issue 34 point 1 (placement without a traceable forward)"
EXPORT = "issue 34 point 2 (export the whole model)"
PARITY = "issue 34 point 3 (parity)"


def xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


# what fails today, and in whose area (issue 34's points); a fix that lands turns its case into an XPASS, which
# fails (strict): remove the entry then
FAILING: dict[str, str] = {
    "torchvision/efficientnet_v2_s": PARITY + ": rounding ties at its first blocks, amplified through 40 blocks of "
                                     "squeeze-excite (file cosine 0.985, its own 1-ulp spread 0.987): explained, "
                                     "written not validated",
    "torchvision/efficientnet_b0": PARITY + ": with its BatchNorm statistics set on data (at the initial ones its "
                                   "output was all zero, so the cosine of 1.0 said nothing) one rounding flip at "
                                   "features.1 travels through the squeeze-excite blocks (file cosine 0.988, its own "
                                   "1-ulp spread 0.975): explained, written not validated",
    "torchvision/ssdlite320_mobilenet_v3_large": PARITY + ": with its BatchNorm statistics set on data (at the "
                                                 "initial ones its INT8 output equalled the float one, SQNR inf) the "
                                                 "parity diagnosis finds an operation computed differently at the "
                                                 "root cat (postprocess_detections' cat of scores after the top-k, "
                                                 "0.743 relative): a selection not recognised, or a quantizer after "
                                                 "one, that the vanishing activations hid"}
NAMES = ["hf/llama", "hf/gpt2", "hf/whisper", "hf/t5", "hf/bert", "hf/vit", "hf/mixtral", "hf/wav2vec2", "hf/swin",
         "hf/mamba", "hf/detr", "hf/sam_vision_model", "diffusers/unet2d_condition", "timm/resnet18",
         "torchvision/efficientnet_b0", "ultralytics/yolov8n",
         "torchvision/ssdlite320_mobilenet_v3_large",
         "torchvision/efficientnet_v2_s"]
CASES = [pytest.param(name, marks=xfail(FAILING[name])) if name in FAILING else name for name in NAMES]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", CASES)
def test_architecture_is_accepted_with_the_defaults(name):
    entry = ENTRIES[name]
    pytest.importorskip(LIBRARY[name.split("/")[0]])
    if name.startswith("timm/"):
        pytest.importorskip("torchvision")
    row = run_entry(entry, ROOT)
    assert row.get("export_ok"), row.get("failure")
    gemms, attention, outputs = row["gemms"], row["attention"], row["outputs"]
    assert gemms[1] > 0 and gemms[0] == gemms[1], f"weight GEMMs quantized {gemms}, float: {row['float_gemms']}"
    assert attention[0] == attention[1], f"attention products with Q/DQ on both inputs {attention}"
    assert outputs[0] == outputs[1], f"ONNX outputs {outputs[0]} of the {outputs[1]} tensors the model returns"
    assert not row.get("degenerate_output"), f"{row['degenerate_output']}: parity says nothing"
    assert row["cosine"] >= 0.999


def test_attention_products_count_matmuls_between_activations_and_see_dq_through_transposes(tmp_path):
    """The sweep's attention column: a MatMul of two activations counts, its input is quantized when a
    DequantizeLinear produces it directly or through a Transpose; a MatMul with a weight does not count."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from zoo_checks import attention_products

    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int8), "z")
    weight = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "w")
    nodes = [
        helper.make_node("QuantizeLinear", ["q", "s", "z"], ["q_q"]),
        helper.make_node("DequantizeLinear", ["q_q", "s", "z"], ["q_dq"]),
        helper.make_node("QuantizeLinear", ["k", "s", "z"], ["k_q"]),
        helper.make_node("DequantizeLinear", ["k_q", "s", "z"], ["k_dq"]),
        helper.make_node("Transpose", ["k_dq"], ["k_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["q_dq", "k_t"], ["scores"]),        # both inputs quantized
        helper.make_node("MatMul", ["scores", "v"], ["context"]),       # the probabilities are not
        helper.make_node("MatMul", ["context", "w"], ["out"]),          # a weight GEMM: not attention
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])],
                              initializer=[scale, zero, weight])
    path = tmp_path / "attention.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert attention_products(path) == (1, 2)


def test_products_the_placement_rules_call_no_attention_are_not_counted(tmp_path):
    """A state-space model's scan steps are products of two activations that the placement rules leave in float
    because TensorRT fuses no attention there; the check excuses as many float MatMuls of that module as the
    project's summary lists (no more), and still counts a float product elsewhere."""
    import onnx
    from onnx import TensorProto, helper
    from zoo_checks import attention_products, not_attention_products

    from workbench.graph.placement import IN_ATTENTION, IN_SCAN, is_attention

    nodes = [helper.make_node("MatMul", ["a", "b"], ["s0"], name="layers.0.mixer/MatMul"),
             helper.make_node("MatMul", ["s0", "b"], ["s1"], name="layers.0.mixer/MatMul_1"),
             helper.make_node("MatMul", ["s1", "b"], ["s2"], name="layers.0.mixer/MatMul_2"),
             helper.make_node("MatMul", ["s2", "b"], ["out"], name="layers.1.attn/MatMul")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in ("a", "b")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])])
    path = tmp_path / "scan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert not is_attention("matmul", IN_SCAN) and is_attention("matmul", None) and is_attention("attention", None)
    assert not is_attention("add", IN_ATTENTION)
    summary = {"functional": {"left_float_operations": [
        {"module": "layers.0.mixer", "operation": "matmul(...)", "reason": IN_SCAN, "kind": "matmul",
         "attention": False, "count": 2},
        {"module": "layers.1.attn", "operation": "add(...)", "reason": IN_ATTENTION, "kind": "add",
         "attention": False, "count": 1}]}}
    assert not_attention_products(summary) == {"layers.0.mixer": 2}
    assert attention_products(path) == (0, 4)
    assert attention_products(path, not_attention_products(summary)) == (0, 2)  # one scan step too many, attn


def test_tensor_leaves_count_what_a_model_returns():
    import torch
    from zoo_checks import tensor_leaves

    logits, boxes = torch.zeros(1, 2), torch.zeros(1, 4)
    assert tensor_leaves({"logits": logits, "pred_boxes": boxes}) == 2
    assert tensor_leaves((logits, [boxes, {"masks": boxes.clone()}], None, "text")) == 3
    # one tensor returned twice (ultralytics' segmentation: the mask prototypes) is one ONNX output
    assert tensor_leaves(((logits, boxes), {"boxes": logits + 1, "proto": boxes})) == 3


def test_weights_a_library_leaves_at_zero_get_a_random_init_and_the_others_are_kept():
    """transformers' SAM vision encoder comes from its config with weights of about 1e-10: on it every amax
    collapses and the INT8 output is zero, so the sweep gives such weight matrices a random init."""
    import torch
    from torch import nn
    from zoo_checks import revive_degenerate_weights

    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    with torch.no_grad():
        model[0].weight.mul_(1e-10)
        model[0].bias.zero_()
    kept = model[2].weight.clone()
    assert revive_degenerate_weights(model) == ["0.weight"]
    assert 0.05 < float(model[0].weight.std()) < 1.0
    assert float(model[0].bias.abs().max()) == 0.0  # vectors (biases, norms) stay as the library made them
    assert torch.equal(model[2].weight, kept)


def test_torchvision_dense_models_build_without_downloading_a_backbone(monkeypatch):
    """torchvision's detection and segmentation builders default to ImageNet backbone weights: the sweep's
    factory must ask for none (a download fails offline, and the sweep builds random weights)."""
    pytest.importorskip("torchvision")
    import torch.hub
    import zoo_factories

    def no_network(*args, **kwargs):
        raise AssertionError("the factory tried to download weights")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    model = zoo_factories.torchvision_model("deeplabv3_mobilenet_v3_large", num_classes=3, aux_loss=False)
    assert not model.training


def test_each_stage_reports_its_start_and_the_time_of_the_one_before():
    """A model killed at the sweep's time limit still says where its time went: the worker writes the row so far
    as each stage begins (bench/zoo_sweep.py puts it in the timeout row)."""
    import time

    from zoo_checks import _stage

    seen, row = [], {"model": "m", "stage": "build"}
    _stage(row, "build", seen.append)
    time.sleep(0.01)
    _stage(row, "new", seen.append)
    _stage(row, "calibrate", seen.append)
    assert [s["stage"] for s in seen] == ["build", "new", "calibrate"]
    assert "_stage_start" not in seen[-1] and set(seen[-1]["stage_seconds"]) == {"build", "new"}
    assert seen[-1]["stage_seconds"]["build"] >= 0.0


def test_architectures_given_a_bigger_time_budget_say_why():
    slow = [e for e in zoo_catalog.all_entries() if e.timeout_reason]
    assert {e.name for e in slow} == set(zoo_catalog.SLOW)
    assert all(e.timeout_s > 240 and len(e.timeout_reason) > 20 for e in slow)
