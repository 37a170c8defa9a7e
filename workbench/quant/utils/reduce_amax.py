"""Absolute maximum of a tensor over some axes, numpy style."""
from __future__ import annotations

import torch


def reduce_amax(input: torch.Tensor, axis=None, keepdims: bool = True) -> torch.Tensor:
    """Absolute maximum of ``input`` over ``axis`` (None: all axes), without gradient.

    Args:
        input: a tensor.
        axis: None, an int, or a tuple/list of ints in ``[-rank, rank)``.
        keepdims: keep reduced axes with size 1. A result of one element is returned 0-d, as in the
            original.

    Raises:
        ValueError: an axis is out of range, or more axes than the tensor has were given.
    """
    with torch.no_grad():
        output = input.abs()
        if axis is None:
            return torch.max(output)
        if isinstance(axis, int):
            if not -input.dim() <= axis < input.dim():
                raise ValueError(f"axis {axis} is out of range for a tensor with {input.dim()} dimensions.")
            output, _ = torch.max(output, dim=axis, keepdim=keepdims)
            return output
        axes = list(axis)
        if len(axes) > input.dim():
            raise ValueError("Cannot reduce more axes than tensor's dim.")
        for a in axes:
            if not -input.dim() <= a < input.dim():
                raise ValueError(f"axis {a} is out of range for a tensor with {input.dim()} dimensions.")
        if axes:
            output = torch.amax(output, dim=axes, keepdim=True)
        if not keepdims or output.numel() == 1:
            output = output.squeeze()
        return output
