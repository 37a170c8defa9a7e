"""Engine layers mapped onto transformer modules: a Linear ran where its MatMul ran, Myelin regions cover the
modules inside them, and one channel-alignment rule for lint and the engine report."""
import json
import sys
from pathlib import Path

import onnx
import pytest
import torch

from workbench.engine import EngineLayer, TensorInfo, analyse_engine, load_engine_layers
from workbench.engine.report import expand_regions
from workbench.export import export_qdq_onnx
from workbench.graph import prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.tensorrt_rules import misaligned_channels
from workbench.session import Session, SessionError
from workbench.session.build import quantizable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models as zoo  # noqa: E402

INT8 = "Thirty-two wide channel vectorized row major Int8 format."
FP16 = "Half"


def tensor(name, fmt, dims=None):
    return {"Name": name, "Location": "Device", "Dimensions": dims or [1, 17, 32], "Format/Datatype": fmt}


@pytest.fixture(scope="module")
def vit_export(tmp_path_factory):
    """(node names in graph order, project layers -> quantized) of a calibrated one-block ViT's export."""
    torch.manual_seed(0)
    images = zoo.images(4)
    quantized, _ = prepare_for_tensorrt(zoo.ViTLike(depth=1).eval(), example_inputs=(images,))
    calibrate(quantized, [(images,)], num_batches=None, method="max", report_sqnr=False)
    path = tmp_path_factory.mktemp("vit") / "vit.onnx"
    export_qdq_onnx(quantized, images, path)
    names = [node.name for node in onnx.load(str(path)).graph.node]
    return names, {name: True for name, _, _ in quantizable(quantized)}


def write_layers(tmp_path, names, layers):
    for layer in layers:
        for part in layer["Name"].removeprefix("{ForeignNode[").removesuffix("]}").replace("...", " + ").split(" + "):
            assert part in names, f"the export has no node {part!r}"
    path = tmp_path / "layers.json"
    path.write_text(json.dumps({"Layers": layers, "Bindings": ["input", "output"]}))
    return path


def test_a_linear_ran_where_its_matmul_ran_not_where_its_weight_transpose_did(vit_export, tmp_path):
    names, project = vit_export
    qkv = "blocks.0.attn.qkv"
    assert f"{qkv}/Transpose" in names and names.index(f"{qkv}/Transpose") < names.index(f"{qkv}/MatMul")
    path = write_layers(tmp_path, names, [
        {"Name": f"{qkv}/Transpose", "LayerType": "Shuffle", "ParameterType": "Shuffle",
         "Inputs": [tensor("w", "Row major linear FP32")], "Outputs": [tensor("wt", "Row major linear FP32")]},
        {"Name": f"{qkv}._input_quantizer/QuantizeLinear + {qkv}/MatMul + {qkv}/Add", "LayerType": "CaskGemm",
         "ParameterType": "MatrixMultiply", "Inputs": [tensor("x", INT8)], "Outputs": [tensor("y", FP16)]},
    ])
    report = analyse_engine(*load_engine_layers(path), project)
    outcome = report.outcome(qkv)
    assert outcome.engine_precision == "INT8" and outcome.engine_layer.endswith(f"{qkv}/Add")
    assert [h for h in report.hazards if qkv in h.modules] == []


def test_a_myelin_region_covers_the_modules_between_its_ends(vit_export, tmp_path):
    names, project = vit_export
    region = "{ForeignNode[blocks.0.norm1/LayerNormalization...blocks.0/Add_1]}"
    path = write_layers(tmp_path, names, [
        {"Name": region, "LayerType": "Myelin", "Inputs": [tensor("x", FP16)], "Outputs": [tensor("y", FP16)]},
    ])
    layers, detailed = load_engine_layers(path)
    inside = ["blocks.0.attn.qkv", "blocks.0.attn.matmul", "blocks.0.attn.matmul_1", "blocks.0.attn.proj",
              "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"]
    assert set(inside) <= set(project)
    # without the graph only the two ends are known: the layers inside look absent from the engine
    alone = analyse_engine(layers, detailed, project)
    assert alone.outcome("blocks.0.attn.qkv").engine_layer is None
    report = analyse_engine(expand_regions(layers, [names]), detailed, project)
    for module in inside:
        outcome = report.outcome(module)
        assert outcome.engine_layer == region, module
        # a region's formats are those at its edges: they say nothing of the precision inside
        assert outcome.engine_precision is None, module
    assert report.outcome("head").engine_layer is None and report.outcome("patch_embed").engine_layer is None
    assert report.hazards == [] and report.unmapped == []
    assert "Myelin region" in report.text()


