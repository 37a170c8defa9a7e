"""QDQ export: errors that name the culprit, exactness of single layers, narrow range, unsigned,
exporter choice, LSTM handling, TensorRT side files."""
import json
import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn
from zoo import LSTMTagger, PlainCNN

from workbench import quant
from workbench.export import (
    ExportError,
    ExportValidationError,
    QuantizerStateError,
    SampleInputError,
    UnsupportedOperationError,
    export_qdq_onnx,
    qdq_reference,
    report_json,
    scale_hex,
)
from workbench.quant import QuantDescriptor
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.tensor_quant import fake_tensor_quant


def calibrated(model, shape, **replace_kwargs):
    torch.manual_seed(0)
    model = model.eval()
    quant.replace_to_quantization_module(model, **replace_kwargs)
    batches = [torch.randn(*shape) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches[0]


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def run_onnx(path, *inputs):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})


def onnx_rounding_output(model, *inputs):
    quantizers = [m for m in model.modules() if isinstance(m, quant.TensorQuantizer)]
    for q in quantizers:
        q.rounding = "onnx"
    try:
        with torch.no_grad():
            return model(*inputs)
    finally:
        for q in quantizers:
            q.rounding = "pytorch_quantization"


# ----- errors -------------------------------------------------------------------------------------


