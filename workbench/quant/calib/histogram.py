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

The amax searches over the histogram are :mod:`workbench.quant.calib.amax_search`; the methods and
their parameters are :mod:`workbench.quant.calib.methods`.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.quant.calib.amax_search import DEFAULT_START_BIN, amax_entropy, amax_mse, amax_percentile
from workbench.quant.calib.calibrator import Calibrator
from workbench.quant.calib.e4m3_search import amax_entropy_e4m3, amax_mse_e4m3
from workbench.quant.calib.max import extremes
from workbench.quant.calib.memory import KERNEL_DTYPES, dense_block, memory_rows, rows_of_layout
from workbench.quant.calib.methods import PERCENTILE, SINGLE_METHODS, AmaxMethod, UnknownMethodError
from workbench.quant.kernels.fake_quant import cpu_extension as cpu_kernels  # None without a C compiler: numpy is used
from workbench.quant.tensor_quant import E4M3
from workbench.quant.utils import reduce_amax

logger = logging.getLogger(__name__)

__all__ = ["HistogramCalibrator", "calibrate_weights", "HISTOGRAM_METHODS", "DEFAULT_NUM_BINS", "UnknownMethodError",
           "amax_entropy", "amax_mse", "amax_percentile", "dense_block", "memory_rows"]

DEFAULT_NUM_BINS = 2048  # pytorch-quantization's: fine enough for entropy's 128 start bins, cheap to search
HISTOGRAM_METHODS = SINGLE_METHODS  # what a histogram alone decides ("auto" needs the layer: calibrate())
# Smallest width exponent: a range of 2**-24 * num_bins covers anything that does not quantize to 0 anyway.
_MIN_WIDTH_EXPONENT = -24 - 11
_CPU = torch.device("cpu")


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


