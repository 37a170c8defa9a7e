"""Which experts of a mixture-of-experts layer no calibration token was routed to.

A :class:`~workbench.quant.nn.QuantExperts` layer's ``down_proj`` input quantizer is shared by its experts and
sees only the activations of the tokens routed to each: an expert that no calibration token picked contributed
nothing to its amax (its weight quantizers are calibrated on the weight, so they are reached anyway). Calibration
counts the routing while it collects and names such experts in its warnings, so the user can add data.
"""
from __future__ import annotations

from torch import nn

from workbench.quant.nn.modules.quant_experts import QuantExperts

__all__ = ["start_routing_counts", "unrouted_experts_warnings"]


def start_routing_counts(model: nn.Module) -> None:
    """Start counting the tokens routed to each expert of every QuantExperts layer of ``model``."""
    for module in model.modules():
        if isinstance(module, QuantExperts):
            module.count_routing(start=True)


def unrouted_experts_warnings(model: nn.Module) -> list[str]:
    """Stop counting; one warning per experts layer with experts that no token was routed to (names them)."""
    warnings = []
    for name, module in model.named_modules():
        if not isinstance(module, QuantExperts):
            continue
        counts = module.count_routing(start=False)
        if counts is None or not bool(counts.sum()):
            continue  # not counted, or the layer was never run (the unreached quantizers say so already)
        missed = [str(e) for e in range(counts.numel()) if int(counts[e]) == 0]
        if missed:
            warnings.append(f"{name}: no calibration token was routed to expert(s) {', '.join(missed)} of "
                            f"{counts.numel()}; the down_proj input amax was collected without them (use more or "
                            "more varied calibration data)")
    return warnings
