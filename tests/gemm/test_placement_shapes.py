"""Quantizers only where TensorRT uses them, rules across untraceable parents, BatchNorm folding (issue 23)."""
import onnx
import torch
from shapes import Detector, GPTBlockish, MobileNetV2ish

from workbench.export import export_qdq_onnx
from workbench.export.naming import name_nodes_by_module
from workbench.graph.fold import fold_batchnorm
from workbench.graph.prepare import prepare_for_tensorrt
from workbench.graph.trace import explain_trace_error
from workbench.quant import quant_modules
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantAdd


def test_no_quantizer_inside_activation_formulas_but_on_the_residual_add():
    x = torch.randn(2, 5, 16)
    model, report = prepare_for_tensorrt(GPTBlockish().eval(), example_inputs=(x,))
    adds = {name: module for name, module in model.named_modules() if isinstance(module, QuantAdd)}
    assert list(adds) == ["add"]  # h + self.mlp(h), at the top level
    formula = [s for s in report.functional.skipped if "elementwise formula" in s.reason]
    assert [s.owner for s in formula] == ["mlp.act"]  # x + 0.044715 * x**3
    # SiLU and hard-swish written out hold no quantizer (x * sigmoid(x), x + 3.0 with a constant)
    assert not [n for n in report.functional.inserted_names if n.startswith(("silu", "hswish"))]


def test_detector_flags_bound_so_concat_shares_one_scale_with_the_conv_reading_its_input():
    x = torch.randn(2, 3, 16, 16)
    model = Detector().eval()
    folded, fold_report = fold_batchnorm(model, example_inputs=(x,))
    assert len(fold_report.folded) == 4 and not fold_report.failures  # traced with augment/profile as constants
    quantized, report = prepare_for_tensorrt(folded, example_inputs=(x,))
    assert "model.3.cat" in report.functional.inserted_names
    assert not report.rules.failures
    groups = {group.major: set(group.members) for group in report.rules.groups}
    assert groups == {"model.3.cat._input_quantizer": {"model.3.cat._input_quantizer", "model.2.conv._input_quantizer",
                                                       "model.4.conv._input_quantizer"}}
    assert quantized.model[2].conv._input_quantizer is quantized.model[3].cat._input_quantizer
    # the flags still work on the quantized model
    assert quantized(x, augment=True).shape == quantized(x).shape


def test_torchscript_names_keep_the_models_own_model_prefix(tmp_path):
    x = torch.randn(2, 3, 16, 16)
    model, _ = prepare_for_tensorrt(Detector().eval(), example_inputs=(x,))
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    export_qdq_onnx(model, x, tmp_path / "d.onnx", exporter="torchscript")
    proto = onnx.load(str(tmp_path / "d.onnx"))
    convs = [n.name for n in proto.graph.node if n.op_type == "Conv"]
    assert convs == ["model.0.conv/Conv", "model.1.conv/Conv", "model.2.conv/Conv", "model.4.conv/Conv"]
    assert [n.name for n in proto.graph.node if n.op_type == "Concat"] == ["model.3.cat/Concat"]
    assert "model.0.conv.weight" in {i.name for i in proto.graph.initializer}
    assert [n.name for n in name_nodes_by_module(proto).graph.node if n.op_type == "Conv"] == convs  # stable


def test_mobilenetv2_built_quantized_folds_every_batchnorm():
    x = torch.randn(2, 3, 32, 32)
    float_model = MobileNetV2ish().eval()
    _, report = fold_batchnorm(float_model, example_inputs=(x,))
    assert len(report.folded) == 10 and not report.skipped
    quant_modules.initialize()  # pytorch-quantization's workflow: every conv built quantized
    try:
        torch.manual_seed(1)
        built = MobileNetV2ish().eval()
    finally:
        quant_modules.deactivate()
    folded, report = fold_batchnorm(built, example_inputs=(x,))
    assert len(report.folded) == 10 and not report.skipped
    assert report.max_relative_error < 1e-5
    # calibrated layers are refused, with the reason
    calibrate(built, [x], num_batches=1, method="max", report_sqnr=False)
    _, report = fold_batchnorm(built, example_inputs=(x,))
    assert not report.folded and "calibrated already" in report.skipped[0].reason


def test_trace_errors_are_explained_in_words():
    text = explain_trace_error(ValueError("code: co_varnames is too small"))
    assert "*args/**kwargs" in text and "still quantized" in text
    text = explain_trace_error(TypeError("'Proxy' object does not support item assignment"))
    assert "writes into a tensor or a container by index" in text
