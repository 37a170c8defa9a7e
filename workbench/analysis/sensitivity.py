"""Sensitivity analysis: which quantized units cost the metric, one unit at a time.

The two schemes of NVIDIA's yolov5/BEVFusion scripts (``reference/004``, "敏感层分析"):

* ``"one-off"``: everything quantized, each unit in turn left in float; the metric *regained* says how
  much that unit costs in the deployed model, interactions with the other layers included.
* ``"one-on"``: everything in float, each unit in turn quantized alone; the metric *lost* is the unit's
  own damage (the reference's ``build_sensitivity_profile``).

With an output metric, each pass can start at the unit instead of at the model's inputs: what comes
before is computed in the scheme's baseline configuration and is the same in every pass, so it is run
once per batch and cached (:mod:`workbench.analysis.prefix_cache`); results are identical to the
plain loop, which is used when the model cannot be traced or the metric runs the model itself. With the
cache on, a weight quantizer's fake-quantized weight is also computed once and reused while the quantizer
stays on (:mod:`workbench.analysis.weight_cache`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from workbench.analysis.errors import AnalysisCancelled, AnalysisError, describe_stage
from workbench.analysis.evaluator import (
    Evaluator,
    check_ranks_agree,
    materialise_batches,
    report_progress,
    same_output,
)
from workbench.analysis.metrics import Direction, Metric, ModelMetric, OutputMetric, get_metric
from workbench.analysis.prefix_cache import PrefixPlan, build_plan
from workbench.analysis.results import SCHEMES, SensitivityResult, UnitResult, difference, rank_units
from workbench.analysis.units import Unit, UnitsSpec, resolve_units
from workbench.analysis.weight_cache import WeightQuantCache
from workbench.quant.algorithms.batches import to_device
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.distributed import SINGLE, DistContext, deal, shard
from workbench.quant.algorithms.snapshot import ModelSnapshot

__all__ = ["sensitivity"]


def sensitivity(model: nn.Module, batches: Iterable, metric: Metric | str, *, scheme: str = "one-off",
                units: UnitsSpec = None, progress: ProgressCallback | None = None,
                cancel: CancelToken | None = None, direction: Direction | None = None,
                num_batches: int | None = None, cache: bool = True,
                context: DistContext | None = None, output: str | None = None) -> SensitivityResult:
    """Measure ``metric`` with each unit of ``model`` toggled, and rank the units.

    The model is left exactly as it came in (quantizer flags and amax, train/eval mode), whether the
    run succeeds, fails or is cancelled. Quantizers the caller disabled stay disabled throughout and
    belong to no default unit. Passes run in eval mode under ``torch.no_grad()`` with calibration off.

    Args:
        model: a calibrated quantized model.
        batches: an iterable of batches (tensors, ``(inputs, labels)`` tuples, or dicts of inputs); it
            is read once and kept, so every pass sees the same data.
        metric: a :class:`Metric`, a built-in name (``"sqnr"``, ``"cosine"``, ``"mse"``, ``"top1"``), an
            entry point (``"module:function"`` or ``"file.py:function"``, called ``fn(model, batches)``),
            or such a function.
        scheme: ``"one-off"`` or ``"one-on"`` (see the module docstring).
        units: None for every quantized layer, or groups (see :func:`~workbench.analysis.resolve_units`).
        progress: called as ``progress(done, total, message)`` after the FP32 pass, the all-quantized
            pass and each unit.
        cancel: anything with ``is_set()``; checked before every batch, so between units too.
        direction: ``"higher"`` or ``"lower"`` is better; required for entry points and functions.
        num_batches: use only the first batches.
        cache: let passes start from cached activations where the model allows it (see
            ``result.cache`` and ``result.cache_note`` for what was done), and weight quantizers that
            stay on reuse their fake-quantized weight from pass to pass. Costs memory: the values
            crossing the current cut point are kept for every batch at once, and one copy of the
            fake-quantized weights.
        output: the output entry to compare (``logits``, a tuple index); default: see
            :func:`~workbench.quant.algorithms.batches.select_output`.
        context: the process's place in a distributed job (None: one process). Every rank computes
            the FP32 reference and the all-quantized metric once, measures its share of the units
            (dealt back and forth in model order), and every rank returns the whole result, equal to the
            one-process result; only rank 0 reports progress (summed over the ranks).

    Returns:
        A :class:`SensitivityResult`.

    Raises:
        ValueError, TypeError: bad arguments or units; EntryPointError: the metric cannot be loaded.
        AnalysisCancelled: ``cancel`` was set (``partial`` holds the units measured so far).
        AnalysisError: the model failed (``unit`` and ``stage`` say where).
        MetricError: the metric raised or returned a non-finite number (``unit`` says where).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}.")
    chosen_metric = get_metric(metric, direction)
    unit_list = resolve_units(model, units)
    batch_list = materialise_batches(batches, num_batches)
    started = time.perf_counter()
    total = len(unit_list) + 2
    context = context or SINGLE
    progress = context.main_only(progress)
    check_ranks_agree(context, batch_list, model, "sensitivity analysis",
                      [scheme, chosen_metric.to_dict(), [u.name for u in unit_list], output, cache])
    with ModelSnapshot(model), torch.no_grad():
        evaluator = Evaluator(model, batch_list, chosen_metric, cancel, output)
        fp32, quantized = measure_baselines(evaluator, progress, total, context)
        return run_profile(evaluator, unit_list, scheme, fp32=fp32, quantized=quantized, cache=cache,
                           progress=progress, done=2, total=total, started=started, context=context)