def test_a_never_calibrated_model_is_refused_with_every_quantizer_named(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    quantizers = {n: m for n, m in model.named_modules() if isinstance(m, quant.TensorQuantizer)}
    for q in quantizers.values():
        q.reset_amax()
    with pytest.raises(QuantizerStateError, match=r"fc\._input_quantizer: enabled but not calibrated") as info:
        export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert sorted(info.value.problems) == sorted(quantizers)
    assert "Calibrate the model" in str(info.value)
    assert leftovers(tmp_path) == []


def test_quantizers_calibration_never_reached_export_in_float_with_a_warning(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    model.fc._input_quantizer.reset_amax()  # as calibration leaves a quantizer no batch reached
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.quantize_nodes == 7 and report.cosine > 0.999
    assert any("never reached during calibration" in w and "fc._input_quantizer" in w for w in report.warnings)
    names = [n.name for n in onnx.load(str(tmp_path / "m.onnx")).graph.node]
    assert "fc._input_quantizer/QuantizeLinear" not in names and "fc._weight_quantizer/QuantizeLinear" in names
    assert not model.fc._input_quantizer._disabled  # the model is left as it came
    # a disabled quantizer needs no amax either, and exports without Q/DQ, without a warning
    model.fc._input_quantizer.disable()
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.quantize_nodes == 7 and not any("never reached" in w for w in report.warnings)


def test_quantizer_still_calibrating_or_not_int8(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    model.features[0]._input_quantizer.enable_calib()
    model.fc._weight_quantizer.num_bits = 4
    with pytest.raises(QuantizerStateError) as info:
        export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert "still collecting calibration statistics" in info.value.problems["features.0._input_quantizer"]
    assert "num_bits=4" in info.value.problems["fc._weight_quantizer"]


def test_ignored_layers_have_no_qdq(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16), ignore_policy=["fc", r"features\.3"])
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    quantized = {n.name.split("/")[0].rsplit(".", 1)[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    assert quantized == {"features.0", "features.5", "pool"}
    assert report.quantize_nodes == 4 and report.cosine > 0.999


def test_wrong_sample_shape_names_the_layer_and_input(tmp_path):
    model, _ = calibrated(PlainCNN(), (2, 3, 16, 16))
    with pytest.raises(SampleInputError) as info:
        export_qdq_onnx(model, torch.randn(2, 1, 16, 16), tmp_path / "m.onnx", input_names=["image"])
    assert info.value.layer == "features.0"
    assert "layer 'features.0' (QuantConv2d)" in str(info.value) and "image (2, 1, 16, 16)" in str(info.value)
    assert leftovers(tmp_path) == []


@torch.library.custom_op("wbtest::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _double_fake(x):
    return torch.empty_like(x)


class Doubler(nn.Module):
    def forward(self, x):
        return torch.ops.wbtest.double(x)


class WithCustomOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.inner = Doubler()

    def forward(self, x):
        return self.inner(self.conv(x))


def test_operation_the_exporter_cannot_handle_is_named_with_its_layer(tmp_path):
    model, x = calibrated(WithCustomOp(), (2, 3, 8, 8))
    with pytest.raises(UnsupportedOperationError) as info:
        export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert info.value.operations == ["wbtest.double.default"]
    assert info.value.layers == ["inner"]
    assert "wbtest.double.default called by inner" in str(info.value)
    assert leftovers(tmp_path) == []


def test_failed_validation_leaves_the_previous_file_alone(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    target = tmp_path / "m.onnx"
    target.write_text("previous export")
    with pytest.raises(ExportValidationError) as info:
        export_qdq_onnx(model, x, target, min_cosine=1.5, strict=True)
    assert info.value.stage == "parity" and "cosine" in str(info.value)
    assert info.value.report.cosine > 0.999  # the figures come with the error
    assert target.read_text() == "previous export"
    assert leftovers(tmp_path) == ["m.onnx"]


def test_bad_arguments(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    with pytest.raises(ValueError, match="opset"):
        export_qdq_onnx(model, x, tmp_path / "m.onnx", opset=11)
    with pytest.raises(ValueError, match="input_names"):
        export_qdq_onnx(model, x, tmp_path / "m.onnx", input_names=["a", "b"])
    with pytest.raises(ValueError, match="output_names"):
        export_qdq_onnx(model, x, tmp_path / "m.onnx", output_names=["a", "b"])
    with pytest.raises(TypeError, match="sample_inputs"):
        export_qdq_onnx(model, x.numpy(), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="exporter"):
        export_qdq_onnx(model, x, tmp_path / "m.onnx", exporter="onnxmltools")
    with pytest.raises(ValueError, match="does not exist"):
        export_qdq_onnx(model, x, tmp_path / "missing" / "m.onnx")


# ----- numbers ------------------------------------------------------------------------------------


def test_single_layer_matches_to_float_rounding(tmp_path):
    torch.manual_seed(0)
    layer = quant.QuantLinear(64, 32)
    x = torch.randn(16, 64) * 3
    layer._input_quantizer.amax = 5.0
    layer._weight_quantizer.amax = layer.weight.detach().abs().amax(1, keepdim=True)
    report = export_qdq_onnx(nn.Sequential(layer), x, tmp_path / "linear.onnx")
    (out,) = run_onnx(tmp_path / "linear.onnx", x)
    expected = onnx_rounding_output(nn.Sequential(layer), x).numpy()
    # same integers on both sides; only the float accumulation order of the matmul differs
    assert np.abs(out - expected).max() <= 1e-5
    assert report.max_abs_diff <= 1e-5 and report.cosine > 0.9999999
    assert layer._input_quantizer.rounding == "pytorch_quantization"  # restored after validation


def test_narrow_range_is_exact_with_a_clip_between_q_and_dq(tmp_path):
    torch.manual_seed(0)
    conv = quant.QuantConv2d(2, 3, 3, quant_desc_input=QuantDescriptor(narrow_range=True),
                             quant_desc_weight=QuantDescriptor(axis=0, narrow_range=True))
    conv._input_quantizer.amax = 0.5  # many inputs fall below -amax: full range would give -128 there
    conv._weight_quantizer.amax = conv.weight.detach().abs().amax((1, 2, 3), keepdim=True)
    x = torch.randn(2, 2, 6, 6)
    model = nn.Sequential(conv).eval()
    report = export_qdq_onnx(model, x, tmp_path / "narrow.onnx")
    assert report.narrow_range == 2 and report.clip_nodes == 2
    graph = onnx.load(str(tmp_path / "narrow.onnx")).graph
    clips = [n for n in graph.node if n.op_type == "Clip"]
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for clip in clips:
        bounds = [inits[name] if name in inits else None for name in clip.input[1:]]
        if all(b is not None for b in bounds):
            assert [int(b) for b in bounds] == [-127, 127] and bounds[0].dtype == np.int8
    (out,) = run_onnx(tmp_path / "narrow.onnx", x)
    assert np.abs(out - onnx_rounding_output(model, x).numpy()).max() <= 1e-5
    # without the clip the graph would differ: -128 steps appear below -amax
    scale = torch.tensor(0.5 / 127)
    full = qdq_reference(x, scale, torch.tensor(0, dtype=torch.int8), 0, -128, 127)
    narrow = fake_tensor_quant(x, torch.tensor(0.5), 8, False, True, "onnx")
    assert not torch.equal(full, narrow)
    assert torch.equal(qdq_reference(x, scale, torch.tensor(0, dtype=torch.int8), 0, -127, 127), narrow)


def test_unsigned_quantizer_exports_as_uint8(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    quant.replace_to_quantization_module(model)
    model[2]._input_quantizer = quant.TensorQuantizer(QuantDescriptor(unsigned=True))
    x = torch.randn(2, 3, 8, 8)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, x, tmp_path / "u.onnx")
    assert report.unsigned == 1 and report.cosine > 0.999
    graph = onnx.load(str(tmp_path / "u.onnx")).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    node = next(n for n in graph.node if n.name == "2._input_quantizer/QuantizeLinear")
    assert inits[node.input[2]].dtype == np.uint8
    amax = model[2]._input_quantizer.amax
    assert inits[node.input[1]] == np.float32(amax / 255.0)


def test_all_zero_weight_channel_stays_zero(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    with torch.no_grad():
        model.features[0].weight[2].zero_()
        model.features[0]._weight_quantizer.amax = model.features[0].weight.abs().amax((1, 2, 3), keepdim=True)
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.cosine > 0.999
    assert any("features.0._weight_quantizer" in w and "every input to 0" in w for w in report.warnings)


# ----- exporters ----------------------------------------------------------------------------------


class Branchy(nn.Module):
    """Python control flow on a tensor value: torch.export cannot capture it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        if x.mean() > 100:
            return self.b(x)
        return self.a(x)


def test_control_flow_falls_back_to_torchscript_and_says_why(tmp_path):
    model, x = calibrated(Branchy(), (2, 3, 8, 8))
    # the other branch never ran during calibration: give it a range by hand
    model.b._input_quantizer.amax = 4.0
    model.b._weight_quantizer.amax = model.b.weight.detach().abs().amax((1, 2, 3), keepdim=True)
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.exporter == "torchscript"
    assert report.exporter_note.startswith("TorchScript exporter: torch.export could not capture the model")
    assert report.quantize_nodes == 2 and report.cosine > 0.999
    with pytest.raises(ExportError, match="torch.export could not capture the model"):
        export_qdq_onnx(model, x, tmp_path / "strict.onnx", exporter="dynamo")
    assert not (tmp_path / "strict.onnx").exists()


def test_torchscript_on_request_gives_the_same_structure(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    dynamo = export_qdq_onnx(model, x, tmp_path / "d.onnx", exporter="dynamo")
    script = export_qdq_onnx(model, x, tmp_path / "t.onnx", exporter="torchscript")
    assert (dynamo.exporter, script.exporter) == ("dynamo", "torchscript")
    assert "torch.export-based exporter" in dynamo.exporter_note and "opset 18 to 17" in dynamo.exporter_note
    assert dynamo.quantize_nodes == script.quantize_nodes == 8
    # onnxruntime's conv and torch's sum in different orders: equal to float rounding, not bit for bit
    assert dynamo.opset == script.opset == 17 and script.max_abs_diff < 1e-6


def test_opset_18_with_the_default_exporter_and_names(tmp_path):
    model, x = calibrated(PlainCNN(), (1, 3, 16, 16))  # batch 1: still exported with a dynamic batch
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx", opset=18, input_names=["image"],
                             output_names=["logits"])
    # a CNN with a float input takes the TorchScript fast path, at the requested opset
    assert (report.opset, report.exporter) == (18, "torchscript") and "fast path" in report.exporter_note
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert [i.name for i in graph.input] == ["image"] and [o.name for o in graph.output] == ["logits"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert report.dynamic_batch_check.shape[0] == 2


def test_lstm_left_unquantized_exports_as_an_onnx_lstm(tmp_path):
    model, x = calibrated(LSTMTagger(), (2, 7, 6), ignore_policy="lstm")
    report = export_qdq_onnx(model, x, tmp_path / "lstm.onnx")
    graph = onnx.load(str(tmp_path / "lstm.onnx")).graph
    assert report.exporter == "dynamo" and report.quantize_nodes == 4 and report.cosine > 0.999
    assert sum(1 for n in graph.node if n.op_type == "LSTM") == 1
    assert not any("unrolled" in w for w in report.warnings)
    (out,) = run_onnx(tmp_path / "lstm.onnx", torch.randn(3, 7, 6))  # another batch size
    assert out.shape == (3, 7, 3)


def test_quantized_lstm_exports_unrolled_with_the_default_exporter_at_opset_18(tmp_path):
    model, x = calibrated(LSTMTagger(), (2, 7, 6))
    report = export_qdq_onnx(model, x, tmp_path / "qlstm.onnx", opset=18, exporter="dynamo")
    assert report.exporter == "dynamo" and report.quantize_nodes == 12 and report.cosine > 0.999
    assert any("unrolled" in w and "'lstm'" in w for w in report.warnings)


# ----- TensorRT side files ------------------------------------------------------------------------


def test_amax_json_calibration_cache_and_float_graph(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx", amax_json_path=tmp_path / "amax.json",
                             calibration_cache_path=tmp_path / "m.cache", float_onnx_path=tmp_path / "float.onnx",
                             trt_version=100300)
    table = json.loads((tmp_path / "amax.json").read_text())
    entry = table["quantizers"]["features.0._weight_quantizer"]
    assert entry["axis"] == 0 and len(entry["amax"]) == 8 and entry["zero_point_type"] == "int8"
    assert entry["amax"] == pytest.approx(model.features[0]._weight_quantizer.amax.reshape(-1).tolist())
    assert entry["scale"] == pytest.approx([a / 127 for a in entry["amax"]])

    lines = (tmp_path / "m.cache").read_text().splitlines()
    assert lines[0] == "TRT-100300-EntropyCalibration2"
    cache = {name: struct.unpack(">f", bytes.fromhex(value))[0] for name, value in
             (line.split(": ") for line in lines[1:])}
    assert len(cache) == 5  # the activation quantizers; TensorRT computes weight scales itself
    float_graph = onnx.load(str(tmp_path / "float.onnx")).graph
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in float_graph.node)
    tensors = {i.name for i in float_graph.input} | {o for n in float_graph.node for o in n.output}
    assert set(cache) <= tensors
    first = model.features[0]._input_quantizer.amax.item()
    assert cache["input"] == pytest.approx(first / 127, rel=1e-6)
    assert scale_hex(1.0) == "3f800000" and scale_hex(1 / 127) == "3c010204"  # float32 bits, big-endian

    (out,) = run_onnx(tmp_path / "float.onnx", x)
    with torch.no_grad(), quant.disable_quantization(model):
        assert np.abs(out - model(x).numpy()).max() < 1e-4
    assert report.float_onnx_path and report.calibration_cache_path and report.amax_json_path
    saved = json.loads(report_json(report))
    assert saved["quantize_nodes"] == 8 and saved["outputs"][0]["name"] == "output"


def test_quantizers_tensorrt_cannot_build_are_refused_by_the_export(tmp_path):
    """onnxruntime would run them, TensorRT would not: a per-channel activation, a weight on a kernel axis."""
    conv = quant.QuantConv2d(3, 4, 1, quant_desc_input=QuantDescriptor(axis=1))
    x = torch.randn(2, 3, 4, 4)
    conv._input_quantizer.amax = x.abs().amax((0, 2, 3), keepdim=True)
    conv._weight_quantizer.amax = conv.weight.detach().abs().amax((1, 2, 3), keepdim=True)
    with pytest.raises(QuantizerStateError, match=r"0\._input_quantizer.*per-tensor only"):
        export_qdq_onnx(nn.Sequential(conv), x, tmp_path / "pc.onnx")
    assert not (tmp_path / "pc.onnx").exists()

    wrong_axis = quant.QuantConv2d(3, 4, 3, quant_desc_weight=QuantDescriptor(axis=2))
    wrong_axis._input_quantizer.amax = x.abs().max()
    wrong_axis._weight_quantizer.amax = wrong_axis.weight.detach().abs().amax((0, 1, 3), keepdim=True)
    with pytest.raises(QuantizerStateError, match=r"per output channel \(axis=0\), not axis=2"):
        export_qdq_onnx(nn.Sequential(wrong_axis), x, tmp_path / "axis.onnx")


def test_each_quantizer_s_onnx_parameters_are_computed_once_per_export(tmp_path, monkeypatch):
    import workbench.export.qdq as qdq
    import workbench.export.reference as reference
    import workbench.export.validation as validation

    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    computed: list[int] = []
    original = qdq.export_params

    def counting(q, *weight):  # a weight's quantizer gets its weight (FP8, INT4 and NVFP4 store it quantized)
        computed.append(id(q))
        return original(q, *weight)

    monkeypatch.setattr(reference, "export_params", counting)
    monkeypatch.setattr(validation, "export_params", counting)
    monkeypatch.setattr(qdq, "export_params", counting)  # QDQStandIn's own fallback
    # dynamic batch runs the reference twice; the amax table reads every quantizer again
    export_qdq_onnx(model, x, tmp_path / "m.onnx", amax_json_path=tmp_path / "amax.json")
    quantizers = [m for m in model.modules() if isinstance(m, quant.TensorQuantizer)]
    assert sorted(computed) == sorted(id(q) for q in quantizers)


def test_export_leaves_modes_and_quantizer_state_as_they_came(tmp_path):
    model, x = calibrated(PlainCNN(), (2, 3, 16, 16))
    model.train()
    model.features[0].eval()
    amax = model.features[0]._input_quantizer._amax
    before = amax.clone()
    export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert model.training and not model.features[0].training
    assert all(m.training for name, m in model.named_modules() if name and not name.startswith("features.0"))
    assert model.features[0]._input_quantizer._amax is amax and torch.equal(amax, before)
    assert model.features[0]._input_quantizer.rounding == "pytorch_quantization"
