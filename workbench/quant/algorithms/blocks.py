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

__all__ = ["block_kept_axes", "block_view", "unblock", "blocks_of", "block_amax_to_scales", "BLOCK_METHODS",
           "DEFAULT_BLOCK_METHOD",
           "block_mse_amax"]


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


BLOCK_METHODS = ("max", "mse")  # how a block's amax is chosen: its max, or the max shrunk to the least squared error
DEFAULT_BLOCK_METHOD = "max"    # the one pytorch-quantization and Model Optimizer use; mse costs a search per block


def block_mse_amax(blocked: torch.Tensor, amax: torch.Tensor, num_bits: int, *, narrow_range: bool = False,
                   steps: int = 40, lowest: float = 0.3) -> torch.Tensor:
    """Per block, the amax among ``max * f`` (``f`` from ``lowest`` to 1 in ``steps`` steps) that gives the
    least squared error of fake-quantizing that block's values with ``num_bits`` (ONNX rounding, as the
    export computes). ``blocked`` is :func:`block_view` of the weight and ``amax`` its block max (same layout).

    Clipping a block's rare large values trades their error for a finer step for all others; on a 4-bit
    grid the trade usually pays (the idea of the clip search in AWQ and GPTQ-style weight quantizers).
    """
    from workbench.quant.tensor_quant import max_bound_of, min_bound_of  # a layer below: no import cycle at load

    if steps < 1 or not 0 < lowest <= 1:
        raise ValueError(f"steps must be >= 1 and lowest in (0, 1], got {steps} and {lowest}.")
    x = blocked.detach().float()
    base = amax.detach().float().to(x.device)
    max_bound = max_bound_of(num_bits, False)
    min_bound = min_bound_of(num_bits, False, narrow_range)
    reduce = [i for i in range(x.dim()) if base.shape[i] == 1 and x.shape[i] != 1]
    best_amax = base.clone()
    best_error = torch.full_like(base, float("inf"))
    for factor in torch.linspace(lowest, 1.0, steps).tolist():
        candidate = base * factor
        step = torch.where(candidate > 0, candidate / max_bound, torch.ones_like(candidate))
        q = torch.clamp(torch.round(x / step), min_bound, max_bound) * step
        error = ((q - x) ** 2).sum(dim=reduce, keepdim=True)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_amax = torch.where(better, candidate, best_amax)
    return best_amax


def refine_block_amax(model: torch.nn.Module, method: str) -> dict[str, torch.Tensor]:
    """Choose the amax of every calibrated blockwise weight quantizer of ``model`` by ``method`` (one of
    :data:`BLOCK_METHODS`): ``max`` keeps the calibrated block max, ``mse`` runs :func:`block_mse_amax`.
    Returns the new amax by quantizer name (``fc._weight_quantizer``)."""
    if method not in BLOCK_METHODS:
        raise ValueError(f"block method must be one of {', '.join(BLOCK_METHODS)}, got {method!r}.")
    updated: dict[str, torch.Tensor] = {}
    if method == "max":
        return updated
    for name, module in model.named_modules():
        quantizer = getattr(module, "_weight_quantizer", None)
        weight = getattr(module, "weight", None)
        if quantizer is None or getattr(quantizer, "block_size", None) is None or quantizer.amax is None \
                or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        with torch.no_grad():
            blocked = block_view(weight, quantizer.axis, quantizer.block_size)
            amax = block_mse_amax(blocked, quantizer.amax.reshape(-1).reshape(
                [blocked.shape[i] if i in block_kept_axes(quantizer.axis) else 1 for i in range(3)]),
                quantizer.num_bits, narrow_range=quantizer.narrow_range)
        quantizer.amax = amax.reshape(quantizer.amax.shape)
        updated[f"{name}._weight_quantizer" if name else "_weight_quantizer"] = quantizer.amax.detach().clone()
    return updated