def measure_baselines(evaluator: Evaluator, progress: ProgressCallback | None, total: int,
                      context: DistContext) -> tuple[float, float]:
    """The FP32 metric (keeping the reference outputs) and the all-quantized metric: progress steps 1 and 2.

    Distributed, with a metric of the outputs: each rank runs the model on its share of the batches
    in each configuration and the ranks exchange the outputs, so that every rank holds all reference
    outputs (and batch 0's output, which checks a prefix plan) for half the passes; the metric is
    then computed from the exchanged outputs, the same numbers as one process. A metric that runs
    the model itself is measured by every rank.
    """
    if not (context.distributed and isinstance(evaluator.metric, OutputMetric)):
        # what is being measured, before each pass: the count is known from the start (no busy bar)
        report_progress(progress, 0, total, "measuring the FP32 reference")
        fp32 = evaluator.measure_fp32()
        report_progress(progress, 1, total, "FP32 reference")
        report_progress(progress, 1, total, "measuring the all-quantized model")
        quantized = evaluator.measure_quantized()
        report_progress(progress, 2, total, "all quantized")
        return fp32, quantized
    values = []
    for step, stage in enumerate(("fp32", "quantized"), start=1):
        evaluator.configure(stage)
        mine = evaluator.outputs(stage, shard(list(range(len(evaluator.batches))), context))
        on_cpu = evaluator.device.type == "cpu"
        shared: dict[int, Any] = {}
        for part in context.all_gather(mine if on_cpu else {i: to_device(o, torch.device("cpu"))
                                                            for i, o in mine.items()}):
            shared.update(part if on_cpu else {i: to_device(o, evaluator.device) for i, o in part.items()})
        values.append(evaluator.measure(stage, run_batch=shared.__getitem__, keep_outputs=stage == "fp32"))
        report_progress(progress, step, total, "FP32 reference" if stage == "fp32" else "all quantized")
    return values[0], values[1]


def _plan_for(evaluator: Evaluator, units: list[Unit], base: str,
              cache: bool) -> tuple[PrefixPlan | None, list[int], str]:
    """A checked prefix plan and each unit's cut position, or None and why the plain loop is used."""
    if not cache:
        return None, [], "plain loop (cache=False)"
    if isinstance(evaluator.metric, ModelMetric):
        return None, [], "plain loop: the metric runs the model itself"
    plan, note = build_plan(evaluator.model)
    if plan is None:
        return None, [], note
    # The plan must be the model: same bits on batch 0 in the baseline configuration. This catches a
    # trace specialised to other inputs (a branch on an argument, say). Quantizer flags cannot be baked
    # in: every module holding quantizers is an opaque call in the graph.
    evaluator.configure(base)
    args, kwargs = evaluator.fresh_inputs(0)
    try:
        output = plan.run(args, kwargs)
    except Exception as error:  # a trace that cannot run is a trace we do not use
        return None, [], f"plain loop: the traced graph failed ({type(error).__name__}: {error})"
    if not same_output(output, evaluator.first_output.get(base)):
        return None, [], f"plain loop: the traced graph does not reproduce the model's {base} output"
    cuts = [plan.cut_before(evaluator.quantizer_objects(u)) for u in units]
    if all(c <= plan.first_cut for c in cuts):
        return None, [], "plain loop: every unit is used by the model's first operation"
    return plan, cuts, note


def _profile_result(evaluator: Evaluator, units: list[Unit], values: dict[int, float], scheme: str, *,
                    fp32: float, quantized: float, started: float, cache: str, cache_note: str,
                    complete: bool) -> SensitivityResult:
    """The ranked result for the units measured so far (``values`` by index into ``units``)."""
    measured = [UnitResult(name=u.name, quantizers=list(u.quantizers), value=values[i],
                           delta_vs_quantized=difference(values[i], quantized),
                           delta_vs_fp32=difference(values[i], fp32))
                for i, u in enumerate(units) if i in values]
    rank_units(measured, scheme, evaluator.metric.higher_is_better)
    return SensitivityResult(scheme=scheme, metric=evaluator.metric.to_dict(), fp32=fp32, quantized=quantized,
                             units=measured, num_batches=len(evaluator.batches),
                             wall_time_s=time.perf_counter() - started, cache=cache, cache_note=cache_note,
                             complete=complete)


