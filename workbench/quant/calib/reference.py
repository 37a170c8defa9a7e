"""Straightforward implementations of the amax searches, one candidate per loop iteration.

Written from the algorithms (TensorRT's entropy calibration as pytorch-quantization describes it, the
count-weighted mse of fake-quantized bin centers, the cumulative percentile), for clarity rather than
speed. The fast versions in :mod:`workbench.quant.calib.histogram` are tested and benchmarked against
these; keep both in step when either changes.
"""
from __future__ import annotations

import numpy as np

from workbench.quant.calib.amax_search import DEFAULT_START_BIN
from workbench.quant.tensor_quant import max_bound_of


def entropy_reference(hist: np.ndarray, edges: np.ndarray, num_bits: int, unsigned: bool, stride: int = 1,
                      start_bin: int = DEFAULT_START_BIN) -> float:
    """amax minimising KL(reference || quantized), evaluating each candidate bin on its own."""
    bins = np.asarray(hist, dtype=np.float64).copy()
    if bins.size > 1:
        bins[0] = bins[1]
    n = bins.size
    groups = int(max_bound_of(num_bits, unsigned)) + 1  # quantization levels from 0 up
    best_divergence, best_index = np.inf, None
    last_finite_candidate = None
    for i in range(max(start_bin, 1), n + 1, stride):
        last_finite_candidate = i
        # reference: the first i bins, everything beyond folded into the last of them
        reference = bins[:i].copy()
        reference[-1] += bins[i:].sum()
        # candidate: each group of bins spreads its total evenly over its non-empty bins
        group_of = (np.arange(i) * groups) // i
        nonzero = bins[:i] > 0
        group_total = np.bincount(group_of, weights=np.where(nonzero, bins[:i], 0.0), minlength=groups)
        group_nonzero = np.bincount(group_of, weights=nonzero.astype(np.float64), minlength=groups)
        quantized = np.where(nonzero, group_total[group_of] / np.maximum(group_nonzero[group_of], 1), 0.0)
        if reference.sum() <= 0 or quantized.sum() <= 0:
            continue
        p = reference / reference.sum()
        q = quantized / quantized.sum()
        if np.any((p > 0) & (q == 0)):
            divergence = np.inf
        else:
            mask = p > 0
            divergence = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        # ties go to the larger candidate, as in TensorRT's search
        if divergence <= best_divergence and np.isfinite(divergence):
            best_divergence, best_index = divergence, i
    if best_index is None:
        if last_finite_candidate is None:
            raise ValueError("entropy needs more bins than start_bin.")
        return float(edges[last_finite_candidate])
    return float(edges[best_index])


def mse_reference(hist: np.ndarray, edges: np.ndarray, num_bits: int, unsigned: bool, stride: int = 1,
                  start_bin: int = DEFAULT_START_BIN) -> float:
    """amax (a bin center) minimising the count-weighted squared error of fake-quantized centers."""
    counts = np.asarray(hist, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    centers = (edges[1:] + edges[:-1]) / 2
    max_bound = max_bound_of(num_bits, unsigned)
    best_error, best_amax = np.inf, None
    for i in range(start_bin, centers.size, stride):
        amax = centers[i]
        step = amax / max_bound
        quantized = np.clip(np.round(centers / step), 0, max_bound) * step
        error = float(np.sum(counts * (quantized - centers) ** 2))
        if error < best_error:  # ties go to the smaller candidate
            best_error, best_amax = error, amax
    if best_amax is None:
        raise ValueError("mse needs more bins than start_bin.")
    return float(best_amax)


def percentile_reference(hist: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """The left edge of the bin in which the cumulative share of counts reaches ``percentile`` percent."""
    counts = np.asarray(hist, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        return 0.0
    running = 0.0
    for index, count in enumerate(counts):
        # accumulate shares, not counts, as pytorch-quantization does: on a histogram whose cumulative
        # share lands exactly on the percentile, the rounding of the shares decides the bin
        running += count / total
        if running >= percentile / 100:
            return float(edges[index])
    return float(edges[-1])
