"""Mixed-precision search: a ladder of formats per unit, cheapest first, measured step by step.

The fallback search (:mod:`workbench.analysis.fallback`) knows two rungs, quantized and float. The ladder
generalises it to any list of precisions (``int8, fp8, float``; ``int4w, int8, float``): every unit starts
on the first rung, and the most sensitive unit on the lowest rung is promoted one rung at a time, each step
measured, until the goal is met. Two goals:

* a **target** (or a tolerance to FP32): the first mix that reaches it;
* a **size budget** in weight bytes (Model Optimizer's ``auto_quantize`` searches under an effective-bits
  budget): the best metric whose weights fit (with a target too, it stops once the target is met).

The search climbs one rung per pass, cheapest first: in the pass for a rung, each unit below it tries it,
most sensitive first, so every unit tries FP8 before any unit goes to float. A promotion is kept only
when it improves the measured metric (FP8 can be worse than INT8 on a layer whose values INT8's uniform
grid suits); one that does not is undone and shows in the curve as not kept.

A unit on a rung runs with the quantizers that rung gives it (``rung_of``: the model's own where the layer is
in that precision already, else those of a model calibrated in it); on ``float`` its quantizers are off.
The model is given back as it was.

Fusion-aware (given the layers' producers and consumers in the data flow, or else their model order): after the
climb, a quantized layer that is not a GEMM left alone among float layers is tried in float (a quantized GEMM with
float neighbours is TensorRT's normal W8A8 pattern and stays), and a layer in a format other than all its
neighbours' one (FP8 between INT8 layers) is tried in theirs (:mod:`workbench.quant.algorithms.format_rules`): each
move is measured and kept when the goal and the budget still hold, and the notes say what moved, or why a layer
stays. Layers set by hand (pins) are not searched. A search never ends "reached" on a mix that quantizes nothing:
it says it did not reach, and keeps the best mix that still quantizes.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.analysis.errors import AnalysisCancelled
from workbench.analysis.evaluator import Evaluator, materialise_batches, report_progress
from workbench.analysis.goals import resolve_goal
from workbench.analysis.metrics import Metric, get_metric
from workbench.analysis.results import SensitivityResult, encode_number
from workbench.analysis.sensitivity import measure_baselines, run_profile
from workbench.analysis.units import Unit, resolve_units
from workbench.export.naming import layer_of_quantizer
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.distributed import SINGLE
from workbench.quant.algorithms.format_rules import isolated_in_flow, order_neighbours, switches_in_flow
from workbench.quant.algorithms.precision import Precision, parse_precision, weight_bytes
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["LadderStep", "LadderResult", "ladder_search", "parse_ladder", "DEFAULT_LADDER", "LADDER_FORMAT",
           "RungSource", "LADDER_PRESETS", "ladder_text", "RungMix"]

LADDER_FORMAT = "workbench.ladder/1"
DEFAULT_LADDER = (Precision.INT8, Precision.FLOAT)  # today's fallback search
# the ladders menus offer (any other list of precisions can be typed)
LADDER_PRESETS = ("int8,float", "int8,fp8,float", "fp8,float", "int4w,int8,float", "int4w,fp8,float",
                  "nvfp4,fp8,float")


def ladder_text(ladder: Sequence[Precision | str]) -> str:
    """``[Precision.INT8, Precision.FLOAT]`` -> ``"int8,float"``."""
    return ",".join(parse_precision(p).value for p in ladder)

# (quantizer name, precision) -> the quantizer that runs it in that precision, or None: not available there
RungSource = Callable[[str, Precision], TensorQuantizer | None]


def parse_ladder(text: str | Sequence[str | Precision]) -> list[Precision]:
    """``"int8,fp8,float"`` -> the precisions, checked: known names, no repeats, at least two rungs."""
    items = [part for part in (text.split(",") if isinstance(text, str) else list(text))]
    ladder = [parse_precision(item.strip() if isinstance(item, str) else item) for item in items
              if not (isinstance(item, str) and not item.strip())]
    if len(ladder) < 2:
        raise ValueError(f"A ladder needs at least two precisions, cheapest first (e.g. int8,fp8,float); got "
                         f"{', '.join(p.value for p in ladder) or 'none'}.")
    repeated = sorted({p.value for p in ladder if ladder.count(p) > 1})
    if repeated:
        raise ValueError(f"A ladder names each precision once; {', '.join(repeated)} is repeated.")
    return ladder


@dataclass
class LadderStep:
    """One measured mix: ``unit`` moved to ``precision`` (step 0: every unit on the first rung)."""

    unit: str | None
    precision: str | None
    value: float
    weight_bytes: int
    kept: bool = True  # budget search: a promotion that did not improve the metric is undone

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "precision": self.precision, "value": encode_number(self.value),
                "weight_bytes": self.weight_bytes, "kept": self.kept}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LadderStep:
        value = data.get("value")
        return cls(data.get("unit"), data.get("precision"), math.nan if value is None else float(value),
                   int(data.get("weight_bytes", 0)), bool(data.get("kept", True)))


@dataclass
class LadderResult:
    """The outcome of :func:`ladder_search`.

    ``precisions`` holds every layer's format in the chosen mix (layers outside the search keep theirs),
    ``units`` each searched unit's rung, ``value`` the metric reached, ``weight_bytes`` the mix's weights
    against ``float_bytes`` (all float), ``steps`` the curve of metric against bytes.
    """

    metric: dict[str, Any]
    ladder: list[str]
    fp32: float
    start: float  # every unit on the first rung
    value: float
    reached: bool
    precisions: dict[str, str]
    units: dict[str, str]
    weight_bytes: int
    float_bytes: int
    steps: list[LadderStep]
    ranking: list[str]
    target: float | None = None
    tolerance: float | None = None
    budget_bytes: int | None = None
    sensitivity: SensitivityResult | None = None
    notes: list[str] = field(default_factory=list)
    applied: bool = False
    wall_time_s: float = 0.0
    complete: bool = True
    walk: str = ""  # how it measured when not by whole-model passes (block_search: "blocks: ..."); "": whole model
    # the search also searched the layers set by hand (the user's choice, shown again when the project reopens)
    revisit_pins: bool = False

    @property
    def promoted(self) -> dict[str, str]:
        """The units off the first rung, with their rung."""
        return {name: rung for name, rung in self.units.items() if rung != self.ladder[0]}

    def plot_data(self) -> tuple[list[int], list[float]]:
        """x (weight bytes) and y (metric) of every kept step, in order."""
        kept = [s for s in self.steps if s.kept]
        return [s.weight_bytes for s in kept], [s.value for s in kept]

    def summary(self) -> str:
        if self.budget_bytes is not None:
            goal = f"budget {self.budget_bytes} bytes"
        elif self.tolerance is not None:
            goal = f"within {self.tolerance:g} of FP32"
        else:
            goal = f"target {self.target:g}"
        counts: dict[str, int] = {}
        for precision in self.precisions.values():
            counts[precision] = counts.get(precision, 0) + 1
        mix = ", ".join(f"{n} {p}" for p, n in counts.items())
        ratio = self.weight_bytes / self.float_bytes if self.float_bytes else math.nan
        return (f"ladder {'/'.join(self.ladder)} ({goal}) {'reached' if self.reached else 'not reached'}: "
                f"{self.value:.4g} (FP32 {self.fp32:.4g}, all {self.ladder[0]} {self.start:.4g}); layers: {mix}; "
                f"weights {self.weight_bytes} bytes = {ratio:.1%} of float"
                + (f"; measured block by block ({self.walk})" if self.walk else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"format": LADDER_FORMAT, "metric": dict(self.metric), "ladder": list(self.ladder),
                "fp32": encode_number(self.fp32), "start": encode_number(self.start),
                "value": encode_number(self.value), "reached": self.reached, "precisions": dict(self.precisions),
                "units": dict(self.units), "weight_bytes": self.weight_bytes, "float_bytes": self.float_bytes,
                "steps": [s.to_dict() for s in self.steps], "ranking": list(self.ranking), "target": self.target,
                "tolerance": self.tolerance, "budget_bytes": self.budget_bytes,
                "sensitivity": None if self.sensitivity is None else self.sensitivity.to_dict(),
                "notes": list(self.notes), "applied": self.applied, "wall_time_s": self.wall_time_s,
                "complete": self.complete, **({"walk": self.walk} if self.walk else {}),
                **({"revisit_pins": True} if self.revisit_pins else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LadderResult:
        if data.get("format") != LADDER_FORMAT:
            raise ValueError(f"not a ladder search result (format {data.get('format')!r}, expected {LADDER_FORMAT})")

        def number(key: str) -> float:
            value = data.get(key)
            return math.nan if value is None else float(value)

        sensitivity = data.get("sensitivity")
        return cls(metric=dict(data.get("metric") or {}), ladder=list(data["ladder"]), fp32=number("fp32"),
                   start=number("start"), value=number("value"), reached=bool(data.get("reached")),
                   precisions=dict(data.get("precisions") or {}), units=dict(data.get("units") or {}),
                   weight_bytes=int(data.get("weight_bytes", 0)), float_bytes=int(data.get("float_bytes", 0)),
                   steps=[LadderStep.from_dict(s) for s in data.get("steps") or []],
                   ranking=list(data.get("ranking") or []), target=data.get("target"),
                   tolerance=data.get("tolerance"), budget_bytes=data.get("budget_bytes"),
                   sensitivity=None if sensitivity is None else SensitivityResult.from_dict(sensitivity),
                   notes=list(data.get("notes") or []), applied=bool(data.get("applied")),
                   wall_time_s=float(data.get("wall_time_s", 0.0)), complete=bool(data.get("complete", True)),
                   walk=str(data.get("walk") or ""), revisit_pins=bool(data.get("revisit_pins", False)))


class RungMix:
    """Which quantizer objects run each unit on each rung; switching a unit swaps them into the model."""

    def __init__(self, model: nn.Module, units: list[Unit], ladder: list[Precision], rung_of: RungSource,
                 own: Mapping[str, Precision | None]) -> None:
        self.model = model
        self.ladder = ladder
        self.units = units
        self.slots: dict[str, tuple[nn.Module, str, TensorQuantizer]] = {}  # name -> (parent, attr, own)
        for unit in units:
            for name in unit.quantizers:
                parent_name, _, attr = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                self.slots[name] = (parent, attr, parent._modules[attr])
        self.choices: dict[tuple[str, Precision], list[TensorQuantizer] | None] = {}
        for unit in units:
            layers = {layer_of_quantizer(q)[0] for q in unit.quantizers}
            for precision in ladder:
                if precision is Precision.FLOAT:
                    self.choices[(unit.name, precision)] = [self.slots[q][2] for q in unit.quantizers]
                    continue
                found = [rung_of(q, precision) for q in unit.quantizers]
                if all(own.get(layer) is precision for layer in layers):
                    found = [self.slots[q][2] for q in unit.quantizers]
                self.choices[(unit.name, precision)] = None if any(q is None for q in found) else found
        self.enabled = {id(q): q.is_enabled for qs in self.choices.values() if qs for q in qs}
        self.level = {unit.name: 0 for unit in units}

    def available(self, unit: Unit, level: int) -> bool:
        return self.choices[(unit.name, self.ladder[level])] is not None

    def first_level(self, unit: Unit) -> int | None:
        return next((i for i in range(len(self.ladder)) if self.available(unit, i)), None)

    def set(self, unit: Unit, level: int) -> None:
        precision = self.ladder[level]
        objects = self.choices[(unit.name, precision)]
        assert objects is not None
        for name, quantizer in zip(unit.quantizers, objects):
            parent, attr, _ = self.slots[name]
            parent._modules[attr] = quantizer
            if precision is Precision.FLOAT or not self.enabled[id(quantizer)]:
                quantizer.disable()
            else:
                quantizer.enable()
        self.level[unit.name] = level

    def restore(self) -> None:
        for parent, attr, own in self.slots.values():
            parent._modules[attr] = own
        for objects in self.choices.values():
            for quantizer in objects or []:
                quantizer.enable() if self.enabled[id(quantizer)] else quantizer.disable()


def ladder_search(model: nn.Module, batches: Iterable, metric: Metric | str, *, ladder: Sequence[Precision | str],
                  rung_of: RungSource, precisions: Mapping[str, Precision | None], target: float | None = None,
                  tolerance: float | None = None, budget_bytes: int | None = None,
                  ranking: SensitivityResult | None = None, units: Any = None, num_batches: int | None = None,
                  progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                  output: str | None = None, block_sizes: Mapping[str, int] | None = None,
                  layer_order: Sequence[str] | None = None,
                  neighbours: Mapping[str, tuple[set[str], set[str]]] | None = None,
                  gemms: Collection[str] = (), pins: Collection[str] = (),
                  on_partial: Callable[[LadderResult], None] | None = None) -> LadderResult:
    """Choose a precision per unit from ``ladder`` (cheapest first) for a goal: ``target``/``tolerance``
    (the cheapest mix that reaches it) or ``budget_bytes`` (the best metric whose weights fit; with a
    ``target`` too, the search stops once it is reached). A tolerance where FP32 is infinite (SQNR) counts
    from the all-quantized value (:func:`workbench.analysis.goals.resolve_goal`).

    Args:
        model: the calibrated quantized model (each layer in ``precisions``).
        rung_of: the quantizer that runs a quantizer's place in a precision (see :data:`RungSource`).
        precisions: every layer's precision now (None: custom descriptors).
        ranking: the order to promote units in (most sensitive first); None: a one-off profile first.
        units: as for :func:`~workbench.analysis.sensitivity` (layers by default).
        block_sizes: each int4w layer's block size, for the weight bytes.
        layer_order: the layers in model order; given, the mix found is made fusion-friendly where the goal
            allows (see the module's docstring). None: no such pass.
        neighbours: each layer's (producers, consumers) in the data flow
            (:func:`workbench.analysis.layer_flow.record_layer_flow`); None: the layers before and after it in
            ``layer_order``.
        gemms: the layers that are GEMMs (weights, activation products): a quantized one alone among float
            layers is the normal W8A8 pattern, not moved to float.
        pins: layers set by hand: the units holding them are not searched, they keep their precision.
        on_partial: called with the search so far (an incomplete :class:`LadderResult`: the steps measured) after
            each measurement, so a chart can fill as it runs.

    Returns:
        A :class:`LadderResult`: the mix chosen, its value and weight bytes, and every step tried.

    Raises:
        ValueError: no goal or two goals, a bad ladder, a budget below zero, a tolerance with nothing finite to
            count from.
        AnalysisCancelled, AnalysisError, MetricError: as for the sensitivity analysis; the model is unchanged.
    """
    chosen_metric = get_metric(metric)
    rungs = parse_ladder(list(ladder))
    if (tolerance is None) == (target is None) and budget_bytes is None:
        raise ValueError("Give the ladder one goal: target= (the value to reach), tolerance= (the gap to FP32) or "
                         "budget_bytes= (the weight bytes to fit).")
    if tolerance is not None and target is not None:
        raise ValueError("Give either target= or tolerance=, not both.")
    if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                                     or budget_bytes < 0):
        raise ValueError(f"budget_bytes must be a non-negative integer, got {budget_bytes!r}.")
    batch_list = materialise_batches(batches, num_batches)
    started = time.perf_counter()
    candidates = resolve_units(model, units) if ranking is None else []
    blocks = dict(block_sizes or {})
    layers = list(precisions)

    def mix_bytes(mix: Mapping[str, Precision | None]) -> int:
        return weight_bytes(model, mix, block_size=blocks)

    float_bytes = mix_bytes({layer: Precision.FLOAT for layer in layers})
    steps: list[LadderStep] = []
    profile: SensitivityResult | None = None
    fp32 = start = math.nan
    order: list[Unit] = []
    state: RungMix | None = None
    skipped: list[str] = []
    held: list[str] = []  # units of pinned layers
    pinned = set(pins)
    fusion_notes: list[str] = []
    nothing = False  # the search ended on a mix that quantizes nothing
    best_quantized: list[Any] = []  # [value, levels] of the best measured mix that quantizes something

    def quantizes(mix: Mapping[str, Precision | None]) -> bool:
        return any(p is not None and p is not Precision.FLOAT for p in mix.values())

    def seen(value: float) -> None:
        """A mix was measured (and is the state now): remember it when it is the best that quantizes anything."""
        if state is not None and quantizes(current_mix()) and (
                not best_quantized or better(value, best_quantized[0])):
            best_quantized[:] = [value, dict(state.level)]

    def within(value: float) -> bool:
        if tolerance is not None:
            return chosen_metric.within_tolerance(value, fp32, tolerance)
        if target is None:
            return False
        return value >= target if chosen_metric.higher_is_better else value <= target

    def better(value: float, than: float) -> bool:
        if math.isnan(than):
            return not math.isnan(value)
        return value > than if chosen_metric.higher_is_better else value < than

    def current_mix() -> dict[str, Precision | None]:
        mix = dict(precisions)
        if state is not None:
            for unit in order:
                for quantizer in unit.quantizers:
                    mix[layer_of_quantizer(quantizer)[0]] = rungs[state.level[unit.name]]
        return mix

    def result(complete: bool) -> LadderResult:
        kept = [s for s in steps if s.kept]
        value = kept[-1].value if kept else math.nan
        if budget_bytes is not None and kept:
            fitting = [s for s in kept if s.weight_bytes <= budget_bytes]
            value = fitting[-1].value if fitting else value
        mix = current_mix()
        goal_met = within(value) if (target is not None or tolerance is not None) else bool(kept)
        if budget_bytes is not None:
            goal_met = goal_met and mix_bytes(mix) <= budget_bytes
        return LadderResult(metric=chosen_metric.to_dict(), ladder=[p.value for p in rungs], fp32=fp32, start=start,
                            value=value, reached=goal_met,
                            precisions={k: (v.value if v is not None else "custom") for k, v in mix.items()},
                            units={u.name: rungs[state.level[u.name]].value for u in order} if state else {},
                            weight_bytes=mix_bytes(mix), float_bytes=float_bytes, steps=list(steps),
                            ranking=[u.name for u in order], target=target, tolerance=tolerance,
                            budget_bytes=budget_bytes, sensitivity=profile,
                            wall_time_s=time.perf_counter() - started, complete=complete)

    total = 2 + len(candidates) + 1
    done = 0

    published = [0]  # steps already given to on_partial

    def climbing(done_now: int, total_now: int, message: str) -> None:
        """A step's report, and the steps so far (when there is a new one) for a chart that fills as it runs."""
        report_progress(progress, done_now, total_now, message)
        if on_partial is not None and len(steps) > published[0]:
            published[0] = len(steps)
            on_partial(result(complete=False))
    with ModelSnapshot(model), torch.no_grad():
        evaluator = Evaluator(model, batch_list, chosen_metric, cancel, output)
        try:
            fp32, quantized = measure_baselines(evaluator, progress, total, SINGLE)
            done = 2
            goal = resolve_goal(tolerance=tolerance, target=target, fp32=fp32, quantized=quantized,
                                higher_is_better=chosen_metric.higher_is_better, metric_name=chosen_metric.name)
            tolerance, target = goal.tolerance, goal.target  # FP32 infinite (SQNR): a tolerance is a target
            if ranking is None:
                profile = run_profile(evaluator, candidates, "one-off", fp32=fp32, quantized=quantized, cache=True,
                                      progress=progress, done=done, total=total, started=started)
                done += len(candidates)
                by_name = {u.name: u for u in candidates}
                order = [by_name[u.name] for u in profile.ranked()]
            else:
                from workbench.analysis.fallback import units_from_names

                order = units_from_names(model, [Unit(u.name, tuple(u.quantizers)) for u in ranking.ranked()])
            evaluator.configure("quantized")
            state = RungMix(model, order, rungs, rung_of, precisions)
            for unit in order:  # every unit on its cheapest available rung
                layers = {layer_of_quantizer(q)[0] for q in unit.quantizers}
                level = state.first_level(unit)
                # a layer with hand-made descriptors (no precision) keeps them, and one set by hand (a pin) keeps its
                # precision: the ladder does not overwrite them
                if layers & pinned:
                    held.append(unit.name)
                    continue
                if level is None or any(layer in precisions and precisions[layer] is None for layer in layers):
                    skipped.append(unit.name)
                    continue
                state.set(unit, level)
            order = [u for u in order if u.name not in skipped and u.name not in held]
            report_progress(progress, done, total, f"measuring every unit on the first rung ({rungs[0].value})")
            start = evaluator.measure("ladder", None)
            steps.append(LadderStep(None, None, start, mix_bytes(current_mix())))
            seen(start)
            total = done + 1 + sum(len(rungs) - 1 - state.level[u.name] for u in order)
            done += 1
            climbing(done, total, f"all on the first rung: {start:.4g}")
            _climb(state, order, evaluator, steps, within, better, current_mix, mix_bytes, budget_bytes, climbing,
                   done, total, stop=budget_bytes is None or target is not None or tolerance is not None, seen=seen)
            if layer_order is not None or neighbours is not None:
                kept = [s for s in steps if s.kept]

                def holds(value: float, best: float = kept[-1].value) -> bool:
                    # a goal to reach: still reached; a budget alone: no worse than the mix found
                    return within(value) if target is not None or tolerance is not None else not better(best, value)

                around = neighbours if neighbours is not None else order_neighbours(layer_order or [])
                fusion_notes = _fusion_moves(state, order, evaluator, steps, holds, current_mix, mix_bytes,
                                             budget_bytes, around, set(gemms), seen)
            nothing = not quantizes(current_mix())
            if nothing and best_quantized:  # never "reached" by quantizing nothing: the best mix that quantizes
                for unit in order:
                    state.set(unit, best_quantized[1][unit.name])
            outcome = result(complete=True)
            outcome.notes += fusion_notes
            if nothing:
                outcome.reached = False
                if best_quantized:
                    outcome.value = best_quantized[0]
                outcome.notes.append(
                    "not reached: only a mix with every layer in float met the goal, and that quantizes nothing"
                    + (f"; the best mix that still quantizes is kept ({best_quantized[0]:.4g})" if best_quantized
                       else ""))
        except AnalysisCancelled as cancelled:
            cancelled.partial = result(complete=False) if steps else None
            raise
        finally:
            if state is not None:
                state.restore()
    if goal.note:
        outcome.notes.append(goal.note)
    if held:
        outcome.notes.append(f"kept as set by hand (pins; revisit them to search them too): "
                             f"{', '.join(held[:5])}{'...' if len(held) > 5 else ''}")
    if skipped:
        outcome.notes.append(f"not searched (custom descriptors, or no rung of {'/'.join(p.value for p in rungs)} "
                             f"applies): "
                             f"{', '.join(skipped[:5])}{'...' if len(skipped) > 5 else ''}")
    if budget_bytes is not None and steps and steps[0].weight_bytes > budget_bytes:
        outcome.notes.append(f"even the first rung ({rungs[0].value}) needs {steps[0].weight_bytes} bytes, over the "
                             f"budget of {budget_bytes}")
    elif not outcome.reached and budget_bytes is None and not nothing:
        outcome.notes.append("every unit reached the last rung without meeting the goal")
    report_progress(progress, total, total, outcome.summary())
    return outcome


def _fusion_moves(state: RungMix, order: list[Unit], evaluator: Evaluator, steps: list[LadderStep],
                  holds: Callable[[float], bool], current_mix, mix_bytes, budget: int | None,
                  neighbours: Mapping[str, tuple[set[str], set[str]]], gemms: set[str],
                  seen: Callable[[float], None]) -> list[str]:
    """Move each layer TensorRT would not fuse with its neighbours in the data flow (``neighbours``: producers and
    consumers) to their format where the goal still holds: a quantized layer that is not a GEMM (``gemms``) alone
    among float layers to float, a format switch to the neighbours' format. The cases are found again after each
    move (one move changes the next layer's neighbours); each move is measured (a step of the curve), and one that
    misses the goal or the budget is undone. Returns notes on every case."""
    unit_of = {layer_of_quantizer(q)[0]: unit for unit in order for q in unit.quantizers}

    def words() -> dict[str, str]:
        return {k: (v.value if v is not None else "custom") for k, v in current_mix().items()}

    def cases() -> list[tuple[str, Precision, str]]:
        mix = words()
        found = [(layer, Precision.FLOAT, f"{layer} would run {precision} alone, every layer it reads from and "
                                          f"writes to in float ({', '.join(around[:3])}): a reformat on each side")
                 for layer, precision, around in isolated_in_flow(neighbours, mix, gemms)]
        found += [(layer, Precision(other), f"{layer} would run {precision} while every layer it reads from and "
                                            f"writes to runs {other} ({', '.join(around[:3])}), a format switch "
                                            "TensorRT does not fuse")
                  for layer, precision, other, around in switches_in_flow(neighbours, mix)]
        return found

    notes = []
    tried: set[str] = set()
    while True:
        pending = [case for case in cases() if case[0] not in tried]
        if not pending:
            return notes
        layer, precision, why = pending[0]
        tried.add(layer)
        unit = unit_of.get(layer)
        level = state.ladder.index(precision) if precision in state.ladder else None
        if unit is None or level is None or not state.available(unit, level):
            notes.append(f"{why}: {precision.value} is not a rung it can take here, so it stays")
            continue
        previous = state.level[unit.name]
        state.set(unit, level)
        size = mix_bytes(current_mix())
        if budget is not None and size > budget:
            state.set(unit, previous)
            notes.append(f"{why}: in {precision.value} it would not fit the budget, so it stays")
            continue
        value = evaluator.measure("ladder", unit.name)
        kept = holds(value)
        steps.append(LadderStep(unit.name, precision.value, value, size, kept))
        if kept:
            seen(value)
            notes.append(f"moved to {precision.value}: {why}; the goal still holds ({value:.4g})")
        else:
            state.set(unit, previous)
            notes.append(f"{why}: in {precision.value} the goal is missed ({value:.4g}), so it stays")


def _climb(state: RungMix, order: list[Unit], evaluator: Evaluator, steps: list[LadderStep], within, better,
           current_mix, mix_bytes, budget: int | None, progress, done: int, total: int, *, stop: bool,
           seen: Callable[[float], None]) -> None:
    """One pass per rung above the first, cheapest first: in each, the units in ranking order (most sensitive
    first) try that rung; a promotion is kept only when it improves the metric (and fits ``budget``). With
    ``stop``, the search ends as soon as the goal is met."""
    best = steps[-1].value
    for level in range(1, len(state.ladder)):
        for unit in order:
            if stop and within(best):
                return
            previous = state.level[unit.name]
            if previous >= level or not state.available(unit, level):
                continue
            state.set(unit, level)
            size = mix_bytes(current_mix())
            if budget is not None and size > budget:
                state.set(unit, previous)
                continue
            # the candidate being measured, before its pass (one pass is seconds on a large model)
            progress(done, total, f"measuring {unit.name} in {state.ladder[level].value}")
            value = evaluator.measure("ladder", unit.name)
            kept = better(value, best)
            steps.append(LadderStep(unit.name, state.ladder[level].value, value, size, kept))
            done += 1
            report_progress(progress, done, total, f"ladder: {unit.name} -> {state.ladder[level].value}: "
                                                    f"{value:.4g}{'' if kept else ' (no better: undone)'}")
            if kept:
                best = value
                seen(value)
            else:
                state.set(unit, previous)
