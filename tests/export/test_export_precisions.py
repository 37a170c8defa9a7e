"""Export of FP8 and INT4 weight-only layers: the graph carries each format as TensorRT reads it, onnxruntime
runs it with parity to the fake-quant PyTorch model, and the opset is the lowest the formats need."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from torch import nn

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.export.formats import format_counts
from workbench.export.validation import ort_session
from workbench.project.settings import make_descriptor
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.precision import Precision, descriptors_for


class Mixed(nn.Module):
    """A convolution, then two GEMMs: one precision each."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 6 * 6, 40)
        self.fc2 = nn.Linear(40, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.relu(self.conv(x)).flatten(1))))


def quantized(precisions: dict[str, Precision], *, block_size=16, per_channel=True, block_method="max"):
    torch.manual_seed(0)
    model = Mixed().eval()
    types = {"conv": "Conv2d", "fc1": "Linear", "fc2": "Linear"}

    def choose(name, module):
        inputs, weight = descriptors_for(precisions.get(name, Precision.INT8), types[name], block_size=block_size,
                                         fp8_weight_per_channel=per_channel)
        return make_descriptor(inputs), make_descriptor(weight)

    quant.replace_to_quantization_module(model, descriptor_for=choose)
    batches = [torch.randn(4, 3, 6, 6) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False, block_method=block_method)
    return model, batches[0]


def ort_run(path, x):
    # the graph as written (the export's own validation session): onnxruntime 1.32's extended optimizations
    # (its QDQ fusions) change what an FP8 Q/DQ graph computes on the CPU, by 0.35 on this model
    session = ort_session(str(path))
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def initializer_types(proto):
    return {init.name: init.data_type for init in proto.graph.initializer}


def test_int8_only_keeps_opset_17(tmp_path):
    model, x = quantized({})
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.opset == 17 and report.formats == {"int8": 6}
    assert not any("instead of the requested" in w for w in report.warnings + report.notes)


@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_exports_as_float8_qdq_at_opset_19_with_parity(tmp_path, per_channel):
    model, x = quantized({"conv": Precision.FP8, "fc1": Precision.FP8, "fc2": Precision.FP8}, per_channel=per_channel)
    path = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, x, path)
    assert report.opset == 19 and report.requested_opset == 17
    assert "opset 19 instead of the requested 17: FP8 E4M3 Q/DQ needs 19" in report.notes
    proto = onnx.load(str(path))
    counts = format_counts(proto)
    assert counts["fp8"] == 6 and counts["int8"] == 0
    # every Q/DQ zero point is a float8e4m3fn zero; weight scales per output channel when asked
    constants = {n.output[0]: n.attribute[0].t for n in proto.graph.node if n.op_type == "Constant"}
    for node in proto.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zero = constants.get(node.input[2]) or next(i for i in proto.graph.initializer if i.name == node.input[2])
            assert zero.data_type == TensorProto.FLOAT8E4M3FN
    scales = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    assert scales["conv._weight_quantizer.scale"].shape == ((8,) if per_channel else ())
    assert np.allclose(scales["conv._input_quantizer.scale"],
                       float(model.conv._input_quantizer.amax) / 448, rtol=1e-6)
    with torch.no_grad():
        expected = model(x).numpy()
    got = ort_run(path, x)
    assert np.abs(got - expected).max() < 1e-5
    assert report.cosine > 0.99999


