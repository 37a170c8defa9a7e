"""Blockwise quantization of a 2-D weight: one amax per ``block_size`` consecutive elements along the input
dimension of each output channel (INT4 weight-only GEMMs, as TensorRT and ONNX ``DequantizeLinear`` with
``block_size`` take them).

A descriptor with ``block_size`` keeps its ``axis`` = the output-channel axis (0 for Linear's ``[out, in]``,
1 for Hugging Face Conv1D's ``[in, out]``); the blocks run along the other dimension. The quantizer works on a
3-D view of the weight in which that dimension is split into ``(blocks, block_size)``, zero-padded when the
size is not a multiple (a zero never raises a block's max); its amax then has one value per (channel, block)
and broadcasts to the view:

* axis 0: weight ``[out, in]`` -> view ``[out, blocks, block_size]``, amax ``[out, blocks, 1]``
* axis 1: weight ``[in, out]`` -> view ``[blocks, block_size, out]``, amax ``[blocks, 1, out]``
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["block_kept_axes", "block_view", "unblock", "blocks_of", "block_amax_to_scales"]


def _check(shape: torch.Size | tuple[int, ...], axis: int) -> None:
    if len(shape) != 2:
        raise ValueError(f"blockwise quantization needs a 2-D weight (a GEMM: Linear, Conv1D), got shape "
                         f"{tuple(shape)}.")
    if axis not in (0, 1, -1, -2):
        raise ValueError(f"blockwise quantization keeps axis 0 or 1 of a 2-D weight, got axis={axis}.")


def block_kept_axes(axis: int) -> tuple[int, int]:
    """The axes of the blocked view that keep their own amax (channel and block index)."""
    return (0, 1) if axis % 2 == 0 else (0, 2)


def blocks_of(size: int, block_size: int) -> int:
    """How many blocks cover ``size`` elements (the last one may be partial, as in ONNX)."""
    return math.ceil(size / block_size)


def block_view(weight: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """The 3-D blocked view of a 2-D ``weight`` (zero-padded to whole blocks); see the module text."""
    _check(weight.shape, axis)
    along = 1 - axis % 2
    size = weight.shape[along]
    count = blocks_of(size, block_size)
    pad = count * block_size - size
    if pad:
        weight = F.pad(weight, (0, pad) if along == 1 else (0, 0, 0, pad))
    if along == 1:
        return weight.reshape(weight.shape[0], count, block_size)
    return weight.reshape(count, block_size, weight.shape[1])


def unblock(blocked: torch.Tensor, shape: torch.Size | tuple[int, ...], axis: int) -> torch.Tensor:
    """The 2-D tensor of ``shape`` back from :func:`block_view`'s layout (padding dropped)."""
    along = 1 - axis % 2
    if along == 1:
        flat = blocked.reshape(blocked.shape[0], -1)
        return flat[:, : shape[1]]
    flat = blocked.reshape(-1, blocked.shape[2])
    return flat[: shape[0], :]


def block_amax_to_scales(amax: torch.Tensor, axis: int) -> torch.Tensor:
    """A block amax (``[out, blocks, 1]`` or ``[blocks, 1, out]``) as the 2-D ``[out, blocks]`` /
    ``[blocks, out]`` layout of ONNX's blocked scales (same axes as the weight)."""
    if amax.dim() != 3:
        raise ValueError(f"a block amax has 3 dimensions, got shape {tuple(amax.shape)}.")
    return amax.squeeze(2) if axis % 2 == 0 else amax.squeeze(1)
