"""MaxCalibrator: amax is the running absolute maximum, per tensor or per axis."""
from __future__ import annotations

import logging
import math
import weakref

import numpy as np
import torch

from workbench.quant.calib.calibrator import Calibrator
from workbench.quant.calib.memory import abs_max_in_place, abs_max_per_channel

logger = logging.getLogger(__name__)

__all__ = ["MaxCalibrator"]


def reduce_dims(ndim: int, axis) -> list[int]:
    """The dimensions to reduce over so that ``axis`` (None, int or tuple) keeps its own values."""
    if axis is None:
        return list(range(ndim))
    axes = axis if isinstance(axis, (list, tuple)) else (axis,)
    keep = set()
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions.")
        keep.add(a % ndim)
    return [i for i in range(ndim) if i not in keep]


def extremes(x: torch.Tensor) -> tuple[float, float]:
    """``(max x, min x)`` of a floating-point tensor as Python floats; NaN in ``x`` makes both NaN.

    ``amax`` and ``amin`` are two vectorised reads with no temporary copy (on CPU each is several
    times faster than one ``aminmax``, which is not vectorised, on strided attention tensors too), and
    both propagate NaN, so these two numbers also say whether ``x`` held any NaN or Inf. Off the CPU
    the two values come back in one transfer (one sync).
    """
    high, low = torch.amax(x), torch.amin(x)
    if x.device.type == "cpu":
        return high.item(), low.item()
    high_value, low_value = torch.stack((high, low)).tolist()
    return high_value, low_value


def abs_max(x: torch.Tensor, dims: list[int]) -> tuple[torch.Tensor, int]:
    """Absolute max of ``x`` over ``dims`` (kept as size-1 dims), ignoring NaN/Inf; and how many there were.

    The common case (all finite) costs one min and one max reduction and no temporary copy of ``x``.
    """
    if x.numel() == 0:
        raise ValueError("cannot calibrate on an empty tensor.")
    if not dims:  # an amax per element (the axis covers every dimension): torch.amax(dim=[]) would reduce all
        finite = torch.isfinite(x)
        return torch.where(finite, x.abs(), torch.zeros((), dtype=x.dtype, device=x.device)), int((~finite).sum())
    if len(dims) == x.dim():
        high, low = extremes(x)
        if math.isfinite(high) and math.isfinite(low):
            value = max(abs(high), abs(low))
            return torch.tensor(value, dtype=x.dtype, device=x.device).reshape([1] * x.dim()), 0
    else:
        result = torch.maximum(torch.amax(x, dim=dims, keepdim=True).abs(),
                               torch.amin(x, dim=dims, keepdim=True).abs())
        if bool(torch.isfinite(result).all()):
            return result, 0
    finite = torch.isfinite(x)
    nonfinite = int(finite.numel() - int(finite.sum()))
    cleaned = torch.where(finite, x.abs(), torch.zeros((), dtype=x.dtype, device=x.device))
    return torch.amax(cleaned, dim=dims, keepdim=True), nonfinite