def test_int4_weights_are_an_int4_initializer_into_blocked_dequantize(tmp_path):
    model, x = quantized({"fc1": Precision.INT4W, "fc2": Precision.INT4W}, block_size=16, block_method="mse")
    path = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, x, path)
    assert report.opset == 21 and report.formats == {"int4": 2, "int8": 2}
    proto = onnx.load(str(path))
    types = initializer_types(proto)
    blocked = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"
               and any(a.name == "block_size" for a in n.attribute)]
    assert len(blocked) == 2
    for node in blocked:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes == {"axis": 1, "block_size": 16}
        assert types[node.input[0]] == TensorProto.INT4
        assert node.input[0] == node.input[1].replace(".scale", ".int4_weight")  # named after its quantizer
    # the float weights of the INT4 layers are gone from the file; fc1's 288 inputs are 18 blocks of 16
    assert "fc1.weight" not in types and "fc2.weight" not in types
    scales = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    assert scales["fc1._weight_quantizer.scale"].shape == (40, 18)
    values = next(numpy_helper.to_array(i) for i in proto.graph.initializer
                  if i.name == blocked[0].input[0] or i.name == blocked[1].input[0])
    assert values.min() >= -8 and values.max() <= 7
    # no QuantizeLinear for the INT4 layers' inputs: activations stay float
    assert report.quantize_nodes == 2  # the convolution's input and weight
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.abs(ort_run(path, x) - expected).max() < 1e-5


def test_a_mix_of_all_formats_takes_the_highest_opset_and_counts_each(tmp_path):
    model, x = quantized({"conv": Precision.INT8, "fc1": Precision.FP8, "fc2": Precision.INT4W}, block_size=8)
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.opset == 21
    assert report.formats == {"fp8": 2, "int4": 1, "int8": 2}
    assert report.qdq_by_format == {"int8": 2, "fp8": 2, "int4": 1}
    assert "2 fp8, 1 int4, 2 int8" in report.summary()


def test_trt_custom_ops_form_of_fp8_validated_in_the_standard_form(tmp_path):
    model, x = quantized({"conv": Precision.FP8, "fc1": Precision.FP8, "fc2": Precision.FP8}, per_channel=False)
    path = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, x, path, fp8_ops="trt")
    proto = onnx.load(str(path))
    ops = [(n.domain, n.op_type) for n in proto.graph.node if "uantize" in n.op_type]
    assert set(ops) == {("trt", "TRT_FP8QuantizeLinear"), ("trt", "TRT_FP8DequantizeLinear")} and len(ops) == 12
    assert all(len(n.input) == 2 for n in proto.graph.node if n.domain == "trt")
    # without float8 types the rest of the graph goes back to the requested opset (TensorRT 8.6 reads 17)
    assert report.opset == 17 and {e.domain: e.version for e in proto.opset_import}["trt"] == 1
    assert any("onnxruntime cannot run them: the standard form" in n for n in report.notes)
    assert report.cosine > 0.99999  # measured on the standard form
    assert not any(i.data_type == TensorProto.FLOAT8E4M3FN for i in proto.graph.initializer)


def test_trt_form_refuses_per_channel_fp8_and_writes_nothing(tmp_path):
    model, x = quantized({"conv": Precision.FP8})
    with pytest.raises(ValueError, match="takes one scale per tensor; per-channel FP8: conv._weight_quantizer"):
        export_qdq_onnx(model, x, tmp_path / "m.onnx", fp8_ops="trt")
    assert list(tmp_path.iterdir()) == []


def test_int4w_on_hugging_face_conv1d_blocks_its_input_dimension(tmp_path):
    """GPT-2's Conv1D keeps its weight [in, out]: the blocks run along axis 0, and the exported
    DequantizeLinear says so (axis=0)."""
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = pytorch_utils.Conv1D(48, 40)  # nf=48 outputs, nx=40 inputs

        def forward(self, x):
            return self.proj(x)

    torch.manual_seed(0)
    model = Block().eval()

    def choose(name, module):
        inputs, weight = descriptors_for(Precision.INT4W, type(module).__name__, block_size=16,
                                         weight_ndim=module.weight.dim())
        return make_descriptor(inputs), make_descriptor(weight)

    quant.replace_to_quantization_module(model, descriptor_for=choose)
    batches = [torch.randn(2, 5, 40) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    assert tuple(model.proj._weight_quantizer.amax.shape) == (3, 1, 48)  # 40 inputs: blocks of 16, 16, 8
    path = tmp_path / "c.onnx"
    report = export_qdq_onnx(model, batches[0], path)
    assert report.formats == {"int4": 1} and report.cosine > 0.99999
    node = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "DequantizeLinear")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"axis": 0, "block_size": 16}
