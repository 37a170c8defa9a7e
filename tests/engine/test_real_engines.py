"""engine-report and lint against the real trtexec reports NVIDIA ships for torchvision's ResNet-18 (qat and fp16,
built on an A100 from an older TorchScript export whose node names have no scope), on a project with ResNet-18's
module names. The project is the qat engine's configuration: every convolution and fc quantized, the residual adds
and the average pool left in float (pytorch-quantization's default)."""
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from resnet18_names import FP16, QAT, TRTEXEC

from workbench.cli import main
from workbench.project import load_project
from workbench.quant.algorithms.tensorrt_rules import misaligned_channels
from workbench.session import Session, SessionError
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec

pytestmark = pytest.mark.skipif(not TRTEXEC.is_dir(), reason="the real trtexec reports are not on this machine")

TESTS = Path(__file__).resolve().parent
ADDS = [f"layer{stage}.{block}.add" for stage in range(1, 5) for block in range(2)]


@pytest.fixture(scope="module")
def qat_project(tmp_path_factory):
    """(path of a saved project like the qat engine's ONNX, its session)."""
    folder = tmp_path_factory.mktemp("resnet18")
    np.save(folder / "calib.npy", np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32))
    model = ModelSpec("entrypoint", str(TESTS / "resnet18_names.py") + ":make")
    session = Session.create(model, DataSpec("tensors", str(folder / "calib.npy"), batch_size=2), trust_code=True)
    session.calibrate(method="max")
    session.set_quantize(ADDS + ["avgpool"], False)
    return session.save(folder / "resnet18.qwb"), session


def test_the_qat_engine_maps_onto_resnet18_modules(qat_project):
    _, session = qat_project
    report = session.import_engine_report(*QAT, remember=False)
    # every one of the 37 engine layers maps: 22 through the weight names TensorRT put in fused layers' names
    assert (report.engine_layers, report.mapped_layers, report.unmapped) == (37, 37, [])
    assert report.mapped_by == {"weight names": 22, "layer type": 4, "engine graph": 11}
    assert (report.quantized_found, report.quantized_total) == (21, 21)
    assert report.outcome("layer2.0.downsample.0").engine_layer.startswith("layer2.0.downsample.0.weight + ")
    # the adds TensorRT fused into a convolution are that block's add (the downsample's, in a downsampling block)
    assert "Add_97" in report.outcome("layer2.0.add").engine_layer
    maxpool = report.outcome("maxpool")
    assert maxpool.engine_layer == "MaxPool_12" and maxpool.mapped_by == "layer type"
    assert report.outcome("avgpool").engine_layer == "GlobalAveragePool_246"
    assert "mapped to modules (22 by weight names, 4 by layer type, 11 through the engine graph)" in report.text()


def test_precision_is_read_from_every_input_and_output(qat_project):
    _, session = qat_project
    report = session.import_engine_report(*QAT, remember=False)
    conv2 = report.outcome("layer1.0.conv2")   # [INT8, FP16] -> FP16: conv + float add + relu
    assert conv2.engine_precision == "INT8" and conv2.precision_note == "input 1 FP16, output FP16"
    add = report.outcome("layer1.0.add")
    assert add.engine_precision == "FP16" and add.engine_layer == conv2.engine_layer
    assert report.outcome("layer1.0.conv1").precision_note is None          # INT8 in, INT8 out
    assert report.outcome("conv1").precision_note == "output FP32"
    assert report.precision_counts() == {"INT8": 21, "FP16": 9}
    # the project leaves the adds in float: nothing quantized ran in float
    assert [h for h in report.hazards if h.kind == "quantized_not_int8"] == []
    # a project that quantizes the adds sees each of them ran in FP16 (trex's qat example)
    session.set_quantize(ADDS, True)
    try:
        quantized = session.import_engine_report(*QAT, remember=False)
    finally:
        session.set_quantize(ADDS, False)
    found = [h for h in quantized.hazards if h.kind == "quantized_not_int8"]
    assert sorted(h.modules[0] for h in found) == sorted(ADDS)
    assert "input 1 is FP16 of a layer that reads INT8 too" in found[0].advice


