"""The fallback search one block at a time: the fewest units to leave in float for an output SQNR goal, each unit's
cost measured at its block's output with one block's weights resident (:mod:`workbench.analysis.block_search`).

Two rungs per unit: as configured (quantized) and float. With costs that add, the fewest units reach the goal when
the costliest go to float first, which is the order :func:`~workbench.analysis.block_search.choose` takes; the
chosen set is then measured end to end (a checking walk) and tightened when it misses.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from torch import nn

from workbench.analysis.block_search import (
    WalkOptions,
    blocks_or_refuse,
    choose_and_check,
    cost_walk,
    db_ratio,
    ratio_db,
)
from workbench.analysis.errors import AnalysisCancelled
from workbench.analysis.evaluator import materialise_batches, report_progress
from workbench.analysis.goals import resolve_goal
from workbench.analysis.metrics import get_metric
from workbench.analysis.results import FallbackPoint, FallbackResult
from workbench.analysis.units import Unit, UnitsSpec, resolve_units
from workbench.plurals import count_text
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["block_fallback_search", "OnOrFloat"]


class OnOrFloat:
    """The fallback's two levels per unit: 0 its quantizers as configured, 1 float (off)."""

    def __init__(self, model: nn.Module, units: Sequence[Unit]) -> None:
        self.model = model
        self.enabled = {name: model.get_submodule(name).is_enabled for unit in units for name in unit.quantizers}

    def rungs(self, unit: Unit) -> list[int]:
        return [0, 1]

    def set(self, unit: Unit, level: int) -> None:
        for name in unit.quantizers:
            quantizer: TensorQuantizer = self.model.get_submodule(name)
            quantizer.enable() if level == 0 and self.enabled[name] else quantizer.disable()

    def is_float(self, level: int) -> bool:
        return level == 1

    def label(self, level: int) -> str:
        return "float" if level == 1 else "quantized"


def block_fallback_search(model: nn.Module, batches: Iterable, *, tolerance: float | None = None,
                          target: float | None = None, max_units: int | None = None, units: UnitsSpec = None,
                          candidates: Sequence[Unit] | None = None, num_batches: int | None = None,
                          options: WalkOptions | None = None) -> FallbackResult:
    """The units of the calibrated quantized ``model`` to leave in float so its output SQNR reaches ``target`` dB
    (or ``tolerance`` dB above the all-quantized value), searched one block at a time (see the module's docstring).

    Args:
        units: the units searched (layers by default); ``candidates``: those units already resolved (a ranking's),
            instead.
        max_units: the most units to leave in float.
        options: the walks' residency, device, activation budget, output entry, progress and cancel.
    Returns:
        A :class:`FallbackResult` over the metric "sqnr" (the model output's, end to end), ``walk`` set; its curve's
        first and last points measured, the ones between predicted. The model is left as it came in.
    Raises:
        ValueError: a model without repeated blocks, neither or both of tolerance and target, a bad max_units.
        AnalysisCancelled, CalibrationError: a set cancel (the model unchanged), a block that fails (named).
    """
    if (tolerance is None) == (target is None):
        raise ValueError("Give either tolerance= (dB above the all-quantized output SQNR) or target= (the output "
                         "SQNR in dB to reach), not both or neither.")
    for name, value in (("tolerance", tolerance), ("target", target)):
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number of dB, got {value!r}.")
    if max_units is not None and (isinstance(max_units, bool) or not isinstance(max_units, int) or max_units < 0):
        raise ValueError(f"max_units must be a non-negative integer or None, got {max_units!r}.")
    blocks = blocks_or_refuse(model, "The fallback search")
    searched = list(candidates) if candidates is not None else resolve_units(model, units)
    batch_list = materialise_batches(batches, num_batches)
    options = options or WalkOptions()
    metric = get_metric("sqnr").to_dict()
    started = time.perf_counter()
    levels = OnOrFloat(model, searched)
    start = {unit.name: 0 for unit in searched}
    with ModelSnapshot(model):
        try:
            costs = cost_walk(model, blocks, batch_list, searched, levels, start, options)
        except AnalysisCancelled as cancelled:
            cancelled.partial = None
            raise
        quantized = ratio_db(costs.start_ratio)
        goal = resolve_goal(tolerance=tolerance, target=target, fp32=math.inf, quantized=quantized,
                            higher_is_better=True, metric_name="output SQNR")
        goal_db = goal.target if goal.target is not None else quantized
        ranking = sorted(searched, key=lambda unit: -costs.cost[unit.name][0])
        try:
            choice, measured, notes = choose_and_check(
                model, blocks, batch_list, searched, levels, start, costs, options, target_ratio=db_ratio(goal_db),
                size=lambda unit, level: float(level), limit=max_units)
        except AnalysisCancelled as cancelled:
            cancelled.partial = None
            raise
    by_name = {unit.name: unit for unit in searched}
    chosen = [by_name[name] for name, _, _, _ in choice.moves]
    curve = [FallbackPoint(0, None, quantized)]
    curve += [FallbackPoint(count, name, ratio_db(predicted))
              for count, (name, _, predicted, _) in enumerate(choice.moves, start=1)]
    curve[-1] = FallbackPoint(curve[-1].num_float, curve[-1].unit, ratio_db(measured))
    value = curve[-1].value
    result = FallbackResult(metric=metric, fp32=math.inf, quantized=quantized, tolerance=None, target=goal_db,
                            chosen=chosen, curve=curve, reached=value >= goal_db,
                            ranking=[unit.name for unit in ranking], wall_time_s=time.perf_counter() - started,
                            walk=f"{blocks.describe()}, {costs.num_batches} batches")
    if goal.note:
        result.notes.append(goal.note)
    result.notes.append(_curve_note(len(choice.moves)))
    result.notes += notes
    if chosen and len(chosen) == len(searched):
        result.reached = False
        result.notes.append("not reached: only leaving every unit in float met the goal, which quantizes nothing")
    elif not result.reached:
        result.notes.append(f"stopped after {len(chosen)} of {count_text(len(searched), 'unit')}"
                            + (f" (max_units={max_units})" if max_units is not None else "")
                            + " without reaching the goal")
    report_progress(options.progress, 1, 1, result.summary())
    return result


def _curve_note(moves: int) -> str:
    if moves <= 1:
        return "measured end to end block by block: the output SQNR against the float model's"
    return ("measured end to end block by block: the first and the last point of the curve; the points between are "
            "predicted from each unit's noise at its block's output (noise powers added)")
