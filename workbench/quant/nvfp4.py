"""NVFP4: FP4 E2M1 values in blocks of 16 with an FP8 E4M3 scale per block and an FP32 scale per tensor.

The format TensorRT 10.8+ builds on Blackwell for the weights and activations of GEMMs (Model Optimizer's
``NVFP4_DEFAULT_CFG``; ``num_bits=(2, 1)`` with ``block_size=16`` in the descriptor vocabulary). Two levels of
scale, from the tensor's amax ``A`` (calibrated for activations, the weight's own for weights):

* global scale ``g = A / (6 * 448)`` (FP32): the largest E2M1 value times the largest E4M3 value reaches ``A``;
* per block of 16 along the GEMM's input features: ``s = e4m3(block_amax / 6 / g)`` (saturating at 448; the
  block scale is stored in FP8), and the block's effective scale is ``s * g``;
* values ``q = e2m1(x / (s * g))`` on the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} (round to nearest, ties to the even
  code, saturating at 6), dequantized as ``q * s * g``. A block whose FP8 scale is 0 dequantizes to 0.

Activations are quantized this way at run time, block by block (TensorRT's ``TRT_FP4DynamicQuantize``), with
the calibrated global scale; weights once, at export, into an FP4 initializer and an FP8 scale initializer
(see :mod:`workbench.export.fp4`). An amax at or below 2**-24 quantizes to 0, as every other format does.

Blocks run along ``axis`` (the input features: the last axis of an activation, axis 1 of a Linear weight
``[out, in]``, axis 0 of a Hugging Face Conv1D weight ``[in, out]``); a size that is not a multiple of the
block is zero-padded (a zero never raises a block's max), as ONNX's blocked DequantizeLinear reads a partial
last block.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from workbench.quant.descriptor import E2M1, E4M3_MAX, NVFP4_BLOCK_SIZE
from workbench.quant.kernels.fake_quant import TINY_AMAX

__all__ = ["E2M1", "E2M1_MAX", "E2M1_LEVELS", "NVFP4_BLOCK_SIZE", "NVFP4_SCALE_MAX", "round_to_e2m1",
           "nvfp4_global_scale", "nvfp4_blocks", "nvfp4_fake_quant", "NVFP4FakeQuantFunction", "block_axis_of"]

E2M1_MAX = 6.0
E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # by code 0..7 (the sign is the fourth bit)
NVFP4_SCALE_MAX = E4M3_MAX  # the block scales are FP8 E4M3


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest E2M1 value, ties to the even code, saturating at +-6 (float32 out).

    The ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (the codes of 0, 1, 2 and
    4 have an even mantissa bit), as a float-to-FP4 conversion with round-to-nearest-even does.
    """
    a = x.abs()
    # the index of the level: one step for each boundary passed (<= where the lower level is the even code)
    index = ((a > 0.25).to(torch.int64) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5)
             + (a > 5.0))
    levels = torch.tensor(E2M1_LEVELS, dtype=torch.float32, device=x.device)
    magnitude = levels[index]
    magnitude = torch.where(torch.isnan(a), a, magnitude)
    return torch.copysign(magnitude, x)


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """The FP32 per-tensor scale ``amax / (6 * 448)``; 0 for an amax at or below 2**-24 (everything -> 0)."""
    amax = amax.detach().to(torch.float32).reshape(())
    return torch.where(amax <= TINY_AMAX, torch.zeros_like(amax), amax / (E2M1_MAX * NVFP4_SCALE_MAX))


def block_axis_of(ndim: int, channel_axis: int | None) -> int:
    """The axis the blocks run along: the last one for an activation (``channel_axis`` None), the other axis
    of a 2-D weight whose output channels are ``channel_axis``."""
    if channel_axis is None:
        return ndim - 1
    if ndim != 2:
        raise ValueError(f"NVFP4 weights are 2-D GEMM weights (Linear, Conv1D), got {ndim} dimensions.")
    return 1 - channel_axis % 2


def _blocked(x: torch.Tensor, axis: int, block_size: int) -> tuple[torch.Tensor, int]:
    """``x`` with ``axis`` moved last, zero-padded to whole blocks and split into ``[..., blocks, block_size]``."""
    moved = x.movedim(axis, -1)
    size = moved.shape[-1]
    pad = -size % block_size
    if pad:
        moved = F.pad(moved, (0, pad))
    return moved.reshape(*moved.shape[:-1], -1, block_size), size


