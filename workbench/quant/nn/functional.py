"""Functions used by quantized modules that torch does not provide in the needed form."""
from __future__ import annotations

import logging

import torch
from torch.autograd import Function

logger = logging.getLogger(__name__)

__all__ = ["ClipFunction", "clip"]


class ClipFunction(Function):
    """Clip with tensor bounds and learnable range (PACT-style gradient).

    ``torch.clamp`` with tensor bounds gives no gradient to the bounds; this one does: values above
    ``clip_value_max`` send their gradient to the upper bound, values below ``clip_value_min`` to the
    lower bound, as TensorFlow's ``clip_by_value`` does (https://arxiv.org/abs/1805.06085).
    """

    @staticmethod
    def forward(ctx, input, clip_value_min, clip_value_max):
        clip_value_min = torch.as_tensor(clip_value_min, dtype=input.dtype, device=input.device)
        clip_value_max = torch.as_tensor(clip_value_max, dtype=input.dtype, device=input.device)
        output = torch.max(torch.min(input, clip_value_max), clip_value_min)
        ctx.save_for_backward(input, clip_value_min, clip_value_max)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, clip_value_min, clip_value_max = ctx.saved_tensors
        min_mask = (input > clip_value_min).to(grad_output.dtype)
        max_mask = (input < clip_value_max).to(grad_output.dtype)
        grad_input = grad_output * min_mask * max_mask
        needs_min, needs_max = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if (needs_min or needs_max) and (clip_value_min.numel() != 1 or clip_value_max.numel() != 1):
            raise ValueError(f"Learnable min/max can only be scalar, got size {tuple(clip_value_min.shape)} "
                             f"and {tuple(clip_value_max.shape)}.")
        grad_min = (grad_output * (1.0 - min_mask)).sum().to(clip_value_min.dtype) if needs_min else None
        grad_max = (grad_output * (1.0 - max_mask)).sum().to(clip_value_max.dtype) if needs_max else None
        return grad_input, grad_min, grad_max


clip = ClipFunction.apply
