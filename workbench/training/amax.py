"""Learnable amax for chosen quantizers during a fine-tune, through the core's ``Clip`` stage.

The reference advises against changing the quantization scale while training, so amax stays fixed
unless the user names quantizers to learn. Those get the core's learnable range
(``learn_amax`` / :class:`~workbench.quant.nn.Clip`), started at the calibrated amax, and kept
symmetric after every step (the exported Q/DQ pair is symmetric: only ``max(-min, max)`` survives).
When the fine-tune ends, the learned value is written back into the ``_amax`` buffer and the clip
stage removed, so the model is an ordinary calibrated model again: it saves, reloads and exports
like any other. The core's clip learns one scalar, so per-channel quantizers (weights) are skipped
with a reason.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.quant.algorithms.snapshot import is_quantizing, quantizer_names
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["LearnedAmax", "start_learning_amax", "finish_learning_amax"]

_SMALLEST_AMAX = 2.0 ** -24  # below this the core quantizes to zero: keep a learned range above it


@dataclass
class LearnedAmax:
    """The quantizers whose amax a fine-tune learns (by object, with every name it has)."""

    quantizers: dict[str, TensorQuantizer] = field(default_factory=dict)  # first name -> quantizer
    names: dict[str, list[str]] = field(default_factory=dict)             # first name -> all its names
    before: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)                 # name -> reason

    def parameters(self) -> list[nn.Parameter]:
        return [p for q in self.quantizers.values() for p in (q.clip.clip_value_min, q.clip.clip_value_max)]

    @torch.no_grad()
    def symmetrize(self) -> None:
        """Keep each learned range symmetric and positive after an optimizer step."""
        for q in self.quantizers.values():
            amax = torch.maximum(-q.clip.clip_value_min, q.clip.clip_value_max).clamp_min(_SMALLEST_AMAX)
            q.clip.clip_value_min.copy_(-amax)
            q.clip.clip_value_max.copy_(amax)

    def current(self) -> dict[str, float]:
        return {name: float(torch.maximum(-q.clip.clip_value_min, q.clip.clip_value_max))
                for name, q in self.quantizers.items()}


def start_learning_amax(model: nn.Module, patterns: str | Iterable[str] | None) -> LearnedAmax:
    """Make the amax of the quantizers whose name matches any regex in ``patterns`` (``re.search``) learnable.

    Quantizers that are per-channel, disabled, not quantizing or not calibrated are listed in
    ``skipped`` with the reason. Raises ValueError when a pattern is not a valid regex.
    """
    learned = LearnedAmax()
    if patterns is None:
        return learned
    if isinstance(patterns, str):
        patterns = [patterns]
    try:
        compiled = [re.compile(p) for p in patterns if p]
    except re.error as error:
        raise ValueError(f"learn_amax: {error.pattern!r} is not a valid regular expression ({error}).") from None
    if not compiled:
        return learned
    by_object: dict[int, str] = {}
    for name, q in quantizer_names(model).items():
        if not any(p.search(name) for p in compiled):
            continue
        if id(q) in by_object:  # shared: learned once, under its first name
            learned.names[by_object[id(q)]].append(name)
            continue
        amax = q.amax
        reason = None
        if not is_quantizing(q):
            reason = "the quantizer is off"
        elif amax is None:
            reason = "not calibrated"
        elif amax.numel() != 1:
            reason = "per-channel amax: only a per-tensor range can be learned"
        elif q.learn_amax:
            reason = "it learns its amax already"
        elif isinstance(q.num_bits, tuple):
            reason = "FP8 quantizers keep their amax"
        if reason is not None:
            learned.skipped[name] = reason
            continue
        value = float(amax.detach().reshape(()))
        q.start_learning_amax(value)  # the core's learnable range, started from the calibrated value
        by_object[id(q)] = name
        learned.quantizers[name] = q
        learned.names[name] = [name]
        learned.before[name] = value
    if not learned.quantizers and not learned.skipped:
        raise ValueError(f"learn_amax: no quantizer name matches {', '.join(p.pattern for p in compiled)}.")
    return learned


@torch.no_grad()
def finish_learning_amax(learned: LearnedAmax) -> dict[str, float]:
    """Write each learned range into its quantizer's ``_amax`` and remove the clip stage.

    Returns the new amax per quantizer (first name).
    """
    values = learned.current()
    for name, q in learned.quantizers.items():
        value = max(values[name], _SMALLEST_AMAX)
        amax = q.amax
        amax.copy_(torch.full_like(amax, value))
        q.stop_learning_amax()
        values[name] = value
    return values
