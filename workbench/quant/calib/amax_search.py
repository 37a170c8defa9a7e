"""The amax searches over a histogram of |x|: entropy (TensorRT's KL divergence), mse and percentile.

Vectorised over all candidate bins at once using prefix sums (and C loops where the extension built),
instead of one candidate per loop iteration; they return the same amax as pytorch-quantization's
algorithms on the same histogram (see :mod:`workbench.quant.calib.reference` for the
one-candidate-at-a-time versions they are tested against). Plain numpy in, a float out: they know
nothing of calibrators or modules.
"""
from __future__ import annotations

import numpy as np
import torch

from workbench.quant.calib.methods import PERCENTILE, AmaxMethod
from workbench.quant.kernels.fake_quant import cpu_extension as cpu_kernels  # None without a C compiler: numpy is used
from workbench.quant.tensor_quant import max_bound_of

__all__ = ["amax_entropy", "amax_mse", "amax_percentile", "entropy_divergences", "mse_errors", "DEFAULT_START_BIN"]

# The first candidate bin of the entropy and mse searches (pytorch-quantization's): amax is never searched below
# start_bin / num_bins of the histogram's range.
DEFAULT_START_BIN = 128

# Relative tolerance under which two candidates' divergences or errors count as equal; the search then
# picks the candidate pytorch-quantization picks among exact ties (the last for entropy, the first for mse).
_TIE_RTOL = 1e-9
_TIE_ATOL = 1e-12


def _check_candidates(count: int, what: str, num_bins: int, start_bin: int) -> None:
    if count == 0:
        raise ValueError(f"{what} needs more bins than start_bin: the histogram has {num_bins} bins and "
                         f"start_bin is {start_bin}.")


def _pick(values: np.ndarray, prefer_last: bool) -> int | None:
    """Index of the best (smallest) value; near-equal values tie, and ties go first or last."""
    finite = np.isfinite(values)
    if not finite.any():
        return None
    best = values[finite].min()
    ties = np.nonzero(finite & (values <= best + _TIE_ATOL + _TIE_RTOL * abs(best)))[0]
    return int(ties[-1] if prefer_last else ties[0])


