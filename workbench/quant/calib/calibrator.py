"""Base class of calibrators: they watch tensors go by and propose an amax."""
from __future__ import annotations

from typing import Any


class Calibrator:
    """Collects statistics of the tensors it is shown and computes an amax from them.

    Args:
        num_bits: number of bits of the quantizer it calibrates.
        axis: None (per tensor) or the axis/axes that keep their own amax.
        unsigned: whether the quantizer is unsigned.
    """

    def __init__(self, num_bits: Any, axis: Any, unsigned: bool) -> None:
        self._num_bits = num_bits
        self._axis = axis
        self._unsigned = unsigned
        # statistics every calibrator reports, so a run can say what it saw
        self._batches_seen = 0
        self._values_seen = 0
        self._nonfinite_count = 0

    @property
    def num_bits(self):
        return self._num_bits

    @property
    def axis(self):
        return self._axis

    @axis.setter
    def axis(self, value) -> None:
        self._axis = value

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @property
    def batches_seen(self) -> int:
        """How many tensors were collected since the last reset."""
        return self._batches_seen

    @property
    def values_seen(self) -> int:
        """How many values (elements) were collected since the last reset, non-finite ones included."""
        return self._values_seen

    @property
    def nonfinite_count(self) -> int:
        """How many NaN or infinite values were seen and left out of the statistics."""
        return self._nonfinite_count

    def collect(self, x) -> None:
        """Collect statistics of tensor ``x``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget everything collected."""
        raise NotImplementedError

    def compute_amax(self, *args, **kwargs):
        """The amax the collected statistics call for (a tensor), or None before any data."""
        raise NotImplementedError

    def _reset_counters(self) -> None:
        self._batches_seen = 0
        self._values_seen = 0
        self._nonfinite_count = 0

    def __repr__(self) -> str:
        return f"num_bits={self._num_bits} axis={self._axis} unsigned={self._unsigned}"


# pytorch-quantization's name for this class (pytorch_quantization.calib.calibrator._Calibrator)
_Calibrator = Calibrator