class HistogramCalibrator(Calibrator):
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

    def __init__(self, num_bits, axis, unsigned, num_bins: int = DEFAULT_NUM_BINS, grow_method=None,
                 skip_zeros: bool = False,
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
        # the largest finite |x| as a float (None before any data); its tensor is made when asked for, so that
        # a batch that raises the max costs no tensor creation (on the ViT, every other batch of a quantizer)
        self._max_value: float | None = None
        self._max_device = torch.device("cpu")
        self._max_tensor: torch.Tensor | None = None

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
        top = int(math.floor(self._max_value / self.bin_width)) + 1
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
        """Largest finite |x| seen (what the 'max' method returns): a 0-d float32 tensor on the device of the
        collected tensors, or None before any data."""
        if self._max_value is None:
            return None
        if self._max_tensor is None:
            self._max_tensor = torch.tensor(self._max_value, dtype=torch.float32, device=self._max_device)
        return self._max_tensor

    def _set_max(self, value: float | None, device: torch.device | None = None) -> None:
        self._max_value = value
        self._max_tensor = None
        if device is not None:
            self._max_device = device

    # ----- collection -------------------------------------------------------------------------

    def collect(self, x: torch.Tensor) -> None:
        """Add |x| to the histogram, widening the bins if ``x`` exceeds the current range."""
        n = x.numel()
        if n == 0:
            return
        # x.is_cpu, not x.device.type: building a device object (~0.3 us) was a fair part of what this wrapper
        # adds to every quantizer's call on every batch (~1 us; the kernel needs ~40 us for a ViT activation)
        if cpu_kernels is not None and x.is_cpu and x.dtype in KERNEL_DTYPES:
            batch_max_value, nonfinite = self._collect_cpu(x, n)  # reads the memory: no autograd involved
            device = _CPU
        else:
            device = x.device
            with torch.no_grad():
                x = x.detach()
                batch_max_value, all_finite = self._batch_max(x, with_finite=True)
                self._widen_to(batch_max_value, device)
                nonfinite = self._collect_torch(x, all_finite)
        self._batches_seen += 1
        self._values_seen += n
        if self._max_value is None or batch_max_value > self._max_value:
            self._set_max(batch_max_value, device)
        if nonfinite:
            if not self._nonfinite_count:  # once per calibrator; the run's result has the totals
                logger.warning("Histogram calibrator saw %d NaN/Inf values; they are left out.", nonfinite)
            self._nonfinite_count += nonfinite

    def _widen_to(self, max_value: float, device: torch.device) -> None:
        """Make the bins cover ``max_value``: the first time, the narrowest width that does; later, the
        width doubles as often as needed and the old counts merge pairwise (exact: widths are powers of 2)."""
        stored_bins = 2 * self._num_bins
        needed = width_exponent(max_value, stored_bins)
        if self._counts is None:
            self._width_exp = needed
            self._counts = torch.zeros(stored_bins, dtype=torch.int64, device=device)
        elif needed > self._width_exp:
            self._counts = merge_bins(self._counts, 1 << (needed - self._width_exp))
            self._width_exp = needed

    def _batch_max(self, x: torch.Tensor, with_finite: bool = False) -> Any:
        """Largest finite |x| (float32-rounded, as the running max keeps it): two reductions read back as two
        numbers (:func:`~workbench.quant.calib.max.extremes`); NaN/Inf in them send ``x`` to a pass that
        leaves non-finite values out. With ``with_finite``, also whether every value was finite."""
        if x.is_floating_point():
            high, low = extremes(x)
        else:
            low_tensor, high_tensor = torch.aminmax(x)
            high, low = float(high_tensor), float(low_tensor)
        if math.isfinite(high) and math.isfinite(low):
            value = float(np.float32(max(abs(high), abs(low))))
            return (value, True) if with_finite else value
        finite_values = x[torch.isfinite(x)]
        value = float(finite_values.abs().max().float()) if finite_values.numel() else 0.0
        return (value, False) if with_finite else value

    def _collect_cpu(self, x: torch.Tensor, n: int) -> tuple[float, int]:
        """One pass in C (no temporary tensors; threads for large batches); returns the batch's largest finite
        |x| and its NaN/Inf count.

        The kernel bins and tracks the max in the same pass. When a value lies beyond the bins (the first
        batch, which starts from the narrowest width, or a batch whose range grew), it widens them to the
        narrowest power of two that holds it and merges what it counted so far, which is exact for
        power-of-two widths: the histogram is the one that taking the max first would give, without a
        second pass over the data.

        The counts do not depend on the order of the values, so a tensor whose elements fill one block of
        memory in another order (a transposed attention tensor), or evenly spaced rows of it (keys sliced
        out of a fused qkv projection), is read in place, not copied first."""
        rows = (n, n) if x.is_contiguous() else rows_of_layout(x.shape, x.stride())
        if rows is None:
            x = x.detach().contiguous()
            rows = (n, n)
        counts = self._counts
        if counts is None:
            counts = self._counts = torch.zeros(2 * self._num_bins, dtype=torch.int64)
            self._width_exp = _MIN_WIDTH_EXPONENT
        elif not counts.is_cpu:
            counts = self._counts = counts.cpu()
        self._width_exp, nonfinite, max_value = cpu_kernels.histogram(
            x.data_ptr(), KERNEL_DTYPES[x.dtype], n, rows[0], rows[1], self._width_exp, _MIN_WIDTH_EXPONENT,
            counts.numel(), self._skip_zeros, counts.data_ptr(), torch.get_num_threads())
        return max_value, nonfinite

    def _collect_torch(self, x: torch.Tensor, all_finite: bool = False) -> int:
        """The same counts with torch operations, on the tensor's own device (CUDA, float64, ...).

        When the batch's max and min were finite (``all_finite``, the usual case) no value needs filtering,
        and skipped zeros are taken off bin 0 afterwards: no boolean indexing, so no wait for the GPU."""
        values = x.float().reshape(-1).abs()
        nonfinite = 0
        if not all_finite:
            finite = torch.isfinite(values)
            nonfinite = int(values.numel() - int(finite.sum()))
            if nonfinite:
                values = values[finite]
        if values.numel() == 0:
            return nonfinite
        # multiplying by a power of two is exact, so floor() gives the true bin of every value
        index = torch.mul(values, math.ldexp(1.0, -self._width_exp)).floor_()
        index = index.to(torch.int64).clamp_(max=self._counts.numel() - 1)
        counts = torch.bincount(index, minlength=self._counts.numel())
        if self._skip_zeros:  # zeros all land in bin 0 (floor(0) = 0)
            counts[0] -= (values == 0).sum()
        self._counts += counts.to(self._counts.device)
        return nonfinite

    def reset(self) -> None:
        """Forget the histogram."""
        self._counts = None
        self._width_exp = None
        self._set_max(None)
        self._reset_counters()

    # ----- amax -------------------------------------------------------------------------------

    def compute_amax(self, method: str, *, stride: int = 1, start_bin: int = DEFAULT_START_BIN,
                     percentile: float = PERCENTILE.default) -> torch.Tensor | None:
        """amax from the histogram: ``"entropy"`` (TensorRT's KL divergence), ``"mse"``, ``"percentile"`` or ``"max"``.

        Keyword Arguments:
            stride: step between candidate bins (entropy and mse). Default 1.
            start_bin: first candidate bin (entropy and mse). Default 128.
            percentile: for ``"percentile"``, in (0, 100]. Default 99.99.

        Returns:
            A 0-d float32 tensor on the CPU, or None when nothing was collected.
        """
        method = AmaxMethod.parse(method)
        if not method.is_single:
            raise ValueError("amax method 'auto' compares every method on the layer's output, which a histogram "
                             "alone cannot: calibrate the model with method='auto' "
                             "(workbench.quant.algorithms.calibrate), or "
                             f"pick one of {', '.join(SINGLE_METHODS)} here.")
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be a positive integer, got {stride!r}.")
        if isinstance(start_bin, bool) or not isinstance(start_bin, int) or start_bin < 0:
            raise ValueError(f"start_bin must be a non-negative integer, got {start_bin!r}.")
        percentile = PERCENTILE.check(percentile)
        if self._max_value is None:
            return None
        if method is AmaxMethod.MAX:
            return torch.tensor(self._max_value, dtype=torch.float32)
        if self._counts is None or self._max_value == 0.0:
            return torch.tensor(0.0)  # only zeros seen: amax 0 quantizes everything to 0, which is exact
        hist = self.calib_hist.cpu().numpy()
        edges = np.arange(hist.size + 1, dtype=np.float64) * self.bin_width
        if self._num_bits == E4M3 and method in (AmaxMethod.ENTROPY, AmaxMethod.MSE):  # FP8: the E4M3 grid
            search = amax_entropy_e4m3 if method is AmaxMethod.ENTROPY else amax_mse_e4m3
            value = search(hist, edges, stride, start_bin)
        elif method is AmaxMethod.ENTROPY:
            value = amax_entropy(hist, edges, self._num_bits, self._unsigned, stride, start_bin)
        elif method is AmaxMethod.MSE:
            value = amax_mse(hist, edges, self._num_bits, self._unsigned, stride, start_bin)
        else:
            value = amax_percentile(hist, edges, percentile)
        return torch.tensor(value, dtype=torch.float32)

    def compute_all(self, percentile: float = PERCENTILE.default, **kwargs) -> dict[str, float | None]:
        """amax of every method at once (for plotting one line per method); None where a method fails."""
        amaxes: dict[str, float | None] = {}
        for method in AmaxMethod.singles():
            try:
                value = self.compute_amax(method, percentile=percentile, **kwargs)
            except ValueError as error:
                logger.info("%s amax not available: %s", method.value, error)
                value = None
            amaxes[method.value] = None if value is None else float(value)
        return amaxes

    # ----- saving -----------------------------------------------------------------------------

    def state(self) -> dict:
        """The collected statistics as plain values (numpy arrays and numbers), for saving."""
        return {
            "kind": "histogram",
            "num_bins": self._num_bins,
            "width_exponent": self._width_exp,
            "counts": None if self._counts is None else self._counts.cpu().numpy(),
            "max_value": self._max_value,
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
        # through float32, as collection keeps it
        self._set_max(None if max_value is None else float(np.float32(max_value)), torch.device("cpu"))
        self._skip_zeros = bool(state.get("skip_zeros", self._skip_zeros))
        self._batches_seen = int(state.get("batches_seen", 0))
        self._values_seen = int(state.get("values_seen", 0))
        self._nonfinite_count = int(state.get("nonfinite_count", 0))
        if (self._counts is None) != (self._width_exp is None) or (
                self._counts is not None and self._max_value is None):
            raise ValueError("histogram counts and width exponent must be saved together.")

    def __str__(self) -> str:
        edges = self.calib_bin_edges
        text = "None" if edges is None else f"[{edges[0]:.3f}, ..., {edges[-1]:.3f}]({len(edges)})"
        return f"HistogramCalibrator(calib_bin_edges={text})"

    def __repr__(self) -> str:
        return (f"HistogramCalibrator({super().__repr__()} num_bins={self._num_bins} "
                f"bin_width={self.bin_width} max={self._max_value})")


def calibrate_weights(model: torch.nn.Module, method: str = AmaxMethod.PERCENTILE, perchannel: bool = True,
                      percentile: float = PERCENTILE.default, num_bins: int = DEFAULT_NUM_BINS) -> None:
    """Set the weight amax of every quantized module from its weights, without running the model.

    Uses ``method`` ("max", "mse" or "percentile"), not the method of the weight quantizer's
    calibrator; histograms are collected exactly as :class:`HistogramCalibrator` does. Per channel
    (axis 1 for transposed convolutions, else 0) unless ``perchannel=False``.
    """
    weight_methods = (AmaxMethod.MAX, AmaxMethod.MSE, AmaxMethod.PERCENTILE)
    if method not in weight_methods:
        raise UnknownMethodError(f"Unsupported calibration method {method!r} for weights; use "
                                 f"{', '.join(m.value for m in weight_methods)}.")
    method = AmaxMethod(method)
    for name, module in model.named_modules():
        if not (hasattr(module, "weight") and hasattr(module, "weight_quantizer")):
            continue
        quantizer = module.weight_quantizer
        weight = module.weight.detach()
        # transposed convolutions keep output channels on axis 1 (a quantized one is a ConvTranspose too)
        axis = (1 if isinstance(module, nn.modules.conv._ConvTransposeNd) else 0) if perchannel else None
        if method is AmaxMethod.MAX:  # one reduction for every channel (one read back), not one per channel
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