def _unblocked(blocked: torch.Tensor, size: int, axis: int) -> torch.Tensor:
    flat = blocked.reshape(*blocked.shape[:-2], -1)[..., :size]
    return flat.movedim(-1, axis)


def nvfp4_blocks(x: torch.Tensor, global_scale: torch.Tensor, block_size: int = NVFP4_BLOCK_SIZE,
                 axis: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The E2M1 values (float32, on the grid, in ``x``'s layout) and the FP8 block scales (``torch.float8_e4m3fn``,
    ``x``'s layout with ``axis`` cut to the number of blocks) of ``x`` quantized with ``global_scale``.

    What TensorRT's ``TRT_FP4DynamicQuantize`` outputs, and what the export writes for a weight.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
    axis = axis % x.dim()
    blocked, size = _blocked(x.to(torch.float32), axis, block_size)
    g = global_scale.to(torch.float32).reshape(())
    block_amax = blocked.abs().amax(dim=-1, keepdim=True)
    # g is 0 for a tiny amax: every block scale is then 0, and so is every value
    ratio = torch.where(g > 0, block_amax / E2M1_MAX / torch.where(g > 0, g, torch.ones_like(g)),
                        torch.zeros_like(block_amax))
    scale_fp8 = torch.clamp(ratio, max=NVFP4_SCALE_MAX).to(torch.float8_e4m3fn)
    effective = scale_fp8.to(torch.float32) * g  # what DequantizeLinear(scale_fp8, g) computes
    divisor = torch.where(effective > 0, effective, torch.ones_like(effective))
    values = torch.where(effective > 0, round_to_e2m1(blocked / divisor), torch.zeros_like(blocked))
    scales = scale_fp8.squeeze(-1).movedim(-1, axis)
    return _unblocked(values, size, axis), scales


def _fake_quant(x: torch.Tensor, amax: torch.Tensor, block_size: int, axis: int) -> torch.Tensor:
    g = nvfp4_global_scale(amax)
    values, scales = nvfp4_blocks(x, g, block_size, axis)
    axis = axis % x.dim()
    # (scale * g) first, as DequantizeLinear(scales, g) then DequantizeLinear(values, block scales) compute it
    block_scales = scales.to(torch.float32) * g
    expanded = torch.repeat_interleave(block_scales, block_size, dim=axis).narrow(axis, 0, x.shape[axis])
    return (values * expanded).to(x.dtype)


class NVFP4FakeQuantFunction(Function):
    """NVFP4 quantize-dequantize (see the module text); straight-through gradient, zero where |x| > amax."""

    @staticmethod
    def forward(ctx, inputs, amax, block_size=NVFP4_BLOCK_SIZE, axis=-1):
        amax = torch.as_tensor(amax, dtype=torch.float32, device=inputs.device)
        if amax.numel() != 1:
            raise ValueError(f"NVFP4 takes one (global) amax per tensor, got {amax.numel()} values.")
        if bool(amax < 0):
            raise ValueError(f"amax must be non-negative, got {float(amax)}.")
        ctx.save_for_backward(inputs, amax)
        return _fake_quant(inputs, amax, int(block_size), int(axis))

    @staticmethod
    def backward(ctx, grad_outputs):
        inputs, amax = ctx.saved_tensors
        inside = inputs.abs() <= amax.reshape(())
        return torch.where(inside, grad_outputs, torch.zeros_like(grad_outputs)), None, None, None


def nvfp4_fake_quant(inputs: torch.Tensor, amax: torch.Tensor | float, block_size: int = NVFP4_BLOCK_SIZE,
                     axis: int = -1) -> torch.Tensor:
    """NVFP4 fake quantization of ``inputs`` with the per-tensor ``amax``, blocks of ``block_size`` along ``axis``.

    Raises:
        ValueError: an amax with several values, a negative amax, or a bad block size.
    """
    if not isinstance(inputs, torch.Tensor) or not inputs.dtype.is_floating_point:
        raise TypeError("inputs must be a floating point torch.Tensor.")
    return NVFP4FakeQuantFunction.apply(inputs, amax, block_size, axis)
