"""Automatic fallback: the fewest units to leave in float so the metric is close enough to FP32.

Greedy, in sensitivity order, as a deployment engineer does by hand: starting from everything
quantized, leave the most sensitive unit in float, re-measure, then the next, until the metric is
within a tolerance of FP32 (or reaches a target) or the budget of units is spent. Every step is
measured, not predicted from the ranking, so interactions between layers are accounted for.

Fusion-aware (given the layers' model order): a quantized layer left alone between two layers the search put
in float runs INT8 between float kernels, and TensorRT pays a reformat on each side of it
(:func:`~workbench.quant.algorithms.format_rules.isolated_layers`, the lint's ``isolated_quantized_layer``). After the
search each such layer is tried in float as well; it joins the chosen set when the goal is still met (measured),
and a note says so, or why it stays.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import torch
from torch import nn

from workbench.analysis.errors import AnalysisCancelled
from workbench.analysis.evaluator import Evaluator, check_ranks_agree, materialise_batches, report_progress
from workbench.analysis.goals import resolve_goal
from workbench.analysis.metrics import Direction, Metric, get_metric
from workbench.analysis.results import SCHEMES, FallbackPoint, FallbackResult, SensitivityResult
from workbench.analysis.sensitivity import measure_baselines, run_profile
from workbench.analysis.units import Unit, UnitsSpec, find_units, quantizers_of, resolve_units
from workbench.export.naming import layer_of_quantizer
from workbench.plurals import count_text
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.distributed import SINGLE, DistContext
from workbench.quant.algorithms.format_rules import isolated_in_flow, order_neighbours
from workbench.quant.algorithms.snapshot import ModelSnapshot

__all__ = ["fallback_search", "apply_fallback", "units_from_names"]

Ranking = SensitivityResult | Sequence["str | Unit"]


def units_from_names(model: nn.Module, names: Iterable[str | Unit]) -> list[Unit]:
    """Units for names: a quantized layer's name gives its default unit, any other module name its subtree.

    Raises:
        ValueError: an unknown name, or one without quantizers that quantize.
    """
    layers = {u.name: u for u in find_units(model)}
    units = []
    for name in names:
        if isinstance(name, Unit):
            for quantizer in name.quantizers:
                quantizers_of(model, quantizer)  # exists
            units.append(name)
        elif name in layers:
            units.append(layers[name])
        else:
            units.extend(resolve_units(model, [name]))
    return units


def _ranking_units(model: nn.Module, ranking: Ranking) -> list[Unit]:
    if isinstance(ranking, SensitivityResult):
        return units_from_names(model, [Unit(u.name, tuple(u.quantizers)) for u in ranking.ranked()])
    if isinstance(ranking, (str, bytes)) or not isinstance(ranking, Sequence):
        raise TypeError("ranking must be a SensitivityResult or a list of unit names, most sensitive first; "
                        f"got {type(ranking).__name__}.")
    return units_from_names(model, ranking)


def fallback_search(model: nn.Module, batches: Iterable, metric: Metric | str, *, tolerance: float | None = None,
                    max_units: int | None = None, ranking: Ranking | None = None, target: float | None = None,
                    scheme: str = "one-off", units: UnitsSpec = None, direction: Direction | None = None,
                    apply: bool = False, num_batches: int | None = None, progress: ProgressCallback | None = None,
                    cancel: CancelToken | None = None, cache: bool = True,
                    context: DistContext | None = None, output: str | None = None,
                    layer_order: Sequence[str] | None = None,
                    precisions: Mapping[str, str] | None = None,
                    neighbours: Mapping[str, tuple[set[str], set[str]]] | None = None,
                    gemms: Collection[str] = (),
                    on_partial: Callable[[FallbackResult], None] | None = None) -> FallbackResult:
    """Find the most sensitive units to leave in float until the metric is within ``tolerance`` of FP32.

    Starting from the model as configured (all quantized), the units are left in float one at a time
    in ranking order, re-measuring after each, until the metric is within ``tolerance`` of the FP32
    metric (in the metric's own units and direction), or reaches ``target``, or ``max_units`` are in
    float. The model is not changed unless ``apply=True`` (or :func:`apply_fallback` is called later).

    Args:
        model, batches, metric, direction, num_batches, progress, cancel, cache, output: as for
            :func:`~workbench.analysis.sensitivity`.
        tolerance: the largest acceptable gap to FP32 (e.g. ``0.01`` for one point of top-1 accuracy).
            Where FP32 is infinite (SQNR) it counts from the all-quantized value and becomes a target
            (:func:`workbench.analysis.goals.resolve_goal`; the result's notes say so).
        max_units: the most units to leave in float (None: as many as needed).
        ranking: the order to try units in: a :class:`SensitivityResult` or names, most sensitive
            first. None: a ``scheme`` sensitivity profile over ``units`` is computed first.
        target: instead of a tolerance, the value to reach (e.g. 30 for SQNR in dB, whose FP32 value
            is infinite).
        scheme, units: for the profile computed when no ranking is given.
        apply: leave the chosen units in float on the model (their quantizers disabled) at the end.
        context: the process's place in a distributed job (None: one process). The profile's units
            are shared among the ranks, and each round of the search measures ``world_size``
            candidate sets at once (the next 1, 2, ... units in float), one per rank; the first
            that meets the goal ends the search. The result equals the one-process result (the
            sets measured past the answer are dropped); every rank returns it.
        layer_order: the quantizable layers in model order; given, the search is fusion-aware (see the
            module's docstring): a layer the chosen set would leave quantized alone between float layers is
            left in float too when the goal still holds. None: the plain greedy search.
        precisions: each layer's precision now ("int8", "fp8", "float", ...; a layer missing counts as
            int8), for the fusion check: a layer already in float is a float neighbour.
        neighbours: each layer's (producers, consumers) in the data flow
            (:func:`workbench.analysis.layer_flow.record_layer_flow`); None: its neighbours in ``layer_order``.
        gemms: the layers that are GEMMs: a quantized GEMM among float layers is TensorRT's normal W8A8 pattern,
            never moved to float by the fusion check.
        on_partial: called with the search so far (an incomplete :class:`FallbackResult`: its curve up to the
            last measurement) after the baselines and after each measurement, so a chart can fill as it runs
            (rank 0 only).

    A search whose only mix meeting the goal leaves nothing quantized does not count as reached: it says so and
    keeps the best mix that still quantizes something.

    Returns:
        A :class:`FallbackResult` with the chosen units and the curve of metric against units in float.

    Raises:
        ValueError: neither or both of tolerance and target, a negative tolerance, a tolerance where
            neither FP32 nor the quantized model scores a finite value, bad units or ranking.
        AnalysisCancelled, AnalysisError, MetricError: as for :func:`~workbench.analysis.sensitivity`;
            the model is unchanged.
    """
    chosen_metric = get_metric(metric, direction)
    context = context or SINGLE
    progress = context.main_only(progress)
    on_partial = on_partial if context.is_main else None
    if (tolerance is None) == (target is None):
        raise ValueError("Give either tolerance= (the largest acceptable gap to the FP32 metric) or target= "
                         "(the value to reach), not both or neither.")
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}.")
    if target is not None and not math.isfinite(target):
        raise ValueError(f"target must be a finite number, got {target!r}.")
    if max_units is not None and (isinstance(max_units, bool) or not isinstance(max_units, int) or max_units < 0):
        raise ValueError(f"max_units must be a non-negative integer or None, got {max_units!r}.")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}.")
    order = None if ranking is None else _ranking_units(model, ranking)
    profile_units = resolve_units(model, units) if order is None else []
    batch_list = materialise_batches(batches, num_batches)
    check_ranks_agree(context, batch_list, model, "fallback search",
                      [scheme, chosen_metric.to_dict(), tolerance, target, max_units, output,
                       [u.name for u in order or profile_units]])
    started = time.perf_counter()
    candidates = len(order) if order is not None else len(profile_units)
    limit = candidates if max_units is None else min(max_units, candidates)
    total = 2 + (len(profile_units) if order is None else 0) + limit
    done = 0

    curve: list[FallbackPoint] = []
    chosen: list[Unit] = []
    fused_notes: list[str] = []
    profile: SensitivityResult | None = None
    fp32 = quantized = math.nan

    def within(value: float) -> bool:
        if tolerance is not None:
            return chosen_metric.within_tolerance(value, fp32, tolerance)
        return value >= target if chosen_metric.higher_is_better else value <= target

    def result(complete: bool) -> FallbackResult:
        return FallbackResult(metric=chosen_metric.to_dict(), fp32=fp32, quantized=quantized, tolerance=tolerance,
                              target=target, chosen=list(chosen), curve=list(curve),
                              reached=bool(curve) and within(curve[-1].value),
                              ranking=[u.name for u in order or []], sensitivity=profile,
                              wall_time_s=time.perf_counter() - started, complete=complete)

    def publish() -> None:  # the curve so far, for a chart that fills as the search runs
        if on_partial is not None:
            on_partial(result(complete=False))

    with ModelSnapshot(model), torch.no_grad():
        evaluator = Evaluator(model, batch_list, chosen_metric, cancel, output)
        try:
            fp32, quantized = measure_baselines(evaluator, progress, total, context)
            done += 2
            goal = resolve_goal(tolerance=tolerance, target=target, fp32=fp32, quantized=quantized,
                                higher_is_better=chosen_metric.higher_is_better, metric_name=chosen_metric.name)
            tolerance, target = goal.tolerance, goal.target  # FP32 infinite (SQNR): a tolerance is a target
            if order is None:
                profile = run_profile(evaluator, profile_units, scheme, fp32=fp32, quantized=quantized, cache=cache,
                                      progress=progress, done=done, total=total, started=started,
                                      context=context)
                done += len(profile_units)
                by_name = {u.name: u for u in profile_units}
                order = [by_name[u.name] for u in profile.ranked()]
            curve.append(FallbackPoint(0, None, quantized))
            publish()
            while not within(curve[-1].value) and len(chosen) < limit:
                # one round: rank r measures the next r + 1 units in float (one process: the next one)
                sizes = list(range(len(chosen) + 1, min(len(chosen) + context.world_size, limit) + 1))
                mine = sizes[context.rank] if context.rank < len(sizes) else None
                value = None
                if mine is not None:
                    # the candidate being measured, before its pass (one pass is seconds on a large model)
                    report_progress(progress, done, total, f"measuring {order[mine - 1].name} in float "
                                                           f"({mine} in float)")
                    evaluator.configure("quantized", off=[q for unit in order[:mine]
                                                          for q in evaluator.quantizer_objects(unit)])
                    value = evaluator.measure("fallback", order[mine - 1].name)
                for size, measured in zip(sizes, context.all_gather(value)):
                    chosen.append(order[size - 1])
                    curve.append(FallbackPoint(size, order[size - 1].name, measured))
                    done += 1
                    report_progress(progress, done, total, f"fallback: {size} in float, last {order[size - 1].name}")
                    publish()
                    if within(measured):  # the sets measured past this one are not needed
                        break
            if (layer_order is not None or neighbours is not None) and within(curve[-1].value):
                flow = neighbours if neighbours is not None else order_neighbours(layer_order or [])
                fused_notes = _float_isolated(evaluator, order, chosen, curve, within, flow, set(gemms),
                                              precisions or {}, model)
        except AnalysisCancelled as cancelled:
            if cancelled.partial is not None and profile is None:
                profile = cancelled.partial
            cancelled.partial = result(complete=False) if curve or profile is not None else None
            raise
    outcome = result(complete=True)
    if goal.note:
        outcome.notes.append(goal.note)
    outcome.notes += fused_notes
    if outcome.reached and precisions is not None:
        _keep_something_quantized(outcome, chosen, curve, precisions)
    if not outcome.reached:
        outcome.notes.append(f"stopped after {len(chosen)} of {count_text(candidates, 'unit')}"
                             + (f" (max_units={max_units})" if max_units is not None and limit < candidates else "")
                             + " without reaching the goal")
    if apply:
        apply_fallback(model, chosen)
        outcome.applied = True
    report_progress(progress, total, total, outcome.summary())
    return outcome


def _layers_of(unit: Unit) -> list[str]:
    return list(dict.fromkeys(layer_of_quantizer(q)[0] for q in unit.quantizers))


def _keep_something_quantized(outcome: FallbackResult, chosen: list[Unit], curve: list[FallbackPoint],
                              precisions: Mapping[str, str]) -> None:
    """A "reached" that leaves every quantized layer in float is no quantization at all: say it was not reached,
    and keep the best mix on the curve that still quantizes a layer (``outcome`` changes)."""
    quantized = {layer for layer, precision in precisions.items() if precision not in ("float", "custom")}

    def remaining(count: int) -> set[str]:
        return quantized - {layer for unit in chosen[:count] for layer in _layers_of(unit)}

    if not quantized or remaining(len(chosen)):
        return
    keep = [point for point in curve if remaining(point.num_float)]
    outcome.reached = False
    if not keep:
        outcome.notes.append("not reached: only leaving every layer in float met the goal, which quantizes nothing")
        return
    higher = outcome.metric.get("direction", "higher") == "higher"
    best = max(keep, key=lambda p: p.value) if higher else min(keep, key=lambda p: p.value)
    del chosen[best.num_float:]
    outcome.chosen = list(chosen)
    outcome.curve.append(FallbackPoint(best.num_float, None, best.value))
    outcome.notes.append(f"not reached: only leaving every quantized layer in float met the goal, which quantizes "
                         f"nothing; kept the best mix that still quantizes: {count_text(best.num_float, 'unit')} "
                         f"in float ({best.value:.4g})")


def _float_isolated(evaluator: Evaluator, order: list[Unit], chosen: list[Unit], curve: list[FallbackPoint],
                    within, flow: Mapping[str, tuple[set[str], set[str]]], gemms: set[str],
                    precisions: Mapping[str, str], model: nn.Module) -> list[str]:
    """Leave in float, too, each quantized layer other than a GEMM that ``chosen`` leaves alone among float layers
    (its producers and consumers in ``flow``), where the goal still holds with it in float (measured); ``chosen``
    and ``curve`` grow. The cases are found again after each move. Returns the notes saying what was done, or why
    a layer stays isolated."""
    mix = {layer: precisions.get(layer, "int8") for layer in flow}
    for unit in chosen:
        mix.update({layer: "float" for layer in _layers_of(unit) if layer in mix})
    units = {layer: unit for unit in order for layer in _layers_of(unit)}
    notes = []
    tried: set[str] = set()
    while True:
        pending = [case for case in isolated_in_flow(flow, mix, gemms) if case[0] not in tried]
        if not pending:
            return notes
        layer, precision, around = pending[0]
        tried.add(layer)
        unit = units.get(layer)
        if unit is None:
            try:
                unit = units_from_names(model, [layer])[0]
            except (ValueError, IndexError):
                continue
        evaluator.configure("quantized", off=[q for u in chosen + [unit] for q in evaluator.quantizer_objects(u)])
        value = evaluator.measure("fallback", unit.name)
        alone = (f"{layer} would run {precision} alone, every layer it reads from and writes to in float "
                 f"({', '.join(around[:3])}): TensorRT adds a reformat on each side (the lint's "
                 "isolated_quantized_layer)")
        if within(value):
            chosen.append(unit)
            curve.append(FallbackPoint(len(chosen), unit.name, value))
            mix.update({name: "float" for name in _layers_of(unit) if name in mix})
            notes.append(f"also left in float: {alone}; the goal still holds ({value:.4g})")
        else:
            notes.append(f"{alone}: in float too the goal is missed ({value:.4g}), so it stays {precision}")


def apply_fallback(model: nn.Module, units: FallbackResult | Iterable[str | Unit]) -> list[str]:
    """Leave ``units`` in float: disable their quantizers. Returns the names of the quantizers disabled.

    Args:
        model: the quantized model.
        units: a :class:`FallbackResult` (its chosen units), or units or names (see :func:`units_from_names`).
    """
    chosen = units.chosen if isinstance(units, FallbackResult) else units_from_names(model, units)
    disabled = []
    for unit in chosen:
        for name in unit.quantizers:
            model.get_submodule(name).disable()
            disabled.append(name)
    return disabled
