"""What a calibration run gives back or raises: per-quantizer results, the run's result, and its errors.

Every error leaves the model exactly as it was before the run; each names what went wrong (the batch, the
quantizer, the method) so that a user can act on it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from workbench.quant.algorithms.auto_method import MethodChoice
from workbench.quant.calib.checks import CalibrationWarning

__all__ = ["CalibrationResult", "QuantizerCalibration", "CalibrationCancelled", "CalibrationError",
           "NonFiniteCalibrationError", "NothingReachedError", "AmaxError", "CancelToken", "ProgressCallback"]

ProgressCallback = Callable[[int, int, str], None]


class CancelToken(Protocol):
    """Anything with ``is_set()``, such as :class:`threading.Event`."""

    def is_set(self) -> bool: ...


class CalibrationCancelled(Exception):
    """The run was cancelled; the model is as it was before the call."""


class CalibrationError(RuntimeError):
    """The model failed on a batch; the model is as it was before the call.

    Attributes:
        batch_index: 0-based index of the batch that failed.
        original: the exception the model raised.
    """

    def __init__(self, batch_index: int, original: BaseException) -> None:
        self.batch_index = batch_index
        self.original = original
        super().__init__(f"The model failed on calibration batch {batch_index}: "
                         f"{type(original).__name__}: {original}")


class NothingReachedError(ValueError):
    """The model ran on the calibration data without calling any quantizer that calibrates: nothing can be
    learned, and an empty result must not replace a good calibration. The model is unchanged.

    Attributes:
        names: the quantizers that were waiting for data.
        batches: how many batches ran.
    """

    def __init__(self, names: list[str], batches: int) -> None:
        self.names, self.batches = list(names), batches
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        super().__init__(f"Calibration reached no quantizer: the model ran on {batches} batch"
                         f"{'es' if batches != 1 else ''} without calling any of its {len(names)} quantizers "
                         f"({shown}). Nothing was changed (the previous calibration, if any, is kept). Check that "
                         "the model's forward goes through its quantized layers for this data (a fused fast path, a "
                         "branch on the input, or a different model than the one the layers were chosen on skips "
                         "them).")


class NonFiniteCalibrationError(ValueError):
    """Some quantizers saw no finite value (all NaN/Inf): no amax can be set. The model is unchanged.

    Attributes:
        names: the quantizers that saw no finite value.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        super().__init__(f"Calibration saw no finite value at {shown}: every value that reached "
                         f"{'it' if len(names) == 1 else 'them'} was NaN or Inf, so no range can be set. Check the "
                         "calibration data (or the model's output of the layers before) for NaN/Inf; nothing was "
                         "changed.")


class AmaxError(ValueError):
    """A quantizer's amax could not be computed by the method (e.g. entropy on a histogram with fewer bins than
    its start bin). The model is unchanged.

    Attributes:
        quantizer: the quantizer's name.
        method: the amax method that failed.
    """

    def __init__(self, quantizer: str, method: str, original: Exception) -> None:
        self.quantizer = quantizer
        self.method = method
        super().__init__(f"{quantizer}: the {method} amax cannot be computed: {original} Calibrate this quantizer "
                         f"with another method (max or percentile), or with more data; nothing was changed.")


@dataclass
class QuantizerCalibration:
    """What calibration found for one quantizer."""

    name: str
    amax: torch.Tensor  # on the CPU; the quantizer's own copy lives on the model's device
    method: str
    calibrator: str
    batches: int
    num_samples: int
    nonfinite_count: int
    max_value: float | None = None  # largest finite |x| seen
    choice: MethodChoice | None = None  # how "auto" picked ``method`` (None: the method was given)
    warnings: list[CalibrationWarning] = field(default_factory=list)  # about this quantizer's amax

    @property
    def amax_summary(self) -> str:
        if self.amax.numel() == 1:
            return f"{float(self.amax):.4g}"
        return f"[{float(self.amax.min()):.4g}, {float(self.amax.max()):.4g}] ({self.amax.numel()} channels)"


@dataclass
class CalibrationResult:
    """Everything a calibration run produced, by quantizer name."""

    quantizers: dict[str, QuantizerCalibration]
    method: str
    percentile: float
    num_batches: int
    wall_time_s: float
    device: str
    unused: list[str] = field(default_factory=list)  # quantizers no batch reached; left unchanged
    output_sqnr_db: float | None = None  # model output, INT8 vs FP32, pooled over ``sqnr_batches`` batches
    warnings: list[str] = field(default_factory=list)  # amax values that look collapsed, thin histograms
    collect_time_s: float = 0.0  # the passes over the data
    amax_time_s: float = 0.0  # computing amax from the statistics
    sqnr_batches: int = 0  # the batches the output SQNR covers (all of them, unless too big to keep)
    auto_time_s: float = 0.0  # measuring the candidates of "auto"
    # what the quantized model runs in, for "output SQNR <this> vs FP32" (a mix: FP8+INT4 W)
    quantized_as: str = "INT8"

    @property
    def nonfinite_total(self) -> int:
        return sum(q.nonfinite_count for q in self.quantizers.values())

    def summary(self) -> str:
        parts = [f"{len(self.quantizers)} quantizers calibrated ({self.method}) on {self.num_batches} batches "
                 f"in {self.wall_time_s:.2f} s"]
        if self.output_sqnr_db is not None:
            over = (f"all {self.num_batches} batches" if self.sqnr_batches == self.num_batches
                    else f"{self.sqnr_batches} of {self.num_batches} batches")
            parts.append(f"output SQNR {self.quantized_as} vs FP32 {self.output_sqnr_db:.1f} dB over {over}")
        picked = self.picked_methods()
        if picked:
            parts.append("auto picked " + ", ".join(f"{m} for {n}" for m, n in picked.items()))
        if self.nonfinite_total:
            parts.append(f"{self.nonfinite_total} NaN/Inf values left out")
        if self.unused:
            parts.append(f"{len(self.unused)} quantizers never reached: {', '.join(self.unused[:5])}")
        if self.warnings:
            parts.append(f"{len(self.warnings)} warnings")
        return "; ".join(parts)

    def picked_methods(self) -> dict[str, int]:
        """How many quantizers "auto" gave each method (empty when no method was chosen by auto)."""
        counts: dict[str, int] = {}
        for item in self.quantizers.values():
            if item.choice is not None:
                counts[item.method] = counts.get(item.method, 0) + 1
        return dict(sorted(counts.items(), key=lambda pair: -pair[1]))

    def quantizer_warnings(self) -> list[CalibrationWarning]:
        """The warnings that name one quantizer, in calibration order."""
        return [warning for item in self.quantizers.values() for warning in item.warnings]

