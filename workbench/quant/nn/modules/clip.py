"""Clip module with optionally learnable bounds."""
from __future__ import annotations

import numbers

import torch
from torch import nn
from torch.nn.parameter import Parameter

from workbench.quant.nn import functional as QF

__all__ = ["Clip"]


class Clip(nn.Module):
    """Clip a tensor to ``[clip_value_min, clip_value_max]``.

    Args:
        clip_value_min: lower bound (number or tensor).
        clip_value_max: upper bound (number or tensor).
        learn_min: make the lower bound a learnable scalar parameter initialised from ``clip_value_min``.
        learn_max: the same for the upper bound.
    """

    def __init__(self, clip_value_min, clip_value_max, learn_min: bool = False, learn_max: bool = False) -> None:
        super().__init__()
        self.clip_value_min = self._bound("clip_value_min", clip_value_min, learn_min)
        self.clip_value_max = self._bound("clip_value_max", clip_value_max, learn_max)

    @staticmethod
    def _bound(name: str, value, learn: bool):
        if not learn:
            return value
        # a plain number, as in the original (a tensor there was rejected too)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"clip_value_min/clip_value_max must be scalar for initializing learnable range: "
                             f"{name} is {value!r}; pass a float.")
        return Parameter(torch.tensor(float(value)))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return QF.clip(inputs, self.clip_value_min, self.clip_value_max)
