"""Every weight GEMM of real model code is quantized, or listed float with a reason and counted (issue 23)."""
import onnx
import pytest
import torch
from shapes import Conv1D, GPTBlockish, WithUnknownGemm

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.export.gemms import weight_gemms
from workbench.graph import describe_model
from workbench.graph.prepare import prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.tensorrt_rules import output_channel_axis, tensorrt_check
from workbench.quant.nn import QuantConv1D


def calibrated(model, x):
    model, report = prepare_for_tensorrt(model.eval(), example_inputs=(x,))
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    return model, report


def test_conv1d_as_transformers_writes_it_is_quantized_per_output_column():
    layer = Conv1D(6, 4)
    x = torch.randn(3, 5, 4)
    reference = layer(x)
    model = torch.nn.Sequential(layer)
    report = quant.replace_to_quantization_module(model)
    assert [(r.name, r.float_type, r.quant_type) for r in report.replaced] == [("0", "Conv1D", "QuantConv1D")]
    quantized = model[0]
    assert isinstance(quantized, QuantConv1D) and quantized.weight is layer.weight  # shared, not copied
    assert quantized.weight_quantizer.axis == 1
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    # one amax per output feature: the weight's columns ([in, out])
    assert tuple(quantized.weight_quantizer.amax.shape) == (1, 6)
    assert torch.allclose(quantized.weight_quantizer.amax.flatten(), layer.weight.abs().amax(0))
    with quant.disable_quantization(model):
        assert torch.equal(model(x), reference)
    assert (model(x) - reference).abs().max() < 0.05 * reference.abs().max()
    # TensorRT's axis for it is the output channel, 1; axis 0 is refused with the layout named
    assert output_channel_axis("Conv1D") == 1 and output_channel_axis("Conv1d") == 0
    assert tensorrt_check("weight", 8, 1, "QuantConv1D").ok
    assert "[in, out]" in tensorrt_check("weight", 8, 0, "Conv1D").error


def test_conv1d_exports_its_weight_dequantized_on_axis_1(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    model, _ = calibrated(GPTBlockish(), x)
    report = export_qdq_onnx(model, x, tmp_path / "g.onnx")
    proto = onnx.load(str(tmp_path / "g.onnx"))
    weight_dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear" and "c_fc._weight" in n.name]
    assert weight_dq and {a.i for n in weight_dq for a in n.attribute if a.name == "axis"} == {1}
    # c_fc, c_proj and head: every weight GEMM with Q/DQ weights, and counted as such
    assert report.weight_gemms == 3 and report.float_weight_gemms == []
    assert report.cosine > 0.999


def test_an_unknown_weight_gemm_is_listed_float_with_a_reason_and_counted_in_the_export(tmp_path):
    x = torch.randn(4, 16)
    model, prepared = calibrated(WithUnknownGemm(), x)
    listed = {layer.name: layer.reason for layer in prepared.replacement.not_quantizable}
    assert list(listed) == ["odd"]
    assert "weight GEMM left in floating point" in listed["odd"] and "16x16 'weight'" in listed["odd"]
    tree = describe_model(model)
    assert any("weight GEMM left in floating point" in note for note in tree["odd"].notes)
    report = export_qdq_onnx(model, x, tmp_path / "u.onnx")
    assert report.weight_gemms == 2 and len(report.float_weight_gemms) == 1
    assert "odd" in report.float_weight_gemms[0]
    assert any("1 of 2 weight GEMMs keep a float weight" in w for w in report.warnings)
    assert weight_gemms(onnx.load(str(tmp_path / "u.onnx"))).quantized == 1


def test_timm_linear_by_class_name_is_quantized():
    class Linear(torch.nn.Linear):  # timm.layers.linear.Linear, as timm writes it
        def forward(self, input):
            if torch.jit.is_scripting():
                return torch.nn.functional.linear(input, self.weight.to(dtype=input.dtype), bias=self.bias)
            return torch.nn.functional.linear(input, self.weight, self.bias)

    Linear.__module__, Linear.__qualname__ = "timm.layers.linear", "Linear"
    model = torch.nn.Sequential(Linear(4, 3))
    report = quant.replace_to_quantization_module(model)
    assert [r.quant_type for r in report.replaced] == ["QuantLinear"] and not report.not_quantizable


def test_tiny_gpt2_quantizes_every_projection_and_exports(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    sample = {"input_ids": torch.randint(0, 64, (2, 8))}
    model, prepared = prepare_for_tensorrt(model, example_inputs=sample)
    replaced = {r.name: r.quant_type for r in prepared.replacement.replaced}
    # c_attn, c_proj, c_fc, mlp.c_proj per block, and lm_head: 9 of 9 weight layers
    assert len(replaced) == 9 and replaced["transformer.h.0.attn.c_attn"] == "QuantConv1D"
    assert not prepared.replacement.not_quantizable
    # no quantizer inside GELU's tanh formula
    assert not [n for n in prepared.functional.inserted_names if ".act" in n]
    assert any(s.owner == "transformer.h.0.mlp.act" and "elementwise formula" in s.reason
               for s in prepared.functional.skipped)
    calibrate(model, [sample], num_batches=1, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, sample, tmp_path / "gpt2.onnx")  # input_ids only: exported at all
    assert report.weight_gemms == 9 and not report.float_weight_gemms and report.cosine > 0.999
    assert report.exporter == "dynamo"  # never the TorchScript fallback for an opset conversion
    if report.opset != report.requested_opset:
        assert any(f"opset {report.opset} instead of the requested" in w for w in report.warnings)
