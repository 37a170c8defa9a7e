"""Real library code whose forwards torch.fx cannot trace (tiny configs, random weights): diffusers' UNet, HF
Mamba, a mixture-of-experts decoder. Their functional operations are found by running them, quantized where
TensorRT fuses them, and what stays float is named with its reason."""
import models as zoo
import pytest
import torch

from workbench import quant
from workbench.graph import prepare_for_tensorrt
from workbench.graph.placement import is_attention
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


def test_mamba_layers_used_through_their_weight_are_quantized_where_used_and_the_scan_stays_float():
    """The mixer uses conv1d's and dt_proj's weights without calling the layers (causal_conv1d_fn,
    ``dt_proj.weight @ x``): their weight and input quantizers run where the weights are used."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = zoo.hf_mamba()
    ids = zoo.tokens(1, 7, vocab=64)
    with torch.no_grad():
        reference = model(ids).last_hidden_state
    model, report = prepare_for_tensorrt(model, example_inputs=(ids,))
    assert report.replacement.not_quantizable == []
    layers = [name for name, _type, _kind in quantizable(model)]
    direct = ("layers.0.mixer.conv1d", "layers.0.mixer.dt_proj", "layers.1.mixer.conv1d", "layers.1.mixer.dt_proj")
    assert all(name in layers for name in direct)
    scan = [s for s in report.functional.skipped if "loop of tensor operations" in s.reason]
    assert scan and {s.owner for s in scan} == {"layers.0.mixer", "layers.1.mixer"}
    # the scan's products are no attention (TensorRT fuses none there): show and the sweep's check do not count them
    products = [s for s in scan if s.kind == "matmul"]
    assert products and not any(is_attention(s.kind, s.reason) for s in products)
    assert not any(i.kind == "matmul" for i in report.functional.inserted)  # no Q/DQ in the scan
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, reference)
    result = calibrate(model, [zoo.tokens(2, 7, vocab=64, seed=1)], num_batches=None, method="max",
                       report_sqnr=False)
    assert result.unused == []  # every quantizer is reached, those of the layers used through their weight too
    for name in direct:
        layer = model.get_submodule(name)
        assert layer._weight_quantizer.amax is not None and layer._input_quantizer.amax is not None
    with torch.no_grad():
        assert not torch.equal(model(ids).last_hidden_state, reference)
    calls = []  # each forward goes through the weight and input quantizers of the layers used through their weight
    for name in direct:
        for role in ("_weight_quantizer", "_input_quantizer"):
            model.get_submodule(f"{name}.{role}").register_forward_hook(
                lambda module, args, out, key=(name, role): calls.append(key))
    with torch.no_grad():
        model(ids)
    roles = ("_weight_quantizer", "_input_quantizer")
    assert sorted(calls) == sorted((name, role) for name in direct for role in roles)


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
    # transformers runs its experts with grouped_mm by default and the quantized experts with one linear per expert:
    # equal up to the kernels' summation order (bit-equal on AVX-512, not on an AVX2 machine)
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.allclose(model(ids).logits, reference, atol=1e-6, rtol=0)


class _FunctionalAttention(torch.nn.Module):
    """WavLM's way: four Linears whose weights go to F.multi_head_attention_forward, the layers never called."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)
        self.v_proj, self.out_proj = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)

    def forward(self, x, bias):
        x = x.transpose(0, 1)
        out, _ = torch.nn.functional.multi_head_attention_forward(
            x, x, x, x.shape[-1], self.heads, torch.empty([0]),
            torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)), None, None, False, 0.0,
            self.out_proj.weight, self.out_proj.bias, self.training, None, need_weights=True, attn_mask=bias,
            use_separate_proj_weight=True, q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight,
            v_proj_weight=self.v_proj.weight)
        return out.transpose(0, 1)


def test_layers_and_products_inside_multi_head_attention_forward_are_quantized_where_used():
    """F.multi_head_attention_forward hides four weight GEMMs and both attention products in one call (torch.fx
    keeps it whole; a torch-function mode does not see inside it): they were left float and the four layers'
    quantizers never reached. torch's own body of the function is run with its calls visible."""
    torch.manual_seed(0)
    model = _FunctionalAttention().eval()
    x, bias = torch.randn(2, 5, 16), torch.randn(4, 5, 5)
    with torch.no_grad():
        reference = model(x, bias)
    model, report = prepare_for_tensorrt(model, example_inputs=(x, bias))
    products = [i.name for i in report.functional.matmuls]
    assert products == ["matmul", "matmul_1"]  # the scores (with the bias: baddbmm) and probabilities @ V
    assert report.functional.failures == []
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(x, bias), reference)  # torch's own code: bit for bit
    result = calibrate(model, [{"x": torch.randn(2, 5, 16), "bias": bias}], num_batches=None, method="max",
                       report_sqnr=False)
    assert result.unused == []
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        layer = model.get_submodule(name)
        assert layer._weight_quantizer.amax is not None and layer._input_quantizer.amax is not None
    with torch.no_grad():
        assert not torch.equal(model(x, bias), reference)


def _window_attention(x, qkv_weight, proj_weight, heads: int):
    """torchvision's Swin in small: the GEMMs and both products inside one function that torch.fx keeps whole."""
    batch, tokens, dim = x.shape
    q, k, v = torch.nn.functional.linear(x, qkv_weight).reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4)
    attn = (q * (q.shape[-1] ** -0.5)).matmul(k.transpose(-2, -1)).softmax(dim=-1)
    return torch.nn.functional.linear(attn.matmul(v).transpose(1, 2).reshape(batch, tokens, dim), proj_weight)


torch.fx.wrap("_window_attention")


class _WrappedWindowAttention(torch.nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim, bias=False), torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return _window_attention(x, self.qkv.weight, self.proj.weight, self.heads)


def test_attention_products_inside_a_function_torch_fx_keeps_whole_are_quantized():
    """torchvision's swin_t: 0 of its 24 attention products quantized, every GEMM quantized. Its attention runs
    inside ``shifted_window_attention``, which torchvision hands to torch.fx.wrap: traced, the module shows one
    call, and the products inside it stayed float. Such a module goes to the run-time route, which sees them."""
    torch.manual_seed(0)
    model = _WrappedWindowAttention().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        reference = model(x)
    model, report = prepare_for_tensorrt(model, example_inputs=(x,))
    products = [item.name for item in report.functional.matmuls]
    assert len(products) == 2, products  # the scores and probabilities @ V
    assert report.functional.unquantized_attention == []
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(x), reference)
    result = calibrate(model, [x], num_batches=None, method="max", report_sqnr=False)
    assert result.unused == []
    for name in ("qkv", "proj"):
        assert model.get_submodule(name)._weight_quantizer.amax is not None


def test_model_code_in_a_directory_named_like_torchs_keeps_its_own_call_sites(monkeypatch):
    """torchvision's files lie in site-packages/torchvision, whose path starts with site-packages/torch: the
    run-time recorder skipped them as torch's own, every call inside shifted_window_attention took its caller's
    line, and two products on one line with no layer between read as a loop (a scan): left float. Here this test
    file stands for torchvision, torch's directory for a prefix of its path."""
    from pathlib import Path

    from workbench.graph import runtime_ops

    monkeypatch.setattr(runtime_ops, "_TORCH_DIR", str(Path(__file__).with_name("test_runtime")))
    torch.manual_seed(0)
    model = _WrappedWindowAttention().eval()
    x = torch.randn(2, 5, 16)
    model, report = prepare_for_tensorrt(model, example_inputs=(x,))
    assert len(report.functional.matmuls) == 2, report.functional.skipped
