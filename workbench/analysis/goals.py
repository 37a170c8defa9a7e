"""The goal of a fallback or ladder search, and the one rule for a metric whose FP32 value is infinite.

A tolerance is a gap to the FP32 metric. Under SQNR the FP32 model scores +inf (its outputs equal the
reference), so no gap to it can close. Rather than refuse, or read the number differently in each front end,
every caller (the library's searches, the CLI, the GUI through the session) reads such a tolerance the same
way: relative to the all-quantized model, in the direction the metric improves ("1 dB better than all-INT8"),
which makes it a target. The result keeps the target it became and a note saying so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Goal", "resolve_goal", "tolerance_meaning", "SUGGESTED_SQNR_GAIN_DB"]

# the goal a front end suggests under SQNR: 6 dB better than all-INT8, a quarter of the quantization noise's power
SUGGESTED_SQNR_GAIN_DB = 6.0


@dataclass(frozen=True)
class Goal:
    """A search goal after the rule: exactly one of ``tolerance`` and ``target`` (or neither, for a budget).

    Attributes:
        tolerance: the largest acceptable gap to FP32, in the metric's units.
        target: the value to reach.
        note: why a tolerance became a target ("" when the goal is as given).
    """

    tolerance: float | None
    target: float | None
    note: str = ""


def resolve_goal(*, tolerance: float | None, target: float | None, fp32: float, quantized: float,
                 higher_is_better: bool, metric_name: str) -> Goal:
    """The goal a search works to, given the FP32 and all-quantized values of its metric.

    Args:
        tolerance, target: the goal as the user gave it (a target given wins: it needs no FP32 value).
        fp32: the metric with every quantizer off (+inf for SQNR).
        quantized: the metric as configured (every chosen layer quantized): the search's start.
        higher_is_better: the metric's direction.
        metric_name: for the note.
    Returns:
        The goal unchanged when FP32 is finite or a target was given; otherwise the tolerance read from the
        all-quantized value: ``target = quantized + tolerance`` (``-`` when lower is better), with a note.
    Raises:
        ValueError: a tolerance where neither the FP32 nor the all-quantized value is finite (nothing to count
            it from).
    """
    if tolerance is None or target is not None or math.isfinite(fp32):
        return Goal(tolerance, target)
    if not math.isfinite(quantized):
        raise ValueError(f"The FP32 model's {metric_name} is {fp32} and the quantized model's is {quantized}, so a "
                         "tolerance has nothing to count from: give a target instead.")
    target = quantized + (tolerance if higher_is_better else -tolerance)
    note = (f"FP32 {metric_name} is {fp32}: the tolerance {tolerance:g} counts from the all-INT8 value "
            f"{quantized:.4g}, so the target is {target:.4g}")
    return Goal(None, target, note)


def tolerance_meaning(fp32_is_infinite: bool) -> str:
    """How a tolerance reads, for labels and ``--help``: the gap to FP32, or (FP32 infinite, as SQNR's) the gain
    over the all-quantized model."""
    if fp32_is_infinite:
        return "FP32 is infinite (SQNR): a tolerance counts from the all-INT8 value, as a gain to reach"
    return "the largest acceptable gap to FP32"
