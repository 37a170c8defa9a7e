"""Export and validate every model family on CPU: parity with the fake-quant model, Q/DQ structure,
scales, axes, zero points, dynamic batch, rule reports."""
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from zoo import ZOO

from tests.ort_run import value_session
from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.export.exporters import FAST_PATH_NOTE
from workbench.graph import apply_placement_rules, insert_functional_quantizers
from workbench.quant.algorithms.calibrate import calibrate

# Q/DQ pairs each model's graph must hold: one per distinct (tensor, scale) the model quantizes.
# Where two quantizers read the same tensor with the same scale, the exporter's optimiser keeps one
# pair for both (TensorRT wants exactly that):
#   resnet: 16 quantizers, 17 calls (the stem MaxPool's output is read by layer1.0.conv1 and by the
#     add's identity branch through one shared quantizer); layer2.0.conv1 and layer2.0.downsample.0
#     read one tensor with equal scales: 15 pairs.
#   yolo: 20 quantizers, 26 calls (the C3 and SPPF concat quantizers run once per input, 2 and 4, and
#     once more as the input quantizer of the conv after each concat); C3's cv1/cv2, and the
#     bottleneck's cv1 and add, read one tensor each: 24 pairs.
#   transformer: 16 quantizers (6 Linears, 2 attention products); q, k and v read the same normalised
#     tensor: 14 pairs.
#   lstm: embed (2) + head (2) + the LSTM's weight (1) + its input quantizer once per time step (7): 12.
EXPECTED_QDQ = {"plain_cnn": 8, "resnet": 15, "yolo": 24, "depthwise_grouped": 8, "conv_transpose": 6, "mlp": 6,
                "transformer": 14, "lstm": 12}
EXPECTED_QUANTIZERS = {"plain_cnn": 8, "resnet": 16, "yolo": 20, "depthwise_grouped": 8, "conv_transpose": 6,
                       "mlp": 6, "transformer": 16, "lstm": 6}


def prepare(name):
    build, shape = ZOO[name]
    torch.manual_seed(0)
    model = build().eval()
    quant.replace_to_quantization_module(model)
    model, functional = insert_functional_quantizers(model)
    rules = apply_placement_rules(model)
    batches = [torch.randn(*shape) for _ in range(3)]
    calibrate(model, batches[:2], num_batches=2, method="max", report_sqnr=False)
    return model, batches, functional, rules


@pytest.fixture(scope="module", params=sorted(ZOO))
def exported(request, tmp_path_factory):
    name = request.param
    model, batches, functional, rules = prepare(name)
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    report = export_qdq_onnx(model, batches[0], path)
    return name, model, batches, functional, rules, path, report


def fake_quant_outputs(model, x):
    quantizers = [m for m in model.modules() if isinstance(m, quant.TensorQuantizer)]
    saved = [q.rounding for q in quantizers]
    for q in quantizers:
        q.rounding = "onnx"
    try:
        with torch.no_grad():
            return model(x).numpy()
    finally:
        for q, r in zip(quantizers, saved):
            q.rounding = r


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_file_is_valid_and_matches_the_fake_quant_model(exported):
    name, model, batches, _, _, path, report = exported
    assert path.is_file() and report.path == str(path)
    assert report.file_size == path.stat().st_size
    onnx.checker.check_model(str(path), full_check=True)
    assert report.requested_opset == 17
    if report.opset != 17:  # the exporter's own opset where converting down failed (the LSTM), said in a warning
        assert report.opset > 17 and any(f"opset {report.opset} instead of the requested 17" in w
                                         for w in report.warnings), report.warnings
    assert report.cosine > 0.999, name
    assert report.max_abs_diff < 1e-3, name
    assert report.exporter in ("dynamo", "torchscript")
    if report.exporter == "torchscript":  # the fast path, or where the torch.export-based exporter could not do it
        assert report.exporter_note == FAST_PATH_NOTE or (
            report.exporter_note.startswith("TorchScript exporter: ") and len(report.exporter_note) > 40)
    print(f"{name}: max abs diff {report.max_abs_diff:.3g}, cosine {report.cosine:.7f}, exporter {report.exporter}")


def test_qdq_counts(exported):
    name, model, *_, report = exported
    assert report.quantize_nodes == report.dequantize_nodes == report.expected_qdq == EXPECTED_QDQ[name]
    active = {id(q) for q in model.modules() if isinstance(q, quant.TensorQuantizer) and q.is_enabled}
    assert report.quantizers == len(active) == EXPECTED_QUANTIZERS[name]
    assert report.clip_nodes == 0 and report.narrow_range == 0  # the default descriptors are full range


def test_scales_zero_points_and_axes(exported):
    name, model, _, _, _, path, report = exported
    graph = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    quantizers = dict(model.named_modules())
    checked = 0
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        scale, zero_point = inits[node.input[1]], inits[node.input[2]]
        assert zero_point.dtype == np.int8 and not zero_point.any()
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if node.input[1].endswith(".scale") and node.input[1][:-6] in quantizers:
            q = quantizers[node.input[1][:-6]]
            expected = (q.amax.float() / 127.0).reshape(-1).numpy()
            assert np.array_equal(scale.reshape(-1), expected)  # amax / 127, bit for bit
            if q.axis is None:
                assert scale.ndim == 0
            else:
                assert scale.ndim == 1 and axis == q.axis
            checked += 1
    assert checked >= report.quantize_nodes // 2
    if name == "conv_transpose":
        axes = {n.name: next(a.i for a in n.attribute if a.name == "axis") for n in graph.node
                if n.op_type == "QuantizeLinear" and "_weight_quantizer" in n.name}
        assert axes == {"conv._weight_quantizer/QuantizeLinear": 0, "up._weight_quantizer/QuantizeLinear": 1,
                        "up1d._weight_quantizer/QuantizeLinear": 1}


@pytest.mark.parametrize("batch", [1, 5])
def test_dynamic_batch_in_onnxruntime(exported, batch):
    name, model, batches, _, _, path, report = exported
    assert report.dynamic_batch and report.dynamic_batch_check is not None
    session = value_session(str(path))
    x = torch.randn(batch, *batches[2].shape[1:])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    expected = fake_quant_outputs(model, x)
    assert out.shape == expected.shape and out.shape[0] == batch
    assert cosine(out, expected) > 0.999, name


def test_rule_reports(exported):
    name, _, _, functional, rules, _, report = exported
    if name == "resnet":
        assert functional.inserted_names == ["layer1.0.add", "layer2.0.add"]
        assert rules.disabled == ["layer1.0.add._input0_quantizer", "layer2.0.add._input0_quantizer"]
        assert rules.pairs == [("layer1.0.conv1._input_quantizer", "layer1.0.add._input1_quantizer")]
    elif name == "yolo":
        assert functional.inserted_names == ["model.1.m.0.add_1", "model.1.cat", "model.2.cat"]
        assert rules.pairs == [("model.1.cat._input_quantizer", "model.1.cv3.conv._input_quantizer"),
                               ("model.2.cat._input_quantizer", "model.2.cv2.conv._input_quantizer")]
        assert rules.disabled == []  # the bottleneck's add follows an activation: nothing to fuse into
    elif name == "transformer":
        # both attention products quantized; the residual adds stay float inside a transformer block
        assert functional.inserted_names == ["matmul", "matmul_1"]
        assert [s.operation for s in functional.skipped] == ["operator.add(x, proj)", "operator.add(add, fc2)"]
        assert rules.disabled == [] and rules.pairs == []
    else:
        assert rules.pairs == [] and rules.disabled == []
    if name == "lstm":
        assert any("unrolled" in w for w in report.warnings)
