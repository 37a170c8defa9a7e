"""Real library code whose forwards torch.fx cannot trace (tiny configs, random weights): diffusers' UNet, HF
Mamba, a mixture-of-experts decoder. Their functional operations are found by running them, quantized where
TensorRT fuses them, and what stays float is named with its reason."""
import models as zoo
import pytest
import torch

from workbench import quant
from workbench.graph import prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.session.build import quantizable


def test_diffusers_unet_attention_products_and_every_skip_concat_are_quantized():
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = zoo.diffusers_unet()
    inputs = zoo.unet_inputs()
    with torch.no_grad():
        reference = model(**inputs).sample
    model, report = prepare_for_tensorrt(model, example_inputs=inputs)
    functional = report.functional
    attentions = [i.name for i in functional.attentions]
    # self (attn1) and cross (attn2) attention of every transformer block: diffusers' processors call SDPA
    assert len(attentions) == 8 and sum(name.endswith("attn2.sdpa") for name in attentions) == 4
    skips = [i.name for i in functional.concats if i.name.startswith("up_blocks.")]
    assert sorted(skips) == ["up_blocks.0.cat", "up_blocks.0.cat_1", "up_blocks.1.cat", "up_blocks.1.cat_1"]
    # each skip concat shares its scale with the shortcut convolution reading it
    concat = {a.anchor: a for a in report.rules.by_rule("concat")}
    for name in skips:
        assert any(m.endswith("conv_shortcut._input_quantizer") for m in concat[name].members)
    assert all("transformer_blocks" not in f.name for f in functional.failures)
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(**inputs).sample, reference)
    result = calibrate(model, [zoo.unet_inputs(seed=1)], num_batches=None, method="max", report_sqnr=False)
    assert not any("sdpa" in name or ".cat" in name for name in result.unused)


def test_mamba_layers_used_through_their_weight_are_float_with_the_reason_and_the_scan_stays_float():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = zoo.hf_mamba()
    ids = zoo.tokens(1, 7, vocab=64)
    with torch.no_grad():
        reference = model(ids).last_hidden_state
    model, report = prepare_for_tensorrt(model, example_inputs=(ids,))
    direct = {item.name: item.reason for item in report.replacement.not_quantizable}
    for layer in ("layers.0.mixer.conv1d", "layers.0.mixer.dt_proj", "layers.1.mixer.dt_proj"):
        assert "used directly by" in direct[layer] and "never runs" in direct[layer]
    layers = [name for name, _type, _kind in quantizable(model)]
    assert "layers.0.mixer.in_proj" in layers and "layers.0.mixer.dt_proj" not in layers  # never "quantized"
    assert type(model.layers[0].mixer.dt_proj) is torch.nn.Linear
    scan = [s for s in report.functional.skipped if "loop of tensor operations" in s.reason]
    assert scan and {s.owner for s in scan} == {"layers.0.mixer", "layers.1.mixer"}
    assert not any(i.kind == "matmul" for i in report.functional.inserted)  # no Q/DQ in the scan
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, reference)
    result = calibrate(model, [zoo.tokens(2, 7, vocab=64, seed=1)], num_batches=None, method="max",
                       report_sqnr=False)
    assert result.unused == []  # every quantizer left is reached


def test_mixture_of_experts_decoder_routes_the_same_and_quantizes_its_attention():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = zoo.hf_mixtral()
    ids = zoo.tokens(2, 6, vocab=64)
    with torch.no_grad():
        reference = model(ids).logits
    model, report = prepare_for_tensorrt(model, example_inputs=(ids,))
    assert len(report.functional.attentions) == 2 and report.functional.unquantized_attention == []
    assert "lm_head" in report.replacement.replaced_names
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(ids).logits, reference)