def test_time_shares_name_the_float_boundaries_and_their_fix(qat_project):
    _, session = qat_project
    report = session.import_engine_report(*QAT, remember=False)
    requantize = {cost.cause: cost for cost in report.costs if cost.kind == "requantize"}
    assert sum(cost.share for cost in requantize.values()) == pytest.approx(15.6075, abs=1e-3)
    adds = requantize["after float residual adds"]
    assert adds.share == pytest.approx(12.4299, abs=1e-3) and len(adds.layers) == 7
    assert adds.modules == ADDS[:-1]  # layer4.1's add feeds the float average pool, not a Quantize
    assert requantize["after a float MaxPool"].modules == ["maxpool"]
    assert requantize["after a float average pool"].modules == ["avgpool"]
    text = report.text()
    assert "15.6% of the run re-quantizes float tensors for INT8 layers (9 Quantize layers)" in text
    assert "12.4% of the run re-quantizes after float residual adds" in text
    assert "5.6% of the run quantizes the network input" in text
    hazard = next(h for h in report.hazards if h.kind == "requantize" and "layer1.0.add" in h.modules)
    assert "qat -> qat-residual" in hazard.advice and hazard.engine_layer == "QuantizeLinear_40 (+6 more)"
    # the fix's command selects the project's residual adds
    pattern = hazard.advice.split("workbench set PROJECT --quantize '")[1].split("'")[0]
    assert session.select(patterns=[pattern]) == ADDS
    maxpool = next(h for h in report.hazards if h.kind == "requantize" and h.modules == ["maxpool"])
    assert "quantize its float readers too (layer1.0.add)" in maxpool.advice


def test_expected_conversions_are_not_hazards(qat_project):
    _, session = qat_project
    report = session.import_engine_report(*QAT, remember=False)
    # the network input's Quantize, and fc's 512 -> 1000 classes (1000 is not a multiple of 16, but the task's)
    assert misaligned_channels(512, 1000) is not None
    assert sorted(h.kind for h in report.hazards) == ["requantize"] * 3
    assert all(not h.engine_layer.startswith("QuantizeLinear_2 ") and h.engine_layer != "QuantizeLinear_2"
               for h in report.hazards)


def test_lint_warnings_match_what_the_engine_did(qat_project):
    """Each lint warning on the qat-like project, checked against the real engine built from such an export."""
    _, session = qat_project
    warnings = session.lint()
    report = session.import_engine_report(*QAT, remember=False)
    residual = [w for w in warnings if w.kind == "residual_not_fusable"]
    assert sorted(w.fix.targets[0] for w in residual) == sorted(ADDS)
    for warning in residual:  # the engine ran each of these adds in float, fused into its block's convolution
        add = report.outcome(warning.fix.targets[0])
        assert add.engine_precision == "FP16" and "Add_" in add.engine_layer
    [pool] = [w for w in warnings if w.kind == "float_pool_requantized"]
    assert pool.modules == ["avgpool"] and report.outcome("avgpool").engine_precision == "FP16"
    assert any(c.modules == ["avgpool"] and c.kind == "requantize" for c in report.costs)
    # conv1's output reaches layer1.0.conv1's Quantize through the MaxPool, but the float add reads the pool too:
    # TensorRT kept the pool in float and conv1 writes FP32, as lint says
    isolated = [w.modules for w in warnings if w.kind == "isolated_quantized_layer"]
    assert isolated == [["conv1"]]
    assert report.outcome("conv1").precision_note == "output FP32"
    assert report.outcome("maxpool").engine_precision == "FP32"
    assert {w.kind for w in warnings} == {"residual_not_fusable", "float_pool_requantized", "isolated_quantized_layer"}


def test_lint_on_the_residual_project_sees_conv1_and_maxpool_fuse(qat_project):
    """trex's qat-residual step (quantized identities): the pool's readers are all quantized, so TensorRT moves the
    Quantize before it and fuses conv1 + MaxPool in INT8; lint no longer calls conv1 isolated."""
    _, session = qat_project
    session.set_quantize(ADDS, True)
    try:
        warnings = session.lint()
    finally:
        session.set_quantize(ADDS, False)
    assert [w.kind for w in warnings] == ["float_pool_requantized"]


