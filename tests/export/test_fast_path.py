"""The TorchScript fast path of ``exporter="auto"``: taken where its graph is the one torch.export records
(same Q/DQ, same node names and modules, same outputs), left where it may not be."""
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn
from zoo import ZOO, LSTMTagger

from workbench import quant
from workbench.export import export_qdq_onnx, exporters
from workbench.export.exporters import FAST_PATH_NOTE, fast_path_refusal
from workbench.export.naming import MODULE_KEY
from workbench.quant.algorithms.calibrate import calibrate

QDQ = ("QuantizeLinear", "DequantizeLinear", "Clip")
# the same computation, spelled differently by the two exporters
SPELLING = {"Flatten": "Reshape", "GlobalAveragePool": "ReduceMean"}


def calibrated(model, shape):
    torch.manual_seed(0)
    model = model.eval()
    quant.replace_to_quantization_module(model)
    batches = [torch.randn(*shape) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches[0]


def module_of(node):
    return next((p.value for p in node.metadata_props if p.key == MODULE_KEY), None)


def is_qdq(node):
    return node.op_type in QDQ and "_quantizer" in node.name  # not a ReLU6's Clip


def compute_nodes(graph):
    spelled = set(SPELLING) | set(SPELLING.values())
    return Counter((module_of(n), SPELLING.get(n.op_type, n.op_type), "" if n.op_type in spelled else n.name)
                   for n in graph.node if not is_qdq(n))


def qdq_nodes(graph):
    return sorted((n.name, n.op_type, tuple(n.input[1:])) for n in graph.node if is_qdq(n))


def run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize("name", ["resnet", "yolo", "plain_cnn", "depthwise_grouped", "mlp"])
def test_the_fast_path_writes_the_graph_torch_export_writes(tmp_path, name):
    builder, shape = ZOO[name]
    model, x = calibrated(builder(), shape)
    fast = export_qdq_onnx(model, x, tmp_path / "fast.onnx")
    slow = export_qdq_onnx(model, x, tmp_path / "slow.onnx", exporter="dynamo")
    assert (fast.exporter, fast.exporter_note, slow.exporter) == ("torchscript", FAST_PATH_NOTE, "dynamo")
    a, b = onnx.load(str(tmp_path / "fast.onnx")).graph, onnx.load(str(tmp_path / "slow.onnx")).graph
    # the same Q/DQ pairs, named after the same quantizers, reading the same scales
    assert qdq_nodes(a) == qdq_nodes(b) and (fast.quantize_nodes, fast.expected_qdq) == (slow.quantize_nodes,
                                                                                         slow.expected_qdq)
    # the same compute nodes, named after the same modules (a block's second ReLU call: "relu/Relu_1")
    assert compute_nodes(a) == compute_nodes(b)
    scales = {t.name: numpy_helper.to_array(t) for t in b.initializer if t.name.endswith(".scale")}
    for t in a.initializer:
        if t.name in scales:
            np.testing.assert_array_equal(numpy_helper.to_array(t), scales[t.name])
    # both symbolic in the batch, and the same numbers on inputs neither saw
    assert a.input[0].type.tensor_type.shape.dim[0].dim_param == b.input[0].type.tensor_type.shape.dim[0].dim_param
    other = torch.randn(3, *shape[1:])
    np.testing.assert_allclose(run(tmp_path / "fast.onnx", other), run(tmp_path / "slow.onnx", other), atol=1e-5)
    assert fast.cosine > 0.999 and fast.range_check is not None


def test_a_second_call_of_one_module_is_named_as_torch_export_names_it(tmp_path):
    builder, shape = ZOO["resnet"]
    model, x = calibrated(builder(), shape)
    export_qdq_onnx(model, x, tmp_path / "m.onnx")
    names = [n.name for n in onnx.load(str(tmp_path / "m.onnx")).graph.node if n.op_type == "Relu"]
    block = next(n.rsplit("/", 1)[0] for n in names if n.endswith("/Relu_1"))
    assert {f"{block}/Relu", f"{block}/Relu_1"} <= set(names)
    assert not any("relu_1" in n for n in names)  # TorchScript's scope of the repeated call, resolved


class ReadsAValueWhileTracing(nn.Module):
    """Stands for a model whose trace reads a tensor's value into Python (the tracer warns)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        if torch.jit.is_tracing():
            warnings.warn("Converting a tensor to a Python boolean might cause the trace to be incorrect.",
                          torch.jit.TracerWarning, stacklevel=2)
        return self.conv(x)


def test_a_graph_that_computes_shapes_at_run_time_is_exported_by_torch_export(tmp_path):
    # attention splits heads with x.shape, the decoder flattens with y.flatten(2): TorchScript writes Shape nodes
    for name in ("transformer", "conv_transpose"):
        builder, shape = ZOO[name]
        model, x = calibrated(builder(), shape)
        report = export_qdq_onnx(model, x, tmp_path / f"{name}.onnx")
        assert report.exporter == "dynamo" and report.cosine > 0.999
        assert not any(n.op_type == "Shape" for n in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node)


def test_a_tracer_warning_sends_auto_to_torch_export(tmp_path):
    model, x = calibrated(ReadsAValueWhileTracing(), (2, 3, 8, 8))
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.exporter == "dynamo" and report.quantize_nodes == 2
    # the abandoned trace's warning is not the file's: torch.export recorded it
    assert not any("TorchScript tracer" in w for w in report.warnings)


def test_a_fast_graph_that_fails_validation_is_exported_with_torch_export(tmp_path, monkeypatch):
    model, x = calibrated(ZOO["plain_cnn"][0](), ZOO["plain_cnn"][1])
    clean = exporters.clean_torchscript_graph

    def wrong_scale(proto, base_dir=None):  # a graph that is not the model's: one weight's scale 1000 times too large
        proto = clean(proto, base_dir)
        for tensor in proto.graph.initializer:
            if tensor.name.endswith("_weight_quantizer.scale"):
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 1000, tensor.name))
                break
        return proto

    monkeypatch.setattr(exporters, "clean_torchscript_graph", wrong_scale)
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.exporter == "dynamo" and report.cosine > 0.999
    assert any("fast path's graph failed validation" in n for n in report.notes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # the refused file is gone


def test_what_keeps_a_model_off_the_fast_path(monkeypatch):
    conv = nn.Conv2d(3, 4, 3)
    image = (torch.randn(2, 3, 8, 8),)
    assert fast_path_refusal(conv, image, 17, {"int8"}) is None
    assert "not floating point" in fast_path_refusal(conv, (torch.ones(2, 5, dtype=torch.long),), 17, {"int8"})
    assert "fp8" in fast_path_refusal(conv, image, 19, {"int8", "fp8"})
    assert "opset 21" in fast_path_refusal(conv, image, 21, {"int8"})
    assert "recurrent" in fast_path_refusal(LSTMTagger(), (torch.randn(2, 7, 6),), 17, {"int8"})
    monkeypatch.setattr(exporters, "FAST_PATH_MAX_BYTES", 100)
    assert "over the TorchScript exporter's" in fast_path_refusal(conv, image, 17, {"int8"})
