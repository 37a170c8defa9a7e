"""The exceptions an analysis raises; each names the unit it happened on, so the GUI can point at it."""
from __future__ import annotations

from typing import Any

__all__ = ["AnalysisError", "MetricError", "AnalysisCancelled"]

# What was being measured when something went wrong.
STAGE_WORDS = {
    "fp32": "on the FP32 model (every quantizer off)",
    "quantized": "on the all-quantized model",
    "one-off": "with unit {unit!r} left in float (one-off)",
    "one-on": "with only unit {unit!r} quantized (one-on)",
    "fallback": "with {unit!r} and the units before it left in float (fallback search)",
}


def describe_stage(stage: str, unit: str | None) -> str:
    """Words for a stage and unit, e.g. "with unit 'conv2' left in float (one-off)"."""
    return STAGE_WORDS.get(stage, stage).format(unit=unit)


class AnalysisError(RuntimeError):
    """The model failed during an analysis; the model's quantizers are as they were before the call.

    Attributes:
        unit: the unit being measured (None for the FP32 and all-quantized passes).
        stage: ``"fp32"``, ``"quantized"``, ``"one-off"``, ``"one-on"`` or ``"fallback"``.
        batch_index: the batch the model failed on, when known.
        original: the exception raised, if any.
    """

    def __init__(self, message: str, *, unit: str | None, stage: str, batch_index: int | None = None,
                 original: BaseException | None = None) -> None:
        super().__init__(message)
        self.unit = unit
        self.stage = stage
        self.batch_index = batch_index
        self.original = original


class MetricError(AnalysisError):
    """The metric raised, or returned a value that is not a finite number.

    Attributes:
        metric: the metric's display name.
        value: the value it returned (None when it raised).
    """

    def __init__(self, metric: str, *, unit: str | None, stage: str, value: Any = None,
                 original: BaseException | None = None, batch_index: int | None = None) -> None:
        where = describe_stage(stage, unit)
        if original is not None:
            message = f"Metric {metric!r} failed {where}: {type(original).__name__}: {original}"
        else:
            message = f"Metric {metric!r} returned {value!r} {where}; a metric must return a finite number."
        super().__init__(message, unit=unit, stage=stage, batch_index=batch_index, original=original)
        self.metric = metric
        self.value = value


class AnalysisCancelled(Exception):
    """The analysis was cancelled; the model's quantizers are as they were before the call.

    Attributes:
        partial: what was measured before the cancel (a :class:`SensitivityResult` with the units done
            so far, or a :class:`FallbackResult` with the curve so far), or None if nothing was.
    """

    def __init__(self, message: str, partial: Any = None) -> None:
        super().__init__(message)
        self.partial = partial
