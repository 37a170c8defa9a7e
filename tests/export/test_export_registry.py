"""The torch.export-based path with its ONNX translation registry built once per process writes the very
file torch.onnx.export's own path (a registry rebuilt on every call) writes: same nodes, names, Q/DQ per
module, initializers, and onnxruntime outputs."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from zoo import PlainCNN

from workbench import quant
from workbench.export import export_qdq_onnx, exporters
from workbench.export.naming import MODULE_KEY
from workbench.quant.calibrate import calibrate


class Tokens(nn.Module):
    """Token ids in, a dynamic sequence axis out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids):
        return self.head(torch.relu(self.fc(self.embed(input_ids))))


def image_model():
    torch.manual_seed(0)
    model = PlainCNN().eval()
    quant.replace_to_quantization_module(model)
    batches = [torch.randn(2, 3, 16, 16) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches[0]


def token_model():
    torch.manual_seed(0)
    model = Tokens().eval()
    quant.replace_to_quantization_module(model)
    batches = [torch.randint(0, 40, (2, 6)) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches[0]


def qdq_per_module(proto):
    found: dict[tuple[str, str], int] = {}
    for node in proto.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            module = {e.key: e.value for e in node.metadata_props}.get(MODULE_KEY, "")
            found[(module, node.op_type)] = found.get((module, node.op_type), 0) + 1
    return found


@pytest.mark.parametrize("build", [image_model, token_model])
def test_the_cached_registry_writes_the_same_file(tmp_path, monkeypatch, build):
    model, sample = build()
    built = []
    real = exporters._registry

    def counting(opset):
        registry = real(opset)
        built.append(registry)
        return registry

    monkeypatch.setattr(exporters, "_registry", counting)
    cached = export_qdq_onnx(model, sample, tmp_path / "cached.onnx")
    assert cached.exporter == "dynamo" and built and built[-1] is not None
    # torch.onnx.export's own way: no registry handed in, it builds one from torchlib
    monkeypatch.setattr(exporters, "_registry", lambda opset: None)
    plain = export_qdq_onnx(model, sample, tmp_path / "plain.onnx")

    a, b = onnx.load(str(tmp_path / "cached.onnx")), onnx.load(str(tmp_path / "plain.onnx"))
    assert [(n.name, n.op_type) for n in a.graph.node] == [(n.name, n.op_type) for n in b.graph.node]
    assert [i.name for i in a.graph.initializer] == [i.name for i in b.graph.initializer]
    assert qdq_per_module(a) == qdq_per_module(b) and qdq_per_module(a)
    assert a.graph.SerializeToString() == b.graph.SerializeToString()
    assert (cached.quantize_nodes, cached.dequantize_nodes) == (plain.quantize_nodes, plain.dequantize_nodes)
    feeds = {cached.input_names[0]: sample.numpy()}
    outputs = [ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"]).run(None, feeds)
               for name in ("cached.onnx", "plain.onnx")]
    np.testing.assert_allclose(outputs[0][0], outputs[1][0], rtol=0, atol=1e-6)


def test_the_registry_is_built_once_per_opset_and_copied_per_export(monkeypatch):
    from torch.onnx._internal.exporter import _registration

    monkeypatch.setattr(exporters, "_REGISTRIES", {})
    calls = []
    original = _registration.ONNXRegistry.from_torchlib.__func__

    def counting(cls, opset_version=18):
        calls.append(opset_version)
        return original(cls, opset_version=opset_version)

    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counting))
    first, second = exporters._registry(18), exporters._registry(18)
    assert calls == [18]
    assert first is not second and first.functions is not second.functions
    qdq = torch.ops.workbench.qdq.default.name()
    assert first.get_decomps(torch.ops.workbench.qdq.default)[0].is_custom and qdq in first.functions
    first.functions[qdq].clear()  # one export adding to or changing its copy leaves the next one's alone
    assert second.functions[qdq] and exporters._registry(18).functions[qdq]
    exporters._registry(19)
    assert calls == [18, 19]
