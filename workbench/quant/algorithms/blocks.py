"""Blockwise (INT4) weight amax over a whole model: each block's max, or the max shrunk to the least squared
error (:func:`block_mse_amax`, a search per block). The blocks' layout (which view of a weight, which amax
shape) is :mod:`workbench.quant.kernels.blocks`.
"""
from __future__ import annotations

import torch

from workbench.quant.algorithms.precision_registry import BLOCK_METHODS, DEFAULT_BLOCK_METHOD
from workbench.quant.kernels.blocks import block_kept_axes, block_view

__all__ = ["BLOCK_METHODS", "DEFAULT_BLOCK_METHOD", "block_mse_amax", "refine_block_amax"]


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
