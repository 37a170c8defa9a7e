"""Histogram amax searches on the FP8 E4M3 grid (``num_bits=(4, 3)``).

The integer searches of :mod:`workbench.quant.calib.amax_search` assume a uniform grid of
``max_bound + 1`` levels. E4M3 is not uniform: with ``scale = 448 / amax`` a value ``x`` becomes
``e4m3(x * scale) / scale``, so small values keep more relative precision than an integer grid gives them
and large ones less. These searches score each candidate amax on that grid, as pytorch-quantization's
histogram calibrator does for ``scaled_e4m3`` quantizers:

* mse: count-weighted squared error of fake-quantizing the bin centers;
* entropy: KL divergence between the clipped histogram and its quantized version, where the bins that
  round to one E4M3 level form a group whose mass is spread over its non-empty bins (TensorRT's
  algorithm, with E4M3 levels instead of equal-width groups).
"""
from __future__ import annotations

import numpy as np
import torch

from workbench.quant.calib.amax_search import DEFAULT_START_BIN
from workbench.quant.tensor_quant import E4M3_MAX

__all__ = ["e4m3_fake_quant", "amax_mse_e4m3", "amax_entropy_e4m3"]


def e4m3_fake_quant(values: np.ndarray | torch.Tensor, amax: float | np.ndarray | torch.Tensor) -> torch.Tensor:
    """``e4m3(values * 448 / amax) * amax / 448`` in float32 (saturating at +-amax); the plain formula the
    workbench's FP8 fake quantization is checked against."""
    x = torch.as_tensor(values, dtype=torch.float32)
    amax_t = torch.as_tensor(amax, dtype=torch.float32)
    scale = E4M3_MAX / amax_t
    q = torch.clamp(x * scale, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return q / scale


def _candidates(count: int, start_bin: int, stride: int, what: str) -> np.ndarray:
    candidates = np.arange(max(start_bin, 1), count + 1, stride, dtype=np.int64)
    if candidates.size == 0:
        raise ValueError(f"{what} search has no candidate: start_bin {start_bin} is past the histogram's {count} "
                         "bins; lower start_bin.")
    return candidates


def amax_mse_e4m3(hist: np.ndarray, edges: np.ndarray, stride: int = 1, start_bin: int = DEFAULT_START_BIN) -> float:
    """amax (a bin center) minimising the count-weighted squared error of E4M3 fake quantization of the
    bin centers; the smallest amax among ties wins."""
    counts = torch.as_tensor(np.asarray(hist, dtype=np.float64))
    edges = np.asarray(edges, dtype=np.float64)
    centers_np = (edges[1:] + edges[:-1]) / 2
    centers = torch.as_tensor(centers_np, dtype=torch.float32)
    candidates = _candidates(centers.numel() - 1, start_bin, stride, "mse")
    best_error, best_amax = np.inf, float(centers_np[candidates[-1]])
    for chunk in np.array_split(candidates, max(1, candidates.size // 64)):  # bounded memory
        amax = torch.as_tensor(centers_np[chunk], dtype=torch.float32)[:, None]
        error = ((e4m3_fake_quant(centers[None, :], amax) - centers[None, :]).double() ** 2 * counts[None, :]).sum(1)
        index = int(torch.argmin(error))
        if float(error[index]) < best_error * (1 - 1e-9):
            best_error, best_amax = float(error[index]), float(amax[index, 0])
    return best_amax


def amax_entropy_e4m3(hist: np.ndarray, edges: np.ndarray, stride: int = 1,
                      start_bin: int = DEFAULT_START_BIN) -> float:
    """amax (a bin edge) minimising the KL divergence between the histogram clipped at it and its E4M3
    quantized version; the largest among ties, as the integer search."""
    bins = np.asarray(hist, dtype=np.float64).copy()
    if bins.size > 1:
        bins[0] = bins[1]  # the zero bin is dominated by ReLU zeros, as in the integer search
    edges = np.asarray(edges, dtype=np.float64)
    n = bins.size
    candidates = _candidates(n, start_bin, stride, "entropy")
    if bins.sum() <= 0:
        return float(edges[candidates[-1]])
    centers = (edges[1:] + edges[:-1]) / 2
    divergences = np.full(candidates.size, np.inf)
    for position, i in enumerate(candidates):
        reference = bins[:i].copy()
        reference[-1] += bins[i:].sum()  # outliers clip to the last level
        if reference.sum() <= 0:
            continue
        levels = e4m3_fake_quant(centers[:i], float(edges[i])).numpy()
        # bins rounding to one level form a group: its mass spread evenly over the group's non-empty bins
        _, group = np.unique(levels, return_inverse=True)
        nonzero = (reference != 0).astype(np.float64)
        mass = np.bincount(group, weights=reference)
        members = np.bincount(group, weights=nonzero)
        expanded = np.where(nonzero > 0, mass[group] / np.maximum(members[group], 1.0), 0.0)
        p = reference / reference.sum()
        total = expanded.sum()
        if total <= 0:
            continue
        q = expanded / total
        keep = p > 0
        if np.any(q[keep] <= 0):
            continue  # a level the quantized version cannot represent
        divergences[position] = float(np.sum(p[keep] * np.log(p[keep] / q[keep])))
    finite = np.isfinite(divergences)
    if not finite.any():
        return float(edges[candidates[-1]])
    best = divergences[finite].min()
    ties = np.nonzero(finite & (divergences <= best + 1e-12 + 1e-9 * abs(best)))[0]
    return float(edges[candidates[ties[-1]]])
