"""HistogramCalibrator: a histogram of |x| from which entropy, mse or percentile choose amax.

Collection runs on the tensor's own device with torch operations. Bins have a power-of-two width
``2**e`` starting at 0, the smallest for which ``2 * num_bins`` bins cover the largest value seen, so
the data range ``[0, max]`` always spans between ``num_bins`` and ``2 * num_bins`` bins (at least the
resolution of pytorch-quantization's ``num_bins`` bins over ``[0, max]``). When a batch exceeds the
range, the width doubles as often as needed and old counts are merged pairwise. Because every width is
a power of two, binning is exact (``floor(|x| / width)`` involves no rounding), so the histogram after
many batches is identical to the histogram of all the data in one batch, whatever their order. The
histogram reported (and searched for amax) ends with the bin that holds the largest value. NaN and Inf
values are left out and counted.

The amax searches are vectorised over all candidate bins at once using prefix sums, instead of one
candidate per loop iteration; they return the same amax as pytorch-quantization's algorithms on the
same histogram (see :mod:`workbench.quant.calib.reference` for the one-candidate-at-a-time versions
they are tested against).
"""
from __future__ import annotations

import logging
import math

import numpy as np
import torch

from workbench.quant.calib.calibrator import _Calibrator
from workbench.quant.kernels import cpu_extension as _cpu_kernels  # None without a C compiler: numpy is used
from workbench.quant.tensor_quant import max_bound_of
from workbench.quant.utils import reduce_amax

logger = logging.getLogger(__name__)

__all__ = ["HistogramCalibrator", "calibrate_weights", "HISTOGRAM_METHODS", "UnknownMethodError"]

HISTOGRAM_METHODS = ("entropy", "mse", "percentile", "max")
# Smallest width exponent: a range of 2**-24 * num_bins covers anything that does not quantize to 0 anyway.
_MIN_WIDTH_EXPONENT = -24 - 11
_KERNEL_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# Relative tolerance under which two candidates' divergences or errors count as equal; the search then
# picks the candidate pytorch-quantization picks among exact ties (the last for entropy, the first for mse).
_TIE_RTOL = 1e-9
_TIE_ATOL = 1e-12


class UnknownMethodError(ValueError, TypeError):
    """An amax method name that does not exist (a ValueError; a TypeError too, as the original raised)."""


def width_exponent(max_value: float, num_bins: int) -> int:
    """Smallest ``e`` with ``num_bins * 2**e > max_value`` (bins of width ``2**e`` cover it)."""
    if not max_value > 0:
        return _MIN_WIDTH_EXPONENT
    _, exponent = math.frexp(max_value / num_bins)
    e = max(exponent, _MIN_WIDTH_EXPONENT)
    while num_bins * math.ldexp(1.0, e) <= max_value:
        e += 1
    while e > _MIN_WIDTH_EXPONENT and num_bins * math.ldexp(1.0, e - 1) > max_value:
        e -= 1
    return e


