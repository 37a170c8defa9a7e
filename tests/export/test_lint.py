"""Fusion lint: each hazard planted in a small model, found in its QDQ export, with the fix as data."""
import onnx
import torch
from torch import nn

from workbench.export import export_qdq_onnx
from workbench.export.lint import FIX_ACTIONS, LINT_KINDS, lint_qdq_graph
from workbench.quant import QuantDescriptor
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantConv2d, TensorQuantizer
from workbench.quant.nn.modules.quant_instancenorm import QuantInstanceNorm2d
from workbench.quant.nn.modules.quant_ops import QuantAdd

PER_TENSOR = QuantDescriptor(num_bits=8)


def lint(model, tmp_path, shape=(2, 16, 8, 8)):
    torch.manual_seed(0)
    model = model.eval()
    batches = [torch.randn(*shape) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    path = tmp_path / "m.onnx"
    export_qdq_onnx(model, batches[0], path)
    warnings = lint_qdq_graph(onnx.load(str(path)))
    for warning in warnings:
        assert warning.kind in LINT_KINDS and (warning.fix is None or warning.fix.action in FIX_ACTIONS)
    return warnings


def by_kind(warnings, kind):
    return [w for w in warnings if w.kind == kind]


def test_dequantize_into_an_op_without_int8_kernel(tmp_path):
    model = nn.Sequential(QuantConv2d(16, 16, 3, padding=1), nn.ReLU(), QuantInstanceNorm2d(16))
    warnings = lint(model, tmp_path)
    [found] = by_kind(warnings, "dq_into_float_op")
    assert found.modules == ["2"] and "InstanceNormalization" in found.message
    assert (found.fix.action, found.fix.targets) == ("leave_float", ("2",))
    assert by_kind(warnings, "isolated_quantized_layer") == []  # the conv's output is quantized again


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = QuantConv2d(16, 16, 3, padding=1)
        self.add = QuantAdd()

    def forward(self, x):
        return torch.relu(self.add(self.conv(x), x))


def test_residual_add_quantized_so_it_cannot_fuse(tmp_path):
    model = Residual()
    [both] = by_kind(lint(model, tmp_path), "residual_not_fusable")
    assert both.modules == ["add", "conv"] and "both operands" in both.message
    assert (both.fix.action, both.fix.targets) == ("enable_rule", ("residual",))

    model.add._input0_quantizer.disable()  # what the residual rule does: the conv's branch stays float
    assert by_kind(lint(model, tmp_path), "residual_not_fusable") == []

    model.add._input0_quantizer.enable()
    model.add._input1_quantizer.disable()  # the reverse: only the conv's branch quantized
    [reverse] = by_kind(lint(model, tmp_path), "residual_not_fusable")
    assert "reverse" in reverse.message and reverse.fix.action == "enable_rule"

    model.add._input0_quantizer.disable()  # neither: the identity branch should be quantized
    [neither] = by_kind(lint(model, tmp_path), "residual_not_fusable")
    assert (neither.fix.action, neither.fix.targets) == ("quantize", ("add",))


class Join(nn.Module):
    def __init__(self):
        super().__init__()
        self.left_quantizer = TensorQuantizer(PER_TENSOR)
        self.right_quantizer = TensorQuantizer(PER_TENSOR)

    def forward(self, a, b):
        return torch.cat([self.left_quantizer(a), self.right_quantizer(b)], 1)


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 8, 1)
        self.b = nn.Conv2d(16, 8, 1)
        self.join = Join()
        self.head = QuantConv2d(16, 16, 1)

    def forward(self, x):
        return self.head(self.join(self.a(x), 3 * self.b(x)))


def test_concat_inputs_with_different_scales_get_a_pin(tmp_path):
    [found] = by_kind(lint(TwoBranches(), tmp_path), "concat_scales_differ")
    assert found.fix.action == "pin"
    assert found.fix.targets == ("join.left_quantizer", "join.right_quantizer")
    assert "join" in found.modules


def test_a_quantized_layer_between_float_layers(tmp_path):
    model = nn.Sequential(nn.Conv2d(16, 16, 1), QuantConv2d(16, 16, 1), nn.Conv2d(16, 16, 1))
    [found] = by_kind(lint(model, tmp_path), "isolated_quantized_layer")
    assert found.modules == ["1"] and found.severity == "info"
    assert (found.fix.action, found.fix.targets) == ("leave_float", ("1",))
    # with a quantized neighbour reading its output, the layer is no longer alone
    model = nn.Sequential(nn.Conv2d(16, 16, 1), QuantConv2d(16, 16, 1), QuantConv2d(16, 16, 1))
    assert by_kind(lint(model, tmp_path), "isolated_quantized_layer") == []


def test_channel_alignment(tmp_path):
    model = nn.Sequential(QuantConv2d(3, 16, 3, padding=1), nn.ReLU(), QuantConv2d(16, 24, 1), nn.ReLU(),
                          QuantConv2d(24, 32, 1))
    found = by_kind(lint(model, tmp_path, (2, 3, 8, 8)), "misaligned_channels")
    # the RGB first layer is not flagged: TensorRT has first-layer kernels for a few input channels
    assert [(w.modules, w.severity) for w in found] == [(["2"], "info"), (["4"], "info")]
    assert "16 -> 24 channels" in found[0].message
    data = found[0].to_dict()
    assert data["fix"] == {"action": "leave_float", "targets": ["2"], "description": "leave 2 in float"}


def test_a_graph_whose_weights_stay_in_their_external_file_lints_the_same(tmp_path):
    """Lint reads a big model's graph without its weights: shapes come from the initializers' dims."""
    model = nn.Sequential(QuantConv2d(16, 24, 1), nn.ReLU(), QuantConv2d(24, 40, 1), nn.ReLU(), QuantConv2d(40, 32, 1))
    torch.manual_seed(0)
    batches = [torch.randn(2, 16, 8, 8) for _ in range(2)]
    calibrate(model.eval(), batches, num_batches=2, method="max", report_sqnr=False)
    path = tmp_path / "m.onnx"
    export_qdq_onnx(model, batches[0], path, external_data_threshold=0)  # every weight in m.onnx.data
    assert (tmp_path / "m.onnx.data").is_file()
    full = lint_qdq_graph(onnx.load(str(path)))
    graph_only = lint_qdq_graph(onnx.load(str(path), load_external_data=False))
    assert [w.to_dict() for w in graph_only] == [w.to_dict() for w in full]
    assert [w.modules for w in by_kind(full, "misaligned_channels")] == [["0"], ["2"], ["4"]]
