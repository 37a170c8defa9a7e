"""The amax methods a histogram calibrator chooses amax by, and their parameters: the one vocabulary every
check, menu and ``--help`` reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["AmaxMethod", "AMAX_METHODS", "SINGLE_METHODS", "DEFAULT_AMAX_METHOD", "Parameter", "PERCENTILE",
           "PERCENTILE_FLOOR",
           "percentile_mistake", "UnknownMethodError"]


class UnknownMethodError(ValueError, TypeError):
    """An amax method name that does not exist (a ValueError; a TypeError too, as the original raised)."""


@dataclass(frozen=True)
class Parameter:
    """A number an amax method takes, with its default and valid range (``low_open``: low itself is not valid)."""

    name: str
    default: float
    low: float
    high: float
    low_open: bool = False
    unit: str = ""
    help: str = ""

    def describe(self) -> str:
        """The valid range as text, e.g. ``a number in (0, 100]``."""
        return f"a number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def contains(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def check(self, value: Any) -> float:
        """``value`` as a float when it is in range, else a ValueError that says the range."""
        if not self.contains(value):
            raise ValueError(f"The {self.name} is {self.describe()}, got {value!r} (out of range).")
        return float(value)


PERCENTILE = Parameter("percentile", 99.99, 0.0, 100.0, low_open=True, unit="%",
                       help="the share of |x| values amax keeps in range, in %")

# A percentile under this is almost certainly a fraction typed where a percent was meant (0.999 for 99.9):
# valid for the calibrator, refused by the project's settings unless the user insists (the CLI's --force).
PERCENTILE_FLOOR = 50.0


def percentile_mistake(percentile: float) -> str | None:
    """Why ``percentile`` (in percent, within :data:`PERCENTILE`'s range) is almost certainly a mistake, with
    the value likely meant; None when it looks intended (at least :data:`PERCENTILE_FLOOR`)."""
    if percentile >= PERCENTILE_FLOOR:
        return None
    candidates = ([percentile * 100] if 0 < percentile <= 1 else []) + [100 - percentile]
    meant = next(c for c in candidates if c >= PERCENTILE_FLOOR)
    return (f"The percentile is in percent: {percentile:g} would set amax where only {percentile:g}% of the "
            f"values lie below it, clipping almost everything; did you mean {round(meant, 6):g}?")


class AmaxMethod(str, Enum):
    """How amax is chosen from a quantizer's histogram (max-calibrated quantizers always use max)."""

    ENTROPY = "entropy"
    MSE = "mse"
    PERCENTILE = "percentile"
    MAX = "max"
    # not a search of its own: every method above is tried and the one whose layer output is closest to
    # FP32 on the calibration batches wins, per quantizer (workbench.quant.algorithms.auto_method)
    AUTO = "auto"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        """The numbers this method takes (percentile: the percentile)."""
        return (PERCENTILE,) if self is AmaxMethod.PERCENTILE else ()

    @classmethod
    def parse(cls, value: Any) -> AmaxMethod:
        """The method named ``value``; UnknownMethodError naming the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise UnknownMethodError(f"Unknown calibration method {value!r}; choose one of "
                                     f"{', '.join(AMAX_METHODS)}.") from None

    @property
    def is_single(self) -> bool:
        """Whether this method computes amax from a histogram alone (every method but ``auto``)."""
        return self is not AmaxMethod.AUTO

    @classmethod
    def singles(cls) -> tuple[AmaxMethod, ...]:
        """The methods that compute amax from a histogram alone: the candidates ``auto`` chooses among."""
        return tuple(method for method in cls if method.is_single)

    @classmethod
    def help_text(cls) -> str:
        """One line for a ``--help``: every method and what it does."""
        return "; ".join(f"{method.value}: {method.description}" for method in cls)

    def __str__(self) -> str:
        return self.value


_DESCRIPTIONS = {
    AmaxMethod.ENTROPY: "minimise the KL divergence of the quantized histogram (TensorRT's)",
    AmaxMethod.MSE: "minimise the mean squared quantization error",
    AmaxMethod.PERCENTILE: "keep the given percentile of |x| in range",
    AmaxMethod.MAX: "the largest |x| seen",
    AmaxMethod.AUTO: "per quantizer, the method whose layer output is closest to FP32 on the calibration batches",
}

AMAX_METHODS: tuple[str, ...] = tuple(method.value for method in AmaxMethod)
SINGLE_METHODS: tuple[str, ...] = tuple(method.value for method in AmaxMethod.singles())
# new projects choose per quantizer from the data; a project keeps the method stored in its settings
DEFAULT_AMAX_METHOD = AmaxMethod.AUTO
