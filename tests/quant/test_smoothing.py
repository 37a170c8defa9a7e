"""SmoothQuant and AWQ scales (workbench.quant.algorithms.smoothing): the formula, exactness in float, folding into the
producer only where that keeps the output, and the accuracy they buy on a block with outlier channels."""
import copy

import pytest
import torch
from torch import nn

from workbench.quant.algorithms.calibrate import calibrate, sqnr_db
from workbench.quant.algorithms.smoothing import (
    SmoothingError,
    apply_smoothing,
    int4_blockwise_fake_quant,
    plan_smoothing,
    smoothquant_scales,
)
from workbench.quant.replace import replace_to_quantization_module

OUTLIERS = [3, 17, 40]


class OutlierBlock(nn.Module):
    """A LayerNorm whose gain makes three channels ~50x larger (as LLM activations have), then a Linear."""

    def __init__(self, residual: bool = False) -> None:
        super().__init__()
        self.ln, self.fc, self.residual = nn.LayerNorm(64), nn.Linear(64, 64), residual

    def forward(self, x):
        h = self.ln(x)
        y = self.fc(h)
        return y + h if self.residual else y


def outlier_block(residual: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = OutlierBlock(residual).eval()
    with torch.no_grad():
        model.ln.weight[OUTLIERS] = 50.0
        model.fc.weight[:, OUTLIERS] *= 0.1
    return model


def batches():
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(8, 16, 64, generator=generator) for _ in range(4)]


def quantized(model, items=None, calibrate_it=True):
    q = copy.deepcopy(model)
    replace_to_quantization_module(q)
    if items:
        apply_smoothing(q, items)
    if calibrate_it:
        calibrate(q, batches(), method="max", num_batches=None)
    return q


def output_sqnr(reference_model, model):
    with torch.no_grad():
        ref = torch.cat([reference_model(b) for b in batches()])
        out = torch.cat([model(b) for b in batches()])
    return sqnr_db(ref, out)


def test_scales_follow_the_smoothquant_formula_and_dead_channels_keep_1():
    act = torch.tensor([4.0, 0.0, 9.0])
    weight = torch.tensor([1.0, 2.0, 0.25])
    scales = smoothquant_scales(act, weight, 0.5)
    assert torch.allclose(scales, torch.tensor([2.0, 1.0, 6.0]))
    assert torch.allclose(smoothquant_scales(act, weight, 1.0), torch.tensor([4.0, 1.0, 9.0]))
    with pytest.raises(SmoothingError, match=r"alpha must be in \[0, 1\]"):
        smoothquant_scales(act, weight, 1.5)


def test_smoothquant_lifts_an_outlier_block_from_12_db_to_over_30_and_folds_into_the_layernorm():
    model = outlier_block()
    items = plan_smoothing(model, ["fc"], batches(), alpha=0.5)
    assert [i.layer for i in items] == ["fc"] and items[0].folded_into == "ln"
    # the outlier channels get the largest scales: their range moves into the weight
    assert set(items[0].scales.topk(3).indices.tolist()) == set(OUTLIERS)
    plain = output_sqnr(model, quantized(model))
    smoothed = output_sqnr(model, quantized(model, items))
    assert plain < 15 and smoothed > 30, (plain, smoothed)


def test_smoothing_is_exact_in_float_and_leaves_the_float_model_alone():
    model = outlier_block()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    items = plan_smoothing(model, ["fc"], batches(), alpha=0.8)
    q = quantized(model, items, calibrate_it=False)
    for module in q.modules():
        if type(module).__name__ == "TensorQuantizer":
            module.disable()
    assert output_sqnr(model, q) > 100  # the same function, up to float rounding
    assert not torch.equal(q.fc.weight, model.fc.weight)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_producer_whose_output_is_read_elsewhere_is_not_folded_into():
    model = outlier_block(residual=True)  # y + h: 1/s on the LayerNorm would change the residual
    items = plan_smoothing(model, ["fc"], batches(), alpha=0.5)
    assert items[0].folded_into is None
    q = quantized(model, items, calibrate_it=False)
    assert q.fc._input_quantizer.pre_quant_scale is not None
    assert torch.allclose(q.fc._input_quantizer.pre_quant_scale, 1 / items[0].scales)
    for module in q.modules():
        if type(module).__name__ == "TensorQuantizer":
            module.disable()
    assert output_sqnr(model, q) > 100


def test_layers_reading_one_tensor_share_their_scales():
    class QKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.q, self.k = nn.LayerNorm(32), nn.Linear(32, 16), nn.Linear(32, 8)

        def forward(self, x):
            h = self.ln(x)
            return torch.cat([self.q(h), self.k(h)], -1)

    model = QKV().eval()
    items = plan_smoothing(model, ["q", "k"], [torch.randn(4, 32)], alpha=0.5)
    assert {i.folded_into for i in items} == {"ln"}
    assert torch.equal(items[0].scales, items[1].scales)


def test_awq_search_lowers_the_int4_output_error_and_the_block_quantizer_matches_a_reference():
    weight = torch.tensor([[0.7, -1.4, 0.1, 0.0], [3.0, 1.0, -2.0, 0.5]])
    expected = torch.stack([torch.round(b / (b.abs().max() / 7)).clamp(-8, 7) * (b.abs().max() / 7)
                            for b in weight.reshape(-1, 2)]).reshape(2, 4)
    assert torch.allclose(int4_blockwise_fake_quant(weight, block_size=2), expected)
    model = outlier_block()
    items = plan_smoothing(model, ["fc"], batches(), method="awq", block_size=16)
    assert items[0].method == "awq" and 0 <= items[0].alpha < 1
    assert items[0].error_after <= items[0].error_before


def test_bad_requests_are_refused_with_the_layer_named():
    model = outlier_block()
    with pytest.raises(SmoothingError, match="ln: smoothing applies to Linear layers"):
        plan_smoothing(model, ["ln"], batches())
    with pytest.raises(SmoothingError, match="alpha must be a number in"):
        plan_smoothing(model, ["fc"], batches(), alpha=2)
    with pytest.raises(SmoothingError, match="Unknown smoothing method 'gptq'"):
        plan_smoothing(model, ["fc"], batches(), method="gptq")
    items = plan_smoothing(model, ["fc"], batches())
    items[0].scales = items[0].scales[:10]
    with pytest.raises(SmoothingError, match="fc: 10 smoothing scales recorded, the weight has 64"):
        apply_smoothing(quantized(model, calibrate_it=False), items)