def _run_profile_shared(evaluator: Evaluator, units: list[Unit], scheme: str, *, fp32: float, quantized: float,
                        cache: bool, progress: ProgressCallback | None, done: int, total: int, started: float,
                        context: DistContext) -> SensitivityResult:
    """This rank measures its share of the units; the values of all ranks are gathered on every rank.

    Each unit's value depends only on the model, the batches and the unit, never on which other units
    were measured in the same process (the prefix cache reproduces the plain loop bit for bit), so the
    gathered values are the ones a single process measures.
    """
    mine = deal(len(units), context)
    report = context.progress(progress, len(units), "sensitivity", offset=done, total=total)
    local = run_profile(evaluator, [units[i] for i in mine], scheme, fp32=fp32, quantized=quantized, cache=cache,
                        progress=report, done=0, total=len(mine), started=started)
    context.wait_for_peers(report, f"{scheme}: units")
    by_name = {unit.name: unit.value for unit in local.units}  # unit names are unique (resolve_units)
    measured = {i: by_name[units[i].name] for i in mine}
    gathered = context.all_gather((measured, local.cache, local.cache_note))
    values: dict[int, float] = {}
    for part, _, _ in gathered:
        values.update(part)
    return _profile_result(evaluator, units, values, scheme, fp32=fp32, quantized=quantized, started=started,
                           cache=gathered[0][1], cache_note=gathered[0][2], complete=True)


def run_profile(evaluator: Evaluator, units: list[Unit], scheme: str, *, fp32: float, quantized: float,
                cache: bool, progress: ProgressCallback | None, done: int, total: int,
                started: float, context: DistContext | None = None) -> SensitivityResult:
    """Measure every unit on an evaluator whose FP32 reference is computed (see :func:`sensitivity`).

    With a distributed ``context`` the units are shared among the ranks and every rank returns the
    whole result.
    """
    if context is not None and context.distributed:
        return _run_profile_shared(evaluator, units, scheme, fp32=fp32, quantized=quantized, cache=cache,
                                   progress=progress, done=done, total=total, started=started, context=context)
    base = "quantized" if scheme == "one-off" else "fp32"
    values: dict[int, float] = {}
    plan, cuts, note = _plan_for(evaluator, units, base, cache)

    def result(complete: bool) -> SensitivityResult:
        return _profile_result(evaluator, units, values, scheme, fp32=fp32, quantized=quantized, started=started,
                               cache=plan.strategy if plan is not None else "off", cache_note=note,
                               complete=complete)

    def toggle(unit: Unit) -> None:
        quantizers = evaluator.quantizer_objects(unit)
        if scheme == "one-off":
            evaluator.configure(base, off=quantizers)
        else:
            evaluator.configure(base, on=quantizers)

    # with the cache on, a weight quantizer left on gives the same output in every pass: computed once
    weights = WeightQuantCache(evaluator.quantizers if cache else ())
    try:
        with weights:
            _measure_units(evaluator, units, scheme, base, plan, cuts, values, toggle, progress, done, total)
    except AnalysisCancelled as cancelled:
        cancelled.partial = result(complete=False)
        raise
    return result(complete=True)


def _measure_units(evaluator: Evaluator, units: list[Unit], scheme: str, base: str, plan: PrefixPlan | None,
                   cuts: list[int], values: dict[int, float], toggle: Callable[[Unit], None],
                   progress: ProgressCallback | None,
                   done: int, total: int) -> None:
    """Measure each unit into ``values`` (by index into ``units``): the plain loop, or from cached prefixes."""
    if plan is None:
        for i, unit in enumerate(units):
            toggle(unit)
            values[i] = evaluator.measure(scheme, unit.name)
            done += 1
            report_progress(progress, done, total, f"{scheme}: {unit.name}")
    else:
        # units in execution order, so that each batch's cached state only ever moves forward
        states = [plan.start(*evaluator.fresh_inputs(b)) for b in range(len(evaluator.inputs))]
        for i in sorted(range(len(units)), key=lambda k: cuts[k]):
            unit = units[i]
            evaluator.configure(base)
            for b, state in enumerate(states):
                evaluator.check_cancel(f"before {unit.name}")
                try:
                    plan.advance(state, cuts[i])
                except Exception as error:  # the user's model, in the baseline configuration
                    raise AnalysisError(f"The model failed on batch {b} {describe_stage(base, None)}: "
                                        f"{type(error).__name__}: {error}", unit=None, stage=base,
                                        batch_index=b, original=error) from error
            toggle(unit)
            values[i] = evaluator.measure(scheme, unit.name, run_batch=lambda b: plan.finish(states[b]))
            done += 1
            report_progress(progress, done, total, f"{scheme}: {unit.name}")