def test_the_session_maps_regions_through_its_latest_export(demo_export, tmp_path):
    _, project_path, _, names = demo_export
    region = "{ForeignNode[stem.0/Conv...block.conv2/Conv]}"
    path = write_layers(tmp_path, names, [
        {"Name": region, "LayerType": "Myelin", "Inputs": [tensor("x", INT8)], "Outputs": [tensor("y", INT8)]},
    ])
    session = Session.open(project_path)
    # one region holding 3 of the 7 quantized layers: too little of the model to be its engine, unless forced
    with pytest.raises(SessionError, match="only 3 of the project's 7 quantized layers"):
        session.import_engine_report(path, remember=False)
    report = session.import_engine_report(path, remember=False, force=True)
    assert report.outcome("block.conv1").engine_layer == region
    assert report.outcome("expand.0").engine_layer is None


def test_one_alignment_rule_for_lint_and_engine():
    assert misaligned_channels(16, 32) is None
    assert misaligned_channels(3, 16) is None and misaligned_channels(1, 64) is None  # image first layers
    assert "3 -> 24 channels" in misaligned_channels(3, 24)
    assert "24 -> 40 channels" in misaligned_channels(24, 40)
    conv = EngineLayer("c/Conv", ["c/Conv"], "CaskConvolution", "Convolution",
                       [TensorInfo("x", [1, 24, 8, 8], INT8)], [TensorInfo("y", [1, 40, 8, 8], INT8)])
    report = analyse_engine([conv], True, {"c": True})
    assert [(h.kind, h.modules) for h in report.hazards] == [("misaligned_int8_conv", ["c"])]


def test_a_region_does_not_take_a_module_the_engine_ran_in_a_layer_of_its_own(vit_export, tmp_path):
    """A Myelin region's ends span the graph order, but a module TensorRT built outside it (a parallel branch)
    keeps its own layer, its precision and its hazard."""
    names, project = vit_export
    fc1 = "blocks.0.mlp.fc1"
    path = write_layers(tmp_path, names, [
        {"Name": "{ForeignNode[blocks.0.norm1/LayerNormalization...blocks.0/Add_1]}", "LayerType": "Myelin",
         "Inputs": [tensor("x", FP16)], "Outputs": [tensor("y", FP16)]},
        {"Name": f"{fc1}/MatMul + {fc1}/Add", "LayerType": "CaskGemm", "ParameterType": "MatrixMultiply",
         "Inputs": [tensor("h", "Row major linear FP32")], "Outputs": [tensor("g", "Row major linear FP32")]},
    ])
    layers, detailed = load_engine_layers(path)
    report = analyse_engine(expand_regions(layers, [names]), detailed, project)
    assert report.outcome(fc1).engine_precision == "FP32" and report.outcome(fc1).engine_layer.startswith(fc1)
    assert [(h.kind, h.modules) for h in report.hazards] == [("quantized_not_int8", [fc1])]
    assert report.outcome("blocks.0.attn.qkv").engine_layer.startswith("{ForeignNode[")


def test_a_region_whose_two_nodes_tensorrt_listed_itself_is_not_widened(vit_export, tmp_path):
    names, project = vit_export
    qkv, proj = "blocks.0.attn.qkv", "blocks.0.attn.proj"
    path = tmp_path / "layers.json"  # TensorRT 10 names the region itself and lists its nodes in Metadata
    path.write_text(json.dumps({"Layers": [
        {"Name": f"{{ForeignNode[{qkv}/MatMul...{proj}/MatMul]}}", "LayerType": "Myelin",
         "Metadata": f"[ONNX Layer: {qkv}/MatMul]\x1e[ONNX Layer: {proj}/MatMul]",
         "Inputs": [tensor("x", FP16)], "Outputs": [tensor("y", FP16)]}], "Bindings": []}))
    report = analyse_engine(expand_regions(load_engine_layers(path)[0], [names]), True, project)
    assert report.outcome(qkv).engine_layer is not None and report.outcome(proj).engine_layer is not None
    assert report.outcome("blocks.0.attn.matmul").engine_layer is None  # between them, but not listed


def test_a_lint_fix_for_an_add_in_the_models_own_forward_names_its_layer():
    """The graph names an add of the top-level forward "/Add" (module ""); the layer to quantize is "add"."""

    from workbench.export.lint import LintFix, LintWarning
    from workbench.project.model import LayerDecision
    from workbench.session.tensorrt import _with_layer_targets

    layers = {"conv": LayerDecision("conv", "Conv2d"), "add": LayerDecision("add", "QuantAdd", False)}
    warning = LintWarning("residual_not_fusable", ["", "conv"], "neither operand of /Add is quantized",
                          LintFix("quantize", ("",), "quantize the identity branch ()"), nodes=["/Add"])
    fixed = _with_layer_targets(layers, warning)
    assert fixed.fix.targets == ("add",) and fixed.fix.description == "quantize the identity branch (add)"
