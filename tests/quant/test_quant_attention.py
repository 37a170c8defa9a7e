"""QuantMatMul, QuantSDPA, QuantMultiheadAttention and the transformer layers without fused paths."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench import quant
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.quant.nn import (
    QuantLinear,
    QuantMatMul,
    QuantMultiheadAttention,
    QuantSDPA,
    QuantTransformerEncoder,
    QuantTransformerEncoderLayer,
    TensorQuantizer,
)


def _observe_only(module: nn.Module) -> None:
    """Quantizers that see every tensor but change none: the explicit computation, unquantized."""
    for q in module.modules():
        if isinstance(q, TensorQuantizer):
            q.disable_quant()
            q.enable_calib()


def _qkv(batch=2, heads=4, length=5, source=7, dim=8, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, dim, generator=g)
    k = torch.randn(batch, kv_heads or heads, source, dim, generator=g)
    v = torch.randn(batch, kv_heads or heads, source, dim, generator=g)
    return q, k, v


def test_quant_matmul_ops_and_descriptor_checks():
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 6)
    bias = torch.randn(3, 4, 6)
    for op, expected in (("matmul", a @ b), ("bmm", torch.bmm(a, b))):
        module = QuantMatMul(op=op)
        module._input0_quantizer.disable()
        module._input1_quantizer.disable()
        assert torch.equal(module(a, b), expected)
    module = QuantMatMul(op="baddbmm")
    module._input0_quantizer.disable()
    module._input1_quantizer.disable()
    assert torch.equal(module(a, b, bias=bias, beta=0.5, alpha=2.0), torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0))
    with pytest.raises(ValueError, match="op must be one of"):
        QuantMatMul(op="conv2d")
    # an einsum that is a batched matrix product (MaxViT's q k^T): exactly torch.einsum with the quantizers off,
    # a quantized matmul of the operands laid out for it with them on
    equation = "b i d, b j d -> b i j"
    module = QuantMatMul(op="einsum", equation=equation)
    k = torch.randn(3, 6, 5)
    assert not torch.equal(module(a, k), torch.einsum(equation, a, k))
    assert torch.allclose(module(a, k), torch.einsum(equation, a, k), atol=0.1)
    module._input0_quantizer.disable()
    module._input1_quantizer.disable()
    assert torch.equal(module(a, k), torch.einsum(equation, a, k))
    for refused in (None, "bij,bjk,bkl->bil", "bii->bi"):
        with pytest.raises(ValueError, match="not a batched matrix product"):
            QuantMatMul(op="einsum", equation=refused)
    with pytest.raises(ValueError, match="per tensor"):
        QuantMatMul(quant.QuantDescriptor(axis=0))
    quantized = QuantMatMul()(a, b)  # dynamic range: close to, not equal to, the float product
    assert not torch.equal(quantized, a @ b) and torch.allclose(quantized, a @ b, atol=0.1)


def test_sdpa_off_is_exactly_torch_and_the_explicit_path_matches_it():
    q, k, v = _qkv()
    module = QuantSDPA()
    for q_ in module.quantizers():
        q_.disable()
    mask = torch.randn(5, 7)
    assert torch.equal(module(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    _observe_only(module)
    cases = [dict(), dict(attn_mask=mask), dict(attn_mask=mask > 0), dict(scale=0.3),
             dict(is_causal=True)]
    for kwargs in cases:
        qq, kk, vv = (q, k[..., :5, :], v[..., :5, :]) if kwargs.get("is_causal") else (q, k, v)
        expected = F.scaled_dot_product_attention(qq, kk, vv, **kwargs)
        assert torch.allclose(module(qq, kk, vv, **kwargs), expected, atol=1e-5), kwargs
    gq, gk, gv = _qkv(kv_heads=2)
    expected = F.scaled_dot_product_attention(gq, gk, gv, enable_gqa=True)
    assert torch.allclose(module(gq, gk, gv, enable_gqa=True), expected, atol=1e-5)


def test_sdpa_quantizes_all_four_tensors_after_calibration():
    q, k, v = _qkv(source=5)

    class Stacked(nn.Module):  # one tensor per batch, as calibration feeds it
        def __init__(self):
            super().__init__()
            self.sdpa = QuantSDPA()

        def forward(self, x):
            return self.sdpa(x[0], x[1], x[2])

    wrapper = Stacked()
    module = wrapper.sdpa
    calibrate(wrapper, [torch.stack([q, k, v])], num_batches=None, method="max", report_sqnr=False)
    amax = {name: float(t.amax) for name, t in quantizer_names(module).items()}
    assert set(amax) == {"_q_quantizer", "_k_quantizer", "_v_quantizer", "_probs_quantizer"}
    assert 0 < amax["_probs_quantizer"] <= 1.0  # probabilities, max-calibrated: never clipped
    assert amax["_q_quantizer"] == pytest.approx(float(q.abs().max()))
    output = module(q, k, v)
    exact = F.scaled_dot_product_attention(q, k, v)
    assert not torch.equal(output, exact)
    assert F.cosine_similarity(output.flatten(), exact.flatten(), dim=0) > 0.99


MHA_CASES = [
    dict(batch_first=False), dict(batch_first=True), dict(batch_first=True, kdim=6, vdim=10),
    dict(batch_first=False, bias=False), dict(batch_first=True, add_bias_kv=True, add_zero_attn=True),
]


@pytest.mark.parametrize("options", MHA_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_quantized_mha_equals_float_mha(options):
    torch.manual_seed(0)
    float_mha = nn.MultiheadAttention(16, 4, **options).eval()
    quant_mha = QuantMultiheadAttention.from_float(float_mha)
    assert quant_mha.in_proj_bias is float_mha.in_proj_bias and isinstance(quant_mha.out_proj, QuantLinear)
    batch_first = options["batch_first"]
    length, source, batch = 5, 7, 2
    query = torch.randn(batch, length, 16) if batch_first else torch.randn(length, batch, 16)
    kshape = (batch, source) if batch_first else (source, batch)
    key = torch.randn(*kshape, options.get("kdim", 16))
    value = torch.randn(*kshape, options.get("vdim", 16))
    padding = torch.zeros(batch, source, dtype=torch.bool)
    padding[0, -2:] = True
    float_mask = torch.randn(length, source)
    calls = [dict(), dict(key_padding_mask=padding), dict(attn_mask=float_mask),
             dict(attn_mask=float_mask > 0.5, key_padding_mask=padding), dict(need_weights=False),
             dict(average_attn_weights=False), dict(attn_mask=torch.randn(batch * 4, length, source))]
    for q_ in quant_mha.modules():  # disabled: the float module's own forward, bit for bit
        if isinstance(q_, TensorQuantizer):
            q_.disable()
    for kwargs in calls:
        expected, actual = float_mha(query, key, value, **kwargs), quant_mha(query, key, value, **kwargs)
        assert torch.equal(actual[0], expected[0])
    _observe_only(quant_mha)  # the explicit computation
    for kwargs in calls:
        expected, actual = float_mha(query, key, value, **kwargs), quant_mha(query, key, value, **kwargs)
        assert torch.allclose(actual[0], expected[0], atol=1e-5), kwargs
        if expected[1] is None:
            assert actual[1] is None
        else:
            assert torch.allclose(actual[1], expected[1], atol=1e-6), kwargs
    if "kdim" not in options:  # self-attention, and unbatched input
        x = query
        assert torch.allclose(quant_mha(x, x, x)[0], float_mha(x, x, x)[0], atol=1e-5)
        single = x[:, 0] if not batch_first else x[0]
        assert torch.allclose(quant_mha(single, single, single)[0], float_mha(single, single, single)[0], atol=1e-5)


def test_mha_and_encoder_layers_are_swapped_and_every_quantizer_is_reached():
    torch.manual_seed(0)

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(40, 16)
            layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2)
            self.head = nn.Linear(16, 3)

        def forward(self, ids, padding=None):
            return self.head(self.encoder(self.embed(ids), src_key_padding_mask=padding))

    model = Tokens().eval()
    ids = torch.randint(0, 40, (2, 6))
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, -2:] = True
    with torch.no_grad():
        reference = model(ids, padding)
    report = quant.replace_to_quantization_module(model)
    replaced = {r.name: r.quant_type for r in report.replaced}
    assert replaced["encoder"] == "QuantTransformerEncoder"
    assert replaced["encoder.layers.0"] == "QuantTransformerEncoderLayer"
    assert replaced["encoder.layers.0.self_attn"] == "QuantMultiheadAttention"
    assert isinstance(model.encoder.layers[1].self_attn.out_proj, QuantLinear)
    result = calibrate(model, [(ids, padding)], num_batches=None, method="max", report_sqnr=False)
    assert result.unused == []
    names = set(result.quantizers)
    assert {"encoder.layers.0.self_attn.sdpa._probs_quantizer", "encoder.layers.1.linear2._input_quantizer",
            "encoder.layers.0.self_attn._weight_quantizer"} <= names
    with torch.no_grad():
        quantized = model(ids, padding)
        with quant.disable_quantization(model):
            unquantized = model(ids, padding)
    # torch's nested-tensor path zeroes padded positions, its explicit path does not: compare the tokens
    keep = ~padding
    assert torch.allclose(unquantized[keep], reference[keep], atol=1e-5)
    assert not torch.equal(quantized[keep], reference[keep])
    assert F.cosine_similarity(quantized[keep].flatten(), reference[keep].flatten(), dim=0) > 0.98
    assert isinstance(model.encoder, QuantTransformerEncoder) and not model.encoder.use_nested_tensor
    assert isinstance(model.encoder.layers[0], QuantTransformerEncoderLayer)


def test_an_ignored_attention_inside_a_quantized_mha_stays_float():
    from workbench.graph import prepare_for_tensorrt

    model = nn.Sequential(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)).eval()
    model, report = prepare_for_tensorrt(model, ignore_policy=[r"^0\.self_attn\.sdpa$"])
    sdpa = model[0].self_attn.sdpa
    assert all(q._disabled for q in sdpa.quantizers())
    assert "0.self_attn.sdpa" in report.replacement.ignored_names
    assert not model[0].self_attn._input_quantizer._disabled


def test_quantized_mha_shares_the_quantized_module_vocabulary():
    mha = QuantMultiheadAttention(8, 2)
    assert mha.input_quantizer is mha._input_quantizer and mha.weight_quantizer is mha._weight_quantizer
    with pytest.raises(ValueError, match="must be an instance of QuantDescriptor"):
        QuantMultiheadAttention.set_default_quant_desc_input("8 bits")
    assert isinstance(QuantMultiheadAttention.default_quant_desc_input, quant.QuantDescriptor)
