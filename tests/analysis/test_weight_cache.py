"""The fake-quantized weight cache of sensitivity passes: same bits as quantizing again, and never stale."""
import torch
from analysis_models import make_batches, quantized
from torch import nn

from workbench.analysis.weight_cache import WeightQuantCache
from workbench.quant.algorithms.snapshot import all_quantizers


def _weight_quantizers(model):
    return [m._weight_quantizer for m in model.modules() if hasattr(m, "_weight_quantizer")]


def test_cached_weights_give_the_same_bits_and_follow_amax_flags_and_weight_changes():
    batches = make_batches()
    torch.manual_seed(0)
    model = quantized(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 4)),
                      batches)
    x = batches[0]
    with torch.no_grad():
        expected = model(x)
        quantizers = _weight_quantizers(model)
        first = quantizers[0]
        with WeightQuantCache(all_quantizers(model)) as cache:
            assert torch.equal(model(x), expected)
            assert cache.hits == 0
            assert torch.equal(model(x), expected)  # second pass: every weight quantizer answers from memory
            assert cache.hits == len(quantizers)
            # a new amax is seen at once
            first.amax = first.amax * 0.5
            changed = model(x)
            first_hits = cache.hits
        assert first.__dict__.get("forward") is None  # the class's forward again
        reference_changed = model(x)
        assert torch.equal(changed, reference_changed) and not torch.equal(changed, expected)
        assert first_hits == 2 * len(quantizers) - 1
    with torch.no_grad(), WeightQuantCache(all_quantizers(model)):
        model(x)
        first._disabled = True  # a switched-off quantizer passes the weight through
        assert torch.equal(model(x), _run_fresh(model, x))
        first._disabled = False
        next(model.parameters()).mul_(2)  # the weight itself edited in place
        assert torch.equal(model(x), _run_fresh(model, x))


def _run_fresh(model, x):
    """The model's output without any cache: every quantizer's class forward."""
    saved = {q: q.__dict__.pop("forward") for q in all_quantizers(model) if "forward" in q.__dict__}
    try:
        return model(x)
    finally:
        for q, forward in saved.items():
            q.forward = forward
