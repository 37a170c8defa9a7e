"""Issue 35, point 7: SmoothQuant and AWQ handle Hugging Face's Conv1D (GPT-2's projections, a Linear whose weight
is stored [in, out]) instead of skipping it."""
import sys
from pathlib import Path

import pytest
import torch

from workbench.quant.algorithms.smoothing import apply_smoothing, plan_smoothing

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models  # noqa: E402


@pytest.mark.parametrize("method", ["smoothquant", "awq"])
def test_gpt2_conv1d_layers_are_smoothed_and_compute_the_same(method):
    model = models.hf_gpt2("eager")
    with torch.no_grad():  # outlier channels in the first LayerNorm, as LLM activations have
        model.transformer.h[0].ln_1.weight[[3, 17]] = 40.0
    layers = ["transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_fc"]
    batches = [models.tokens(2, 8, 64, seed) for seed in range(2)]
    planned = plan_smoothing(model, layers, batches, method=method, alpha=0.5, device=torch.device("cpu"))
    assert [item.layer for item in planned] == layers
    by_layer = {item.layer: item for item in planned}
    attn = by_layer["transformer.h.0.attn.c_attn"]
    assert attn.scales.numel() == 32 and attn.folded_into == "transformer.h.0.ln_1"
    if method == "smoothquant":  # the outlier channels get the largest scales
        assert set(torch.topk(attn.scales, 2).indices.tolist()) == {3, 17}
    # applied to a copy, the model computes what it did (W * s on the [in, out] rows, 1/s folded into ln_1)
    import copy

    smoothed = copy.deepcopy(model)
    apply_smoothing(smoothed, planned)
    ids = models.tokens(2, 8, 64, 5)
    with torch.no_grad():
        before, after = model(ids).logits, smoothed(ids).logits
    assert torch.allclose(before, after, atol=1e-4, rtol=1e-4)
    assert not torch.equal(smoothed.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.weight)