class MaxCalibrator(Calibrator):
    """Tracks the absolute maximum of everything it is shown.

    Args:
        num_bits: number of bits.
        axis: None (per tensor) or the axis/axes with their own max (e.g. 0 for conv weights).
        unsigned: whether the quantizer is unsigned.
        track_amax: also keep every batch's amax (as numpy arrays) in :attr:`amaxs`, for plotting.

    NaN and Inf values are left out and counted in :attr:`nonfinite_count`.
    """

    def __init__(self, num_bits, axis, unsigned, track_amax: bool = False) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._track_amax = track_amax
        if self._track_amax:
            self._amaxs: list[np.ndarray] = []
        self._calib_amax: torch.Tensor | None = None
        self._last_input: tuple | None = None
        self._last_nonfinite = 0  # NaN/Inf count of the last tensor collected
        # the per-tensor running max as a Python float, so that a batch that does not raise it costs no tensor
        # operation; None when unknown (every other writer of _calib_amax sets it to None)
        self._running: float | None = None

    @property
    def amaxs(self) -> list[np.ndarray]:
        return self._amaxs

    @property
    def calib_amax(self) -> torch.Tensor | None:
        """The running absolute max (per tensor: 0-d; per axis: reduced dims kept with size 1)."""
        return self._calib_amax

    def collect(self, x: torch.Tensor) -> None:
        """Update the running absolute max with tensor ``x``.

        Raises:
            RuntimeError: when the shape of the per-axis max changes between calls.
        """
        if self._same_as_last(x):
            # a weight seen again unchanged (every calibration batch shows the same weights):
            # its max is already in; count it without another pass over it
            self._batches_seen += 1
            self._values_seen += x.numel()
            self._nonfinite_count += self._last_input[2]
            return
        source = x
        if x.requires_grad:
            x = x.detach()
        if not (self._axis is None and not self._track_amax and x.is_floating_point() and x.numel()
                and self._collect_per_tensor(x)):
            self._collect_general(x)
        # a weak reference: a weight (a Parameter that lives on) is recognised next time, while an
        # activation is not kept alive by the calibrator after the forward pass that made it
        self._last_input = (weakref.ref(source), self._identity(source), self._last_nonfinite)

    def _collect_per_tensor(self, x: torch.Tensor) -> bool:
        """The per-tensor case when ``x`` is all finite: two reductions read back as two numbers, the running
        max updated in place. Returns False (nothing collected) when ``x`` holds NaN/Inf, for the general path.

        Any floating dtype is reduced as it is (the max of float16 values is exact in float32), so
        half-precision activations are not copied to float32 first. On the CPU one pass of the C kernel gives
        both the max and whether anything was not finite (attention probabilities, read where they lie).
        """
        found = abs_max_in_place(x)
        if found is not None:
            value, nonfinite = found
            if nonfinite:
                return False
        else:
            high, low = extremes(x)
            if not (math.isfinite(high) and math.isfinite(low)):
                return False
            value = float(np.float32(max(abs(high), abs(low))))  # float32 rounding of a float64 max, as .float() does
        if self._calib_amax is None:
            self._calib_amax = torch.tensor(value, dtype=torch.float32, device=x.device)
            self._running = value
        elif self._calib_amax.dim() != 0:
            self._shape_changed(torch.Size([]))
        else:
            if self._running is None:  # set by the general path or a loaded state
                self._running = self._calib_amax.item()
            if value > self._running:  # the tensor is written only when the max grows
                self._calib_amax.fill_(value)
                self._running = value
        self._batches_seen += 1
        self._values_seen += x.numel()
        self._last_nonfinite = 0
        return True

    def _collect_general(self, x: torch.Tensor) -> None:
        """Per axis, NaN/Inf present, amax tracking, or non-floating inputs."""
        with torch.no_grad():
            dims = reduce_dims(x.dim(), self._axis)
            # a weight's max per output channel (axis 0): one pass of the C kernel where it can read x
            found = abs_max_per_channel(x) if dims == list(range(1, x.dim())) else None
            if found is not None:
                local_amax, nonfinite = found
                local_amax = local_amax.reshape([-1] + [1] * (x.dim() - 1))
            else:
                if x.dtype not in (torch.float32, torch.float64):
                    x = x.float()
                local_amax, nonfinite = abs_max(x, dims)
            if local_amax.numel() == 1:  # per tensor (or a single channel): a 0-d tensor, as in the original
                local_amax = local_amax.reshape(())
            if self._calib_amax is not None and local_amax.shape != self._calib_amax.shape:
                self._shape_changed(local_amax.shape)
            self._batches_seen += 1
            self._values_seen += x.numel()
            self._nonfinite_count += nonfinite
            if nonfinite and self._nonfinite_count == nonfinite:  # warn once; the run's result has totals
                logger.warning("Calibrator saw %d NaN/Inf values; they are left out of amax.", nonfinite)
            if self._calib_amax is None:
                self._calib_amax = local_amax.float().clone()
            else:
                torch.maximum(self._calib_amax, local_amax.float().to(self._calib_amax.device),
                              out=self._calib_amax)
            self._running = None
            if self._track_amax:
                self._amaxs.append(local_amax.cpu().numpy().copy())
            self._last_nonfinite = nonfinite

    def _shape_changed(self, shape: torch.Size) -> None:
        raise RuntimeError(f"amax shape changed! The calibrator first saw tensors whose per-axis max "
                           f"has shape {tuple(self._calib_amax.shape)}, now {tuple(shape)}.")

    @staticmethod
    def _identity(x: torch.Tensor) -> tuple:
        # data_ptr() is the storage's address plus the offset; with shape, strides and dtype it pins the view
        return (x.data_ptr(), x.shape, x.stride(), x.dtype, x.device, x._version)

    def _same_as_last(self, x: torch.Tensor) -> bool:
        last = self._last_input
        if last is None or self._track_amax or last[0]() is not x:  # an activation's referent is gone: cheap
            return False
        # the same live object, at the same place and version: its values cannot have changed
        return last[1] == self._identity(x)

    def forget_last_input(self) -> None:
        """Drop the reference to the last tensor collected, keeping the max: a weight about to be released
        (sequential calibration sends a block's weights back to the checkpoint) must not be held by it."""
        self._last_input = None

    def reset(self) -> None:
        """Forget the collected max."""
        self._calib_amax = None
        self._running = None
        self._last_input = None
        self._reset_counters()
        if self._track_amax:
            self._amaxs = []

    def compute_amax(self, method: str | None = None, **kwargs) -> torch.Tensor | None:
        """The absolute max of everything collected, or None before any data.

        ``method`` may be given as ``"max"`` (the only one a MaxCalibrator has) so that callers can
        pass the same arguments to every calibrator.
        """
        if method not in (None, "max"):
            raise ValueError(f"MaxCalibrator only computes 'max', not {method!r}. Use a descriptor with "
                             "calib_method='histogram' for entropy, mse or percentile calibration.")
        if kwargs:
            raise TypeError(f"MaxCalibrator.compute_amax takes no options, got {sorted(kwargs)}.")
        return self._calib_amax

    def state(self) -> dict:
        """The collected statistics as plain values (numpy arrays and ints), for saving."""
        return {
            "kind": "max",
            "calib_amax": None if self._calib_amax is None else self._calib_amax.detach().cpu().numpy(),
            "batches_seen": self._batches_seen,
            "values_seen": self._values_seen,
            "nonfinite_count": self._nonfinite_count,
        }

    def load_state(self, state: dict) -> None:
        """Restore statistics saved by :meth:`state`."""
        if state.get("kind") != "max":
            raise ValueError(f"not the state of a MaxCalibrator (kind={state.get('kind')!r}).")
        amax = state["calib_amax"]
        self._calib_amax = None if amax is None else torch.as_tensor(np.array(amax, dtype=np.float32))
        self._running = None
        self._last_input = None
        self._batches_seen = int(state.get("batches_seen", 0))
        self._values_seen = int(state.get("values_seen", 0))
        self._nonfinite_count = int(state.get("nonfinite_count", 0))

    def __str__(self) -> str:
        return f"MaxCalibrator(track_amax={self._track_amax})"

    def __repr__(self) -> str:
        return f"MaxCalibrator({super().__repr__()} calib_amax={self._calib_amax} track_amax={self._track_amax})"