def test_another_models_engine_is_refused_and_nothing_is_stored(qat_project, tmp_path, capsys):
    path, _ = qat_project
    project = tmp_path / "resnet18.qwb"
    shutil.copy(path, project)
    assert main(["engine-report", "--trust-code", str(project), str(FP16[0]), "--profile", str(FP16[1])]) == 2
    err = capsys.readouterr().err
    assert "does not look like an engine of this model: only 1 of the project's 21 quantized layers" in err
    assert "--onnx FILE" in err and "--force" in err and "Traceback" not in err
    assert load_project(project).engine_reports == []
    assert main(["engine-report", "--trust-code", str(project), str(FP16[0]), "--force", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quantized_found"] == 1 and len(data["unmapped"]) == 29
    assert "scope-less ONNX node names" in data["unmapped_why"]["Conv_3 + Relu_4"]
    assert len(load_project(project).engine_reports) == 1


def test_a_tensorflow_engine_names_modules_this_model_does_not_have(qat_project, tmp_path):
    _, session = qat_project
    fmt = "Row major linear FP32"
    layers = [{"Name": f"StatefulPartitionedCall/resnet50/{name}/Conv2D", "LayerType": "CaskConvolution",
               "Inputs": [{"Name": f"t{i}", "Format/Datatype": fmt}], "Outputs": [{"Name": f"t{i + 1}",
                                                                                  "Format/Datatype": fmt}]}
              for i, name in enumerate(["conv1_conv", "conv2_block1_1_conv", "conv2_block1_2_conv"])]
    path = tmp_path / "tf.json"
    path.write_text(json.dumps({"Layers": layers, "Bindings": ["t0", "t3"]}))
    with pytest.raises(SessionError, match="only 0 of the project's 21 quantized layers") as refused:
        session.import_engine_report(path, remember=False)
    assert "names modules this model does not have (StatefulPartitionedCall/resnet50/conv1_conv)" in str(refused.value)
    report = session.import_engine_report(path, remember=False, force=True)
    # no made-up modules: only the model's own appear, none of them in this engine
    assert [o.module for o in report.layers if o.in_engine] == [] and report.mapped_layers == 0
    assert report.to_dict()["mapped_layers"] == 0 and report.hazards == []


def write_scopeless_onnx(path):
    """An ONNX file like the one the fp16 engine was built from: node names without scope, numbered in graph order
    (Conv_0, Relu_1, MaxPool_2, ...), weights named after their modules."""
    nodes, initializers, counter = [], [], iter(range(100))

    def node(op, inputs, weight=None):
        name = f"{op}_{next(counter)}"
        if weight is not None:
            initializers.append(helper.make_tensor(weight, TensorProto.FLOAT, [1], [0.0]))
            inputs = [*inputs, weight]
        nodes.append(helper.make_node(op, inputs, [name + "_out"], name=name))
        return name + "_out"

    x = node("MaxPool", [node("Relu", [node("Conv", ["input.1"], "conv1.weight")])])
    for stage in range(1, 5):
        for block in range(2):
            prefix = f"layer{stage}.{block}"
            out = node("Conv", [node("Relu", [node("Conv", [x], f"{prefix}.conv1.weight")])], f"{prefix}.conv2.weight")
            identity = node("Conv", [x], f"{prefix}.downsample.0.weight") if stage > 1 and block == 0 else x
            x = node("Relu", [node("Add", [out, identity])])
    out = node("Gemm", [node("Flatten", [node("GlobalAveragePool", [x])])], "fc.weight")
    graph = helper.make_graph(nodes, "resnet", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], initializers)
    onnx.save(helper.make_model(graph), str(path))
    assert [n.name for n in nodes][-1] == "Gemm_48"  # the numbering the fp16 engine's names carry


def test_onnx_file_maps_scopeless_names(qat_project, tmp_path, capsys):
    path, _ = qat_project
    project = tmp_path / "resnet18.qwb"
    shutil.copy(path, project)
    write_scopeless_onnx(tmp_path / "resnet.onnx")
    assert main(["engine-report", "--trust-code", str(project), str(FP16[0]), "--profile", str(FP16[1]),
                 "--onnx", str(tmp_path / "resnet.onnx"), "--json", "--no-save"]) == 0
    data = json.loads(capsys.readouterr().out)
    layers = {entry["module"]: entry for entry in data["layers"]}
    assert data["quantized_found"] == 21 and data["unmapped"] == [] and data["mapped_by"]["ONNX file"] >= 20
    assert layers["layer2.0.downsample.0"]["engine_layer"] == "Conv_16 + Add_17 + Relu_18"
    assert layers["layer2.0.add"]["engine_layer"] == "Conv_16 + Add_17 + Relu_18"
    # an FP16 build of an INT8 project: every quantized layer ran in FP16, and the report says so
    assert sum(h["kind"] == "quantized_not_int8" for h in data["hazards"]) == 21
    missing = tmp_path / "missing.onnx"
    assert main(["engine-report", "--trust-code", str(project), str(FP16[0]), "--onnx", str(missing)]) == 2
    assert "missing.onnx: no such ONNX file" in capsys.readouterr().err


def test_a_myelin_region_of_scopeless_nodes_maps_through_the_onnx_file(qat_project, tmp_path):
    """A region named by its ends ({ForeignNode[Conv_3...Relu_7]}) covers the ONNX file's nodes between them."""
    _, session = qat_project
    write_scopeless_onnx(tmp_path / "resnet.onnx")
    half = "Half"
    path = tmp_path / "region.json"
    path.write_text(json.dumps({"Layers": [
        {"Name": "{ForeignNode[Conv_3...Relu_7]}", "LayerType": "Myelin",
         "Inputs": [{"Name": "x", "Format/Datatype": half}], "Outputs": [{"Name": "y", "Format/Datatype": half}]}],
        "Bindings": ["x", "y"]}))
    report = session.import_engine_report(path, remember=False, force=True, onnx_file=tmp_path / "resnet.onnx")
    inside = [o.module for o in report.layers if o.in_engine and o.quantized is not None]
    assert inside == ["layer1.0.conv1", "layer1.0.conv2", "layer1.0.add"]
    assert report.outcome("layer1.0.conv2").engine_precision is None  # a region's formats are only at its edges
