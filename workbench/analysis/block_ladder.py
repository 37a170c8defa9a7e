"""The precision ladder one block at a time: a precision per unit for an output SQNR goal or a weight-byte budget,
each unit's cost on each rung measured at its block's output with one block's weights resident
(:mod:`workbench.analysis.block_search`), then one global choice (AutoQuantize's: noise removed per weight byte
added, under one budget) checked end to end.

A unit on a rung runs with the quantizers that rung gives it (``rung_of``, as the whole-model ladder takes it: the
model's own where the layer already runs that precision, else those of a model calibrated in it, which a lazily
opened model calibrates one block at a time too). Pins and custom layers are not searched. No fusion clean-up
here: it measures moves one by one on whole-model passes; the mix's notes still name the hazards in model order.
"""
from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Mapping, Sequence

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
from workbench.analysis.ladder import LadderResult, LadderStep, RungMix, RungSource, parse_ladder
from workbench.analysis.metrics import get_metric
from workbench.analysis.units import Unit, UnitsSpec, resolve_units
from workbench.export.naming import layer_of_quantizer
from workbench.quant.algorithms.precision import Precision, weight_bytes
from workbench.quant.algorithms.snapshot import ModelSnapshot

__all__ = ["block_ladder_search", "RungLevels"]


AS_SET = -1  # the level of a unit the ladder does not search (a pin, custom descriptors): as the model has it


class RungLevels:
    """A ladder's rungs as the block search's levels: ``level`` indexes the ladder; a unit takes the rungs from its
    first available one up that it has quantizers for. A unit not searched has the one level :data:`AS_SET`: its
    noise is costed (it is part of every mix's) but it is never moved."""

    def __init__(self, mix: RungMix, first: Mapping[str, int]) -> None:
        self.mix, self.first = mix, first

    def rungs(self, unit: Unit) -> list[int]:
        if unit.name not in self.first:
            return [AS_SET]
        return [level for level in range(self.first[unit.name], len(self.mix.ladder))
                if self.mix.available(unit, level)]

    def set(self, unit: Unit, level: int) -> None:
        if level != AS_SET:
            self.mix.set(unit, level)

    def is_float(self, level: int) -> bool:
        return level != AS_SET and self.mix.ladder[level] is Precision.FLOAT

    def label(self, level: int) -> str:
        return "as set" if level == AS_SET else self.mix.ladder[level].value


def _layers(unit: Unit) -> set[str]:
    return {layer_of_quantizer(q)[0] for q in unit.quantizers}


