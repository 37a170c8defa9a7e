"""Smoothing as a session job: which layers SmoothQuant or AWQ applies to, the scales computed on the
calibration data, and the project's records of them (:class:`~workbench.project.model.SmoothingRecord`).

Pure functions: the Session passes in the float model, the batches and the layer decisions, and stores
what they return (no reach into the Session).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from torch import nn

from workbench.project import LayerDecision
from workbench.project.model import SmoothingRecord
from workbench.quant.smoothing import SMOOTHING_METHODS, SmoothingError, plan_smoothing

__all__ = ["smoothing_layers", "compute_smoothing", "parse_alpha", "OFF"]

OFF = "off"


def parse_alpha(value: str | float | None) -> float | None:
    """``"off"`` (or None) -> None; a number in [0, 1] -> that number; anything else: SmoothingError."""
    if value is None or (isinstance(value, str) and value.strip().lower() == OFF):
        return None
    try:
        alpha = float(value)
    except (TypeError, ValueError):
        raise SmoothingError(f"SmoothQuant's alpha must be a number in [0, 1] or 'off', got {value!r}.") from None
    if not 0.0 <= alpha <= 1.0:
        raise SmoothingError(f"SmoothQuant's alpha must be in [0, 1] (0.5 is the paper's default), got {alpha:g}.")
    return alpha


def _weight_bits(decision: LayerDecision) -> object:
    return (decision.weight_desc or {}).get("num_bits", 8)


def smoothing_layers(quantized: nn.Module, decisions: Mapping[str, LayerDecision], method: str) -> list[str]:
    """The layers ``method`` applies to, in model order: quantized Linear layers whose input is quantized
    (SmoothQuant) or whose weights are 4-bit (AWQ, for INT4 weight-only layers)."""
    if method not in SMOOTHING_METHODS:
        raise SmoothingError(f"Unknown smoothing method {method!r}; choose one of {', '.join(SMOOTHING_METHODS)}.")
    chosen = []
    for name, module in quantized.named_modules():
        decision = decisions.get(name)
        if decision is None or not decision.quantize or not isinstance(module, nn.Linear):
            continue
        four_bit = _weight_bits(decision) == 4
        quantizer = getattr(module, "_input_quantizer", None)
        input_on = quantizer is not None and quantizer.is_enabled and quantizer.is_quant_enabled
        if method == "awq" and four_bit:
            chosen.append(name)
        elif method == "smoothquant" and not four_bit and input_on:
            chosen.append(name)
    return chosen


def compute_smoothing(base: nn.Module, layers: list[str], batches: Iterable, *, method: str, alpha: float,
                      device, block_size: int = 128) -> dict[str, SmoothingRecord]:
    """Smoothing records for ``layers`` of the float model ``base`` (see :func:`plan_smoothing`)."""
    planned = plan_smoothing(base, layers, batches, method=method, alpha=alpha, device=device,
                             block_size=block_size)
    return {item.layer: SmoothingRecord(item.layer, item.method, float(item.alpha),
                                        item.scales.detach().cpu().numpy().astype(np.float32), item.folded_into,
                                        item.error_before, item.error_after) for item in planned}
