"""FP32 against INT8 on the same batches: a metric's value for each model, and the output SQNR between them.

Any metric works: a built-in output metric (measured from the outputs of one pass per model, the FP32
outputs kept as the reference), or a user function that runs the model itself (then the output SQNR
takes a pass of its own per model).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.analysis.evaluator import Evaluator, report_progress
from workbench.analysis.metrics import Metric, OutputMetric, SqnrMetric, get_metric
from workbench.quant.algorithms.batches import select_output
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.snapshot import ModelSnapshot

__all__ = ["Evaluation", "evaluate_models"]


@dataclass
class Evaluation:
    """A metric measured on the FP32 and the INT8 model, and the INT8 output's SQNR against FP32."""

    metric: dict[str, Any]  # Metric.to_dict(): kind, name, direction (and an entry point's spec)
    fp32: float
    int8: float
    output_sqnr_db: float
    num_batches: int
    quantized_as: str = "INT8"  # what the quantized model runs in ("FP8", "FP8+INT4 W"): its column's name

    @property
    def name(self) -> str:
        return str(self.metric.get("name"))

    @property
    def delta(self) -> float:
        """INT8 minus FP32, in the metric's units."""
        return self.int8 - self.fp32 if math.isfinite(self.fp32) and math.isfinite(self.int8) else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"metric": dict(self.metric), "fp32": self.fp32, "int8": self.int8,
                "delta": self.delta if math.isfinite(self.delta) else None,
                "output_sqnr_db": self.output_sqnr_db, "num_batches": self.num_batches,
                "quantized_as": self.quantized_as}

    def summary(self) -> str:
        return (f"{self.name}: FP32 {_number(self.fp32)}, {self.quantized_as} {_number(self.int8)} "
                f"({self.metric.get('direction')} "
                f"is better); output SQNR {_number(self.output_sqnr_db)} dB on {self.num_batches} batches")


def _as_selected(selected: Any, output: str | None) -> Any:
    """An output whose ``select_output(..., output)`` is ``selected`` (the entry picked already)."""
    return {output: selected} if output is not None and output != "" else selected


def _number(value: float) -> str:
    return "inf" if value == math.inf else f"{value:.4g}"


def evaluate_models(fp32_model: nn.Module, int8_model: nn.Module, batches: Sequence[Any], metric: Metric | str, *,
                    progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                    output: str | None = None, quantized_outputs: Mapping[int, Any] | None = None) -> Evaluation:
    """``metric`` on ``fp32_model`` and ``int8_model`` over ``batches``, and the output SQNR between them.

    Both models are left as they were (mode, quantizer states). ``metric`` is a :class:`Metric` or a
    built-in name; a user metric is resolved (and trusted) by the caller. ``output`` names the output entry
    compared (see :func:`~workbench.quant.algorithms.batches.select_output`).
    ``quantized_outputs``: ``int8_model``'s outputs on some of ``batches`` by index (the compared entry, as
    ``select_output`` picks it), computed already (an export's parity check ran them): those batches are not run
    again. A built-in output metric only; a user function runs the model itself.

    Raises:
        ValueError: no batches. AnalysisError, MetricError, AnalysisCancelled: as the analysis raises them.
    """
    chosen = get_metric(metric)
    batches = list(batches)
    if not batches:
        raise ValueError("No batches: the evaluation data yielded nothing.")
    total = 2 if isinstance(chosen, OutputMetric) else 4
    with ModelSnapshot(fp32_model), ModelSnapshot(int8_model), torch.no_grad():
        reference = Evaluator(fp32_model, batches, chosen, cancel, output)
        quantized = Evaluator(int8_model, batches, chosen, cancel, output)
        report_progress(progress, 0, total, f"{chosen.name}: FP32")
        if isinstance(chosen, OutputMetric):
            fp32 = reference.measure("fp32", keep_outputs=True)
            quantized.reference = reference.reference
            outputs: list[Any] = []

            given = dict(quantized_outputs or {})

            def run_and_keep(i: int) -> Any:
                outputs.append(_as_selected(given.pop(i), output) if i in given else quantized._call_model(i))
                return outputs[-1]

            report_progress(progress, 1, total, f"{chosen.name}: INT8")
            int8 = quantized.measure("quantized", run_batch=run_and_keep)
            sqnr = SqnrMetric().start()
            for raw, ref, batch in zip(outputs, reference.reference or [], batches):
                sqnr.update(select_output(raw, output), ref, batch)  # the reference holds the chosen part
            output_sqnr = sqnr.value()
        else:  # the metric runs the models itself: the outputs for the SQNR take their own passes
            fp32 = reference.measure("fp32")
            report_progress(progress, 1, total, f"{chosen.name}: INT8")
            int8 = quantized.measure("quantized")
            sqnr_reference = Evaluator(fp32_model, batches, SqnrMetric(), cancel, output)
            sqnr_quantized = Evaluator(int8_model, batches, SqnrMetric(), cancel, output)
            report_progress(progress, 2, total, "output SQNR: FP32")
            sqnr_reference.measure("fp32", keep_outputs=True)
            sqnr_quantized.reference = sqnr_reference.reference
            report_progress(progress, 3, total, "output SQNR: INT8")
            output_sqnr = sqnr_quantized.measure("quantized")
    report_progress(progress, total, total, "evaluated")
    return Evaluation(chosen.to_dict(), fp32, int8, output_sqnr, len(batches))