def block_ladder_search(model: nn.Module, batches: Iterable, *, ladder: Sequence[Precision | str],
                        rung_of: RungSource, precisions: Mapping[str, Precision | None], target: float | None = None,
                        tolerance: float | None = None, budget_bytes: int | None = None, units: UnitsSpec = None,
                        candidates: Sequence[Unit] | None = None, num_batches: int | None = None,
                        block_sizes: Mapping[str, int] | None = None, pins: Collection[str] = (),
                        options: WalkOptions | None = None) -> LadderResult:
    """Choose a precision per unit from ``ladder`` (cheapest first) one block at a time (see the module's
    docstring): the cheapest mix whose output SQNR reaches ``target`` dB (or ``tolerance`` dB above every unit on
    the first rung), or the least noise whose weights fit ``budget_bytes`` (with a target too, the cheapest that
    reaches it within the budget).

    Args:
        rung_of, precisions, block_sizes, pins: as :func:`~workbench.analysis.ladder.ladder_search` takes them.
        units: the units searched (layers by default); ``candidates``: those units already resolved, instead.
        options: the walks' residency, device, activation budget, output entry, progress and cancel.
    Returns:
        A :class:`LadderResult` over the metric "sqnr" (the model output's, end to end), ``walk`` set; its steps'
        first and last values measured, the ones between predicted. The model is left as it came in.
    Raises:
        ValueError: a model without repeated blocks, no goal or two, a bad ladder or budget.
        AnalysisCancelled, CalibrationError: a set cancel (the model unchanged), a block that fails (named).
    """
    rungs = parse_ladder(ladder if isinstance(ladder, str) else list(ladder))
    if (tolerance is None) == (target is None) and budget_bytes is None:
        raise ValueError("Give the ladder one goal: target= (the output SQNR in dB to reach), tolerance= (dB above "
                         "every unit on the first rung) or budget_bytes= (the weight bytes to fit).")
    if tolerance is not None and target is not None:
        raise ValueError("Give either target= or tolerance=, not both.")
    if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                                     or budget_bytes < 0):
        raise ValueError(f"budget_bytes must be a non-negative integer, got {budget_bytes!r}.")
    blocks = blocks_or_refuse(model, "The ladder search")
    everyone = list(candidates) if candidates is not None else resolve_units(model, units)
    batch_list = materialise_batches(batches, num_batches)
    options = options or WalkOptions()
    started = time.perf_counter()
    sizes = dict(block_sizes or {})

    def mix_bytes(mix: Mapping[str, Precision | None]) -> int:
        return weight_bytes(model, mix, block_size=sizes)

    float_bytes = mix_bytes({layer: Precision.FLOAT for layer in precisions})
    state = RungMix(model, everyone, rungs, rung_of, precisions)
    held, skipped, searched, first = [], [], [], {}
    pinned = set(pins)
    for unit in everyone:
        layers = _layers(unit)
        level = state.first_level(unit)
        if layers & pinned:
            held.append(unit.name)
        elif level is None or any(layer in precisions and precisions[layer] is None for layer in layers):
            skipped.append(unit.name)
        else:
            first[unit.name] = level
            searched.append(unit)

    def mix_of(levels: Mapping[str, int]) -> dict[str, Precision | None]:
        mix = dict(precisions)
        for unit in searched:
            mix.update({layer: rungs[levels[unit.name]] for layer in _layers(unit)})
        return mix

    start_bytes = mix_bytes(mix_of(first))
    unit_bytes = {(unit.name, level): mix_bytes(mix_of({**first, unit.name: level})) - start_bytes
                  for unit in searched for level in range(len(rungs))
                  if level >= first[unit.name] and state.available(unit, level)}
    levels = RungLevels(state, first)
    # the units not searched are walked too: their noise is in every mix's, so the predictions count it
    fixed = [unit for unit in everyone if unit.name not in first]
    walked = searched + fixed
    start_levels = {**first, **{unit.name: AS_SET for unit in fixed}}

    def size(unit: Unit, level: int) -> float:
        return 0.0 if level == AS_SET else float(unit_bytes[(unit.name, level)])

    try:
        with ModelSnapshot(model):
            costs = cost_walk(model, blocks, batch_list, walked, levels, start_levels, options)
            start = ratio_db(costs.start_ratio)
            goal = resolve_goal(tolerance=tolerance, target=target, fp32=math.inf, quantized=start,
                                higher_is_better=True, metric_name="output SQNR")
            goal_db = goal.target
            choice, measured, notes = choose_and_check(
                model, blocks, batch_list, walked, levels, start_levels, costs, options,
                target_ratio=None if goal_db is None else db_ratio(goal_db), size=size,
                budget_size=None if budget_bytes is None else float(budget_bytes - start_bytes))
    except AnalysisCancelled as cancelled:
        cancelled.partial = None
        raise
    finally:
        state.restore()
    steps = [LadderStep(None, None, start, start_bytes)]
    steps += [LadderStep(name, rungs[level].value, ratio_db(predicted), start_bytes + int(used))
              for name, level, predicted, used in choice.moves]
    steps[-1] = LadderStep(steps[-1].unit, steps[-1].precision, ratio_db(measured), steps[-1].weight_bytes)
    final = mix_of(choice.levels)
    value = ratio_db(measured)
    final_bytes = mix_bytes(final)
    reached = (value >= goal_db if goal_db is not None else True) and (
        budget_bytes is None or final_bytes <= budget_bytes)
    ranking = sorted(searched, key=lambda unit: -costs.cost[unit.name][first[unit.name]])
    result = LadderResult(metric=get_metric("sqnr").to_dict(), ladder=[p.value for p in rungs], fp32=math.inf,
                          start=start, value=value, reached=reached,
                          precisions={k: (v.value if v is not None else "custom") for k, v in final.items()},
                          units={u.name: rungs[choice.levels[u.name]].value for u in searched},
                          weight_bytes=final_bytes, float_bytes=float_bytes, steps=steps,
                          ranking=[u.name for u in ranking], target=goal_db, tolerance=None,
                          budget_bytes=budget_bytes, wall_time_s=time.perf_counter() - started,
                          walk=f"{blocks.describe()}, {costs.num_batches} batches")
    if goal.note:
        result.notes.append(goal.note)
    result.notes.append("measured end to end block by block: the first and the last step; the steps between are "
                        "predicted from each unit's noise at its block's output (noise powers added)"
                        if len(choice.moves) > 1 else
                        "measured end to end block by block: the output SQNR against the float model's")
    result.notes += notes
    if searched and all(levels.is_float(choice.levels[u.name]) for u in searched) and not held and not skipped:
        result.reached = False
        result.notes.append("not reached: only a mix with every layer in float met the goal, and that quantizes "
                            "nothing")
    elif not result.reached and budget_bytes is not None and start_bytes > budget_bytes:
        result.notes.append(f"even the first rung ({rungs[0].value}) needs {start_bytes} bytes, over the budget of "
                            f"{budget_bytes}")
    elif not result.reached:
        result.notes.append("no promotion left that removes noise without meeting the goal")
    if held:
        result.notes.append(f"kept as set by hand (pins; revisit them to search them too): "
                            f"{', '.join(held[:5])}{'...' if len(held) > 5 else ''}")
    if skipped:
        result.notes.append(f"not searched (custom descriptors, or no rung of {'/'.join(p.value for p in rungs)} "
                            f"applies): {', '.join(skipped[:5])}{'...' if len(skipped) > 5 else ''}")
    report_progress(options.progress, 1, 1, result.summary())
    return result
