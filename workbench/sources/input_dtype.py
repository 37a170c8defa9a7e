"""Float inputs of a bf16/fp16 model in the model's own dtype.

A model kept in bfloat16 or float16 (no float32 copy beside it) still reads float32 data: images from .npy
files, features from a data loader. ``nn.Linear`` refuses a float32 input on bf16 weights, so the model's
root module casts its floating-point inputs to its own float type on the way in (a forward pre-hook), for
every path that runs it: the sample check of ``new``, calibration, evaluation and the export's trace (where
it becomes a Cast after the graph's float32 input, which TensorRT runs in the network's precision).
Integer inputs (token ids, masks) pass unchanged.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["float_dtype_of", "cast_float_inputs", "LOW_PRECISION_DTYPES"]

LOW_PRECISION_DTYPES = (torch.bfloat16, torch.float16)


def float_dtype_of(model: nn.Module) -> torch.dtype:
    """The dtype most of the model's floating-point parameters hold (float32 when it has none)."""
    counts: dict[torch.dtype, int] = {}
    for parameter in model.parameters():
        if parameter.is_floating_point():
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + parameter.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, Mapping):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


class _CastInputs:
    """The pre-hook (a class, not a closure: a deep copy or pickle of the model keeps it)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _cast(args, self.dtype), _cast(kwargs, self.dtype)


def cast_float_inputs(model: nn.Module) -> torch.dtype:
    """Make a bf16/fp16 ``model`` cast its floating-point inputs to its dtype (once); returns that dtype."""
    dtype = float_dtype_of(model)
    if dtype in LOW_PRECISION_DTYPES and not any(isinstance(hook, _CastInputs)
                                                 for hook in model._forward_pre_hooks.values()):
        model.register_forward_pre_hook(_CastInputs(dtype), with_kwargs=True)
    return dtype