def merge_bins(hist: torch.Tensor, factor: int) -> torch.Tensor:
    """Counts of ``hist`` re-binned into bins ``factor`` times wider (same number of bins)."""
    num_bins = hist.numel()
    if factor >= num_bins:
        merged = torch.zeros_like(hist)
        merged[0] = hist.sum()
        return merged
    padded_len = ((num_bins + factor - 1) // factor) * factor
    padded = torch.zeros(padded_len, dtype=hist.dtype, device=hist.device)
    padded[:num_bins] = hist
    coarse = padded.view(-1, factor).sum(1)
    merged = torch.zeros_like(hist)
    merged[:coarse.numel()] = coarse
    return merged


class HistogramCalibrator(_Calibrator):
    """Per-tensor histogram of |x|; ``compute_amax(method)`` picks amax by entropy, mse or percentile.

    The histogram is collected once; every method reuses it, so trying another method needs no new
    pass over the data.

    Args:
        num_bits: number of bits of the quantizer.
        axis: must be None: histograms are per tensor.
        unsigned: whether the quantizer is unsigned.
        num_bins: number of bins. Default 2048.
        grow_method: ignored (deprecated in the original as well).
        skip_zeros: leave exact zeros out of the histogram (ReLU outputs). Default False.
        torch_hist: accepted for compatibility; collection always uses torch on the tensor's device.
    """

    def __init__(self, num_bits, axis, unsigned, num_bins: int = 2048, grow_method=None, skip_zeros: bool = False,
                 torch_hist: bool = True) -> None:
        super().__init__(num_bits, axis, unsigned)
        if axis is not None:
            raise NotImplementedError(f"Calibrator histogram collection only supports per tensor scaling (axis=None), "
                                      f"got axis={axis!r}. Use calib_method='max' for per-channel quantizers.")
        if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2:
            raise ValueError(f"num_bins must be an integer >= 2, got {num_bins!r}.")
        if grow_method is not None:
            logger.warning("grow_method is deprecated and ignored (got %r).", grow_method)
        self._num_bins = num_bins
        self._skip_zeros = skip_zeros
        self._torch_hist = torch_hist
        self._counts: torch.Tensor | None = None  # 2 * num_bins counts of width 2**_width_exp
        self._width_exp: int | None = None
        self._max: torch.Tensor | None = None

    # ----- inspection -------------------------------------------------------------------------

    @property
    def num_bins(self) -> int:
        return self._num_bins

    @property
    def skip_zeros(self) -> bool:
        return self._skip_zeros

    @property
    def bin_width(self) -> float | None:
        return None if self._width_exp is None else math.ldexp(1.0, self._width_exp)

    def _used_bins(self) -> int:
        """Bins up to and including the one that holds the largest value."""
        if self._counts is None:
            return 0
        top = int(math.floor(float(self._max) / self.bin_width)) + 1
        return min(max(top, 1), self._counts.numel())

    @property
    def calib_hist(self) -> torch.Tensor | None:
        """Counts per bin (int64, on the device of the collected tensors), up to the bin holding the max."""
        if self._counts is None:
            return None
        return self._counts[:self._used_bins()]

    @property
    def calib_bin_edges(self) -> torch.Tensor | None:
        """Bin edges matching :attr:`calib_hist` (one more than the counts; float32, CPU)."""
        if self._counts is None:
            return None
        return (torch.arange(self._used_bins() + 1, dtype=torch.float64) * self.bin_width).float()

    # the original's attribute names, read by scripts
    _calib_hist = calib_hist
    _calib_bin_edges = calib_bin_edges

    @property
    def max_value(self) -> torch.Tensor | None:
        """Largest finite |x| seen (what the 'max' method returns)."""
        return self._max

    # ----- collection -------------------------------------------------------------------------

    def collect(self, x: torch.Tensor) -> None:
        """Add |x| to the histogram, widening the bins if ``x`` exceeds the current range."""
        with torch.no_grad():
            x = x.detach()
            if x.numel() == 0:
                return
            low, high = torch.aminmax(x)
            batch_max = torch.maximum(high.abs(), low.abs()).float()
            # the one read back to the host per batch (on CUDA a sync): both tests below use this float
            batch_max_value = float(batch_max)
            if not math.isfinite(batch_max_value):  # NaN/Inf present: the range comes from finite values
                finite_values = x[torch.isfinite(x)]
                batch_max = finite_values.abs().max().float() if finite_values.numel() else torch.zeros(())
                batch_max_value = float(batch_max)
            self._batches_seen += 1
            self._values_seen += x.numel()
            self._max = batch_max.clone() if self._max is None else torch.maximum(self._max, batch_max)

            stored_bins = 2 * self._num_bins
            needed = width_exponent(batch_max_value, stored_bins)
            if self._counts is None:
                self._width_exp = needed
                self._counts = torch.zeros(stored_bins, dtype=torch.int64, device=x.device)
            elif needed > self._width_exp:
                self._counts = merge_bins(self._counts, 1 << (needed - self._width_exp))
                self._width_exp = needed
            if _cpu_kernels is not None and x.device.type == "cpu" and x.dtype in _KERNEL_DTYPES:
                nonfinite = self._collect_cpu(x)
            else:
                nonfinite = self._collect_torch(x)
            if nonfinite:
                if not self._nonfinite_count:  # once per calibrator; the run's result has the totals
                    logger.warning("Histogram calibrator saw %d NaN/Inf values; they are left out.", nonfinite)
                self._nonfinite_count += nonfinite

    def _collect_cpu(self, x: torch.Tensor) -> int:
        """One fused pass in C (threads, no temporary tensors); returns the NaN/Inf count."""
        x = x.contiguous()
        if self._counts.device.type != "cpu":
            self._counts = self._counts.cpu()
        return _cpu_kernels.histogram(x.data_ptr(), _KERNEL_DTYPES[x.dtype], x.numel(), self._width_exp,
                                      self._counts.numel(), self._skip_zeros, self._counts.data_ptr(),
                                      torch.get_num_threads())

    def _collect_torch(self, x: torch.Tensor) -> int:
        """The same counts with torch operations, on the tensor's own device (CUDA, float64, ...)."""
        values = x.float().reshape(-1).abs()
        finite = torch.isfinite(values)
        nonfinite = int(values.numel() - int(finite.sum()))
        if nonfinite:
            values = values[finite]
        if self._skip_zeros:
            values = values[values != 0]
        if values.numel() == 0:
            return nonfinite
        # multiplying by a power of two is exact, so floor() gives the true bin of every value
        index = torch.mul(values, math.ldexp(1.0, -self._width_exp)).floor_()
        index = index.to(torch.int64).clamp_(max=self._counts.numel() - 1)
        counts = torch.bincount(index, minlength=self._counts.numel())
        self._counts += counts.to(self._counts.device)
        return nonfinite

    def reset(self) -> None:
        """Forget the histogram."""
        self._counts = None
        self._width_exp = None
        self._max = None
        self._reset_counters()

    # ----- amax -------------------------------------------------------------------------------

    def compute_amax(self, method: str, *, stride: int = 1, start_bin: int = 128,
                     percentile: float = 99.99) -> torch.Tensor | None:
        """amax from the histogram: ``"entropy"`` (TensorRT's KL divergence), ``"mse"``, ``"percentile"`` or ``"max"``.

        Keyword Arguments:
            stride: step between candidate bins (entropy and mse). Default 1.
            start_bin: first candidate bin (entropy and mse). Default 128.
            percentile: for ``"percentile"``, in [0, 100]. Default 99.99.

        Returns:
            A 0-d float32 tensor on the CPU, or None when nothing was collected.
        """
        if method not in HISTOGRAM_METHODS:
            raise UnknownMethodError(f"Unknown calibration method {method!r}; choose one of {HISTOGRAM_METHODS}.")
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be a positive integer, got {stride!r}.")
        if isinstance(start_bin, bool) or not isinstance(start_bin, int) or start_bin < 0:
            raise ValueError(f"start_bin must be a non-negative integer, got {start_bin!r}.")
        if not 0 <= percentile <= 100:
            raise ValueError(f"Invalid percentile {percentile}. Must be in range 0 <= percentile <= 100.")
        if self._max is None:
            return None
        if method == "max":
            return self._max.detach().float().cpu().reshape(())
        if self._counts is None or float(self._max) == 0.0:
            return torch.tensor(0.0)  # only zeros seen: amax 0 quantizes everything to 0, which is exact
        hist = self.calib_hist.cpu().numpy()
        edges = np.arange(hist.size + 1, dtype=np.float64) * self.bin_width
        if method == "entropy":
            value = amax_entropy(hist, edges, self._num_bits, self._unsigned, stride, start_bin)
        elif method == "mse":
            value = amax_mse(hist, edges, self._num_bits, self._unsigned, stride, start_bin)
        else:
            value = amax_percentile(hist, edges, percentile)
        return torch.tensor(value, dtype=torch.float32)

    def compute_all(self, percentile: float = 99.99, **kwargs) -> dict[str, float | None]:
        """amax of every method at once (for plotting one line per method); None where a method fails."""
        amaxes: dict[str, float | None] = {}
        for method in HISTOGRAM_METHODS:
            try:
                value = self.compute_amax(method, percentile=percentile, **kwargs)
            except ValueError as error:
                logger.info("%s amax not available: %s", method, error)
                value = None
            amaxes[method] = None if value is None else float(value)
        return amaxes

    # ----- saving -----------------------------------------------------------------------------

    def state(self) -> dict:
        """The collected statistics as plain values (numpy arrays and numbers), for saving."""
        return {
            "kind": "histogram",
            "num_bins": self._num_bins,
            "width_exponent": self._width_exp,
            "counts": None if self._counts is None else self._counts.cpu().numpy(),
            "max_value": None if self._max is None else float(self._max),
            "skip_zeros": self._skip_zeros,
            "batches_seen": self._batches_seen,
            "values_seen": self._values_seen,
            "nonfinite_count": self._nonfinite_count,
        }

    def load_state(self, state: dict) -> None:
        """Restore statistics saved by :meth:`state`."""
        if state.get("kind") != "histogram":
            raise ValueError(f"not the state of a HistogramCalibrator (kind={state.get('kind')!r}).")
        hist = state.get("counts")
        num_bins = int(state["num_bins"])
        if num_bins < 2:
            raise ValueError(f"num_bins must be >= 2, got {num_bins}.")
        if hist is not None:
            hist = np.asarray(hist)
            if hist.shape != (2 * num_bins,):
                raise ValueError(f"histogram has {hist.shape} counts, expected ({2 * num_bins},).")
            if (hist < 0).any():
                raise ValueError("histogram counts must be non-negative.")
        self._num_bins = num_bins
        self._width_exp = None if state.get("width_exponent") is None else int(state["width_exponent"])
        self._counts = None if hist is None else torch.as_tensor(hist.astype(np.int64))
        max_value = state.get("max_value")
        self._max = None if max_value is None else torch.tensor(float(max_value))
        self._skip_zeros = bool(state.get("skip_zeros", self._skip_zeros))
        self._batches_seen = int(state.get("batches_seen", 0))
        self._values_seen = int(state.get("values_seen", 0))
        self._nonfinite_count = int(state.get("nonfinite_count", 0))
        if (self._counts is None) != (self._width_exp is None) or (self._counts is not None and self._max is None):
            raise ValueError("histogram counts and width exponent must be saved together.")

    def __str__(self) -> str:
        edges = self.calib_bin_edges
        text = "None" if edges is None else f"[{edges[0]:.3f}, ..., {edges[-1]:.3f}]({len(edges)})"
        return f"HistogramCalibrator(calib_bin_edges={text})"

    def __repr__(self) -> str:
        return (f"HistogramCalibrator({super().__repr__()} num_bins={self._num_bins} "
                f"bin_width={self.bin_width} max={None if self._max is None else float(self._max)})")


# ----- the amax searches, vectorised over candidates --------------------------------------------

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
                 start_bin: int = 128) -> float:
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
    _check_candidates(candidates.size, "entropy", n, start_bin)
    if bins.sum() <= 0:
        return float(edges[candidates[-1]])
    if _cpu_kernels is not None:
        divergences = np.empty(candidates.size, dtype=np.float64)
        _cpu_kernels.entropy_divergences(bins.ctypes.data, n, groups, first, stride, divergences.ctypes.data,
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
             start_bin: int = 128) -> float:
    """amax (a bin center) minimising the count-weighted squared error of fake-quantizing the bin centers.

    Candidates are the centers ``start_bin, start_bin + stride, ... < len(hist)``; the smallest among
    ties wins, as in pytorch-quantization.
    """
    counts = np.ascontiguousarray(hist, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    centers = np.ascontiguousarray((edges[1:] + edges[:-1]) / 2)
    n = centers.size
    candidates = np.arange(start_bin, n, stride, dtype=np.int64)
    _check_candidates(candidates.size, "mse", n, start_bin)
    max_bound = max_bound_of(num_bits, unsigned)
    if _cpu_kernels is not None:
        width = edges[1] - edges[0]
        uniform = bool(edges[0] == 0 and width > 0 and np.array_equal(edges, np.arange(n + 1) * width))
        errors = np.empty(candidates.size, dtype=np.float64)
        _cpu_kernels.mse_errors(counts.ctypes.data, centers.ctypes.data, n, max_bound, start_bin, stride, uniform,
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
    if not 0 <= percentile <= 100:
        raise ValueError(f"Invalid percentile {percentile}. Must be in range 0 <= percentile <= 100.")
    counts = np.asarray(hist, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        return 0.0
    cdf = np.cumsum(counts / total)
    index = int(np.searchsorted(cdf, percentile / 100))
    return float(np.asarray(edges)[min(index, len(edges) - 1)])


def calibrate_weights(model: torch.nn.Module, method: str = "percentile", perchannel: bool = True,
                      percentile: float = 99.99, num_bins: int = 2048) -> None:
    """Set the weight amax of every quantized module from its weights, without running the model.

    Uses ``method`` ("max", "mse" or "percentile"), not the method of the weight quantizer's
    calibrator; histograms are collected exactly as :class:`HistogramCalibrator` does. Per channel
    (axis 1 for transposed convolutions, else 0) unless ``perchannel=False``.
    """
    from workbench.quant.nn.modules.quant_conv import _QuantConvTransposeNd

    if method not in ("max", "mse", "percentile"):
        raise UnknownMethodError(f"Unsupported calibration method {method!r} for weights; use max, mse or percentile.")
    for name, module in model.named_modules():
        if not (hasattr(module, "weight") and hasattr(module, "weight_quantizer")):
            continue
        quantizer = module.weight_quantizer
        weight = module.weight.detach()
        axis = (1 if isinstance(module, _QuantConvTransposeNd) else 0) if perchannel else None
        if method == "max":  # one reduction for every channel (one read back), not one per channel
            reduce_axes = None if axis is None else [d for d in range(weight.dim()) if d != axis]
            amaxes = reduce_amax(weight, axis=reduce_axes).float().reshape(-1).tolist()
        else:
            amaxes = []
            for tensor in [weight] if axis is None else weight.unbind(axis):
                calibrator = HistogramCalibrator(quantizer.num_bits, None, quantizer.unsigned, num_bins=num_bins)
                calibrator.collect(tensor)
                amaxes.append(float(calibrator.compute_amax(method, percentile=percentile)))
        if axis is None:
            quantizer.amax = np.float32(amaxes[0])
        else:
            shape = [1] * weight.dim()
            shape[axis] = weight.shape[axis]
            quantizer.amax = np.array(amaxes, dtype=np.float32).reshape(shape)
        logger.info("Calibrated weight of %s with %s", name, method)