def entropy_divergences(bins: np.ndarray, groups: int, candidates: np.ndarray) -> np.ndarray:
    """KL divergence for each candidate bin count (numpy; see the C version in csrc/amax_search.c).

    For a candidate ``i`` the reference distribution is ``bins[:i]`` with everything beyond folded into
    the last bin; the candidate distribution spreads each of ``groups`` groups of bins evenly over its
    non-empty bins. Every sum over bins is a difference of prefix sums, so a candidate costs O(groups).
    """
    total = bins.sum()
    nonzero = bins > 0
    zero_pad = np.zeros(1)
    prefix_sum = np.concatenate([zero_pad, np.cumsum(bins)])
    prefix_count = np.concatenate([zero_pad, np.cumsum(nonzero)])
    b_log_b = np.where(nonzero, bins * np.log(np.where(nonzero, bins, 1.0)), 0.0)
    prefix_blogb = np.concatenate([zero_pad, np.cumsum(b_log_b)])

    c = candidates
    # boundaries[:, k] = first bin of group k = ceil(k * i / groups); the last column is i
    boundaries = (np.arange(groups + 1, dtype=np.int64)[None, :] * c[:, None] + groups - 1) // groups
    sums = np.diff(prefix_sum[boundaries], axis=1)
    counts = np.diff(prefix_count[boundaries], axis=1)
    group_avg = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    sum_b_log_avg = (sums * np.log(np.where(counts > 0, group_avg, 1.0))).sum(1)

    last = c - 1
    in_range = prefix_sum[c]
    tail = total - in_range
    b_last = bins[last]
    avg_last = group_avg[np.arange(c.size), (last * groups) // c]
    with np.errstate(divide="ignore", invalid="ignore"):
        head_mass = prefix_sum[last]
        head = (prefix_blogb[last] - head_mass * np.log(total) + head_mass * np.log(in_range)
                - (sum_b_log_avg - np.where(b_last > 0, b_last * np.log(np.where(b_last > 0, avg_last, 1.0)), 0.0)))
        head = head / total
        p_last = (b_last + tail) / total
        q_last = np.where(b_last > 0, avg_last / in_range, 0.0)
        log_ratio = np.log(p_last) - np.log(np.where(q_last > 0, q_last, 1.0))
        last_term = np.where(p_last > 0, np.where(q_last > 0, p_last * log_ratio, np.inf), 0.0)
        divergence = head + last_term
    divergence = np.where(in_range > 0, divergence, np.inf)
    return np.where(np.isnan(divergence), np.inf, divergence)


def amax_entropy(hist: np.ndarray, edges: np.ndarray, num_bits: int, unsigned: bool, stride: int = 1,
                 start_bin: int = DEFAULT_START_BIN) -> float:
    """amax minimising the KL divergence between the histogram and its quantized version (TensorRT).

    Candidates are ``i = start_bin, start_bin + stride, ... <= len(hist)``; amax is ``edges[i]`` of the
    best one, the largest among ties. Candidates whose first ``i`` bins are all empty cannot represent
    the data and are skipped (pytorch-quantization's search returns a NaN-driven pick there).
    """
    bins = np.asarray(hist, dtype=np.float64).copy()
    if bins.size > 1:
        bins[0] = bins[1]  # as in the original: the zero bin is dominated by ReLU zeros
    n = bins.size
    groups = int(max_bound_of(num_bits, unsigned)) + 1  # quantization levels from 0 up
    first = max(start_bin, 1)
    candidates = np.arange(first, n + 1, stride, dtype=np.int64)
    _check_candidates(candidates.size, AmaxMethod.ENTROPY.value, n, start_bin)
    if bins.sum() <= 0:
        return float(edges[candidates[-1]])
    if cpu_kernels is not None:
        divergences = np.empty(candidates.size, dtype=np.float64)
        cpu_kernels.entropy_divergences(bins.ctypes.data, n, groups, first, stride, divergences.ctypes.data,
                                         torch.get_num_threads())
    else:
        divergences = entropy_divergences(bins, groups, candidates)
    best = _pick(divergences, prefer_last=True)
    return float(edges[candidates[-1] if best is None else candidates[best]])


def mse_errors(counts: np.ndarray, centers: np.ndarray, max_bound: float, candidates: np.ndarray) -> np.ndarray:
    """Count-weighted squared error of fake-quantizing the bin centers, per candidate amax (numpy).

    Level ``k`` takes the centers in ``[(k - 1/2) step, (k + 1/2) step)``, a contiguous run of bins, so
    ``sum_k k * S1_k`` and ``sum_k k**2 * S0_k`` telescope into sums of prefix sums at the run starts.
    """
    n = centers.size
    zero_pad = np.zeros(1)
    p0 = np.concatenate([zero_pad, np.cumsum(counts)])
    p1 = np.concatenate([zero_pad, np.cumsum(counts * centers)])
    p2_total = float(np.sum(counts * centers * centers))
    step = centers[candidates] / max_bound
    k = np.arange(1, int(max_bound) + 1, dtype=np.float64)
    starts = np.searchsorted(centers, (k[None, :] - 0.5) * step[:, None], side="left")
    first = max_bound * p1[n] - p1[starts].sum(1)
    second = max_bound * max_bound * p0[n] - ((2 * k - 1)[None, :] * p0[starts]).sum(1)
    return np.maximum(p2_total - 2 * step * first + step * step * second, 0.0)


def amax_mse(hist: np.ndarray, edges: np.ndarray, num_bits: int, unsigned: bool, stride: int = 1,
             start_bin: int = DEFAULT_START_BIN) -> float:
    """amax (a bin center) minimising the count-weighted squared error of fake-quantizing the bin centers.

    Candidates are the centers ``start_bin, start_bin + stride, ... < len(hist)``; the smallest among
    ties wins, as in pytorch-quantization.
    """
    counts = np.ascontiguousarray(hist, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    centers = np.ascontiguousarray((edges[1:] + edges[:-1]) / 2)
    n = centers.size
    candidates = np.arange(start_bin, n, stride, dtype=np.int64)
    _check_candidates(candidates.size, AmaxMethod.MSE.value, n, start_bin)
    max_bound = max_bound_of(num_bits, unsigned)
    if cpu_kernels is not None:
        width = edges[1] - edges[0]
        uniform = bool(edges[0] == 0 and width > 0 and np.array_equal(edges, np.arange(n + 1) * width))
        errors = np.empty(candidates.size, dtype=np.float64)
        cpu_kernels.mse_errors(counts.ctypes.data, centers.ctypes.data, n, max_bound, start_bin, stride, uniform,
                                errors.ctypes.data, torch.get_num_threads())
    else:
        errors = mse_errors(counts, centers, max_bound, candidates)
    scale = max(1.0, float(np.sum(counts * centers * centers)))
    finite = np.isfinite(errors)
    best_error = errors[finite].min() if finite.any() else np.inf
    ties = np.nonzero(finite & (errors <= best_error + _TIE_RTOL * scale * 1e-3 + _TIE_RTOL * best_error))[0]
    if ties.size == 0:
        raise ValueError("mse search failed: no finite error (out of memory in the C search?).")
    return float(centers[candidates[ties[0]]])


def amax_percentile(hist: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """amax at the bin edge where the cumulative share of counts reaches ``percentile`` percent."""
    percentile = PERCENTILE.check(percentile)
    counts = np.asarray(hist, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        return 0.0
    cdf = np.cumsum(counts / total)
    index = int(np.searchsorted(cdf, percentile / 100))
    return float(np.asarray(edges)[min(index, len(edges) - 1)])
