"""The mixed-precision ladder as a session job: one calibrated model per rung the project does not run yet,
the search over them (:func:`workbench.analysis.ladder.ladder_search`), and applying its mix.

Pure functions: the Session passes in what they need (its float base, its settings, the layer plans) and
stores what they return.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from workbench.export.naming import layer_of_quantizer
from workbench.graph.fold import FoldReport
from workbench.project import FallbackRecord, LayerDecision, Project
from workbench.project.model import now_iso
from workbench.project.settings import DefaultDescriptors, ProjectSettings
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.calibrate import calibrate as run_calibration
from workbench.quant.algorithms.format_rules import mix_notes
from workbench.quant.algorithms.precision import DEFAULT_BLOCK_SIZE, Precision
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.session.build import build_quantized
from workbench.session.decisions import LayerPlan, plan_precision
from workbench.session.errors import SessionError

__all__ = ["rung_models", "rung_source", "LayerPlan", "parse_rungs", "rung_plans", "search"]


def rung_models(project: Project, base: nn.Module, folding: FoldReport | None, device, settings: ProjectSettings,
                plans: Mapping[Precision, Mapping[str, LayerPlan]], batches: Iterable, *,
                example_inputs: Any = None) -> dict[Precision, nn.Module]:
    """For each precision, the project's model with the ``plans`` layers in it, calibrated on ``batches``
    with the project's calibration settings (the project itself is not changed)."""
    batches = list(batches)
    options = settings.calibration
    models: dict[Precision, nn.Module] = {}
    for precision, plan in plans.items():
        if not plan:
            continue
        layers = {name: dataclasses.replace(decision) for name, decision in project.layers.items()}
        for name, (quantize, input_desc, weight_desc) in plan.items():
            layers[name] = LayerDecision(name, layers[name].type, quantize, input_desc, weight_desc)
        variant = dataclasses.replace(project, layers=layers, calibrations=[], smoothing=dict(project.smoothing))
        model = build_quantized(base, variant, device, folding=folding, settings=settings,
                                example_inputs=example_inputs).model
        run_calibration(model, batches, num_batches=None, method=options.method.value, percentile=options.percentile,
                        device=device, report_sqnr=False, block_method=options.block_method)
        models[precision] = model
    return models


def rung_source(models: Mapping[Precision, nn.Module],
                precisions_of: Mapping[Precision, Mapping[str, Precision | None]]) -> Any:
    """The ladder's :data:`~workbench.analysis.ladder.RungSource` over the rung models: a quantizer's twin in
    the model of that precision, where its layer really runs in it there."""
    names = {precision: quantizer_names(model) for precision, model in models.items()}

    def rung_of(name: str, precision: Precision) -> TensorQuantizer | None:
        found = names.get(precision, {}).get(name)
        layer = layer_of_quantizer(name)[0]
        if found is None or precisions_of.get(precision, {}).get(layer) is not precision:
            return None
        return found

    return rung_of


def parse_rungs(ladder: Any) -> list[Precision]:
    """The ladder's precisions, cheapest first (``"int8,fp8,float"``); SessionError for one it cannot read."""
    from workbench.analysis.ladder import parse_ladder

    try:
        return parse_ladder(ladder)
    except ValueError as error:
        raise SessionError(str(error)) from error


def rung_plans(project: Project, model: nn.Module, defaults: DefaultDescriptors, own: Mapping[str, Precision | None],
               rungs: Iterable[Precision]) -> dict[Precision, dict[str, LayerPlan]]:
    """For each rung but float, what running each layer that is not in it yet (``own``: the layers' precisions
    now; custom and float layers stay as they are) in that precision makes of its decision; a layer the
    precision does not apply to (int4w on a convolution) is left out of that rung."""
    plans: dict[Precision, dict[str, LayerPlan]] = {}
    for precision in rungs:
        if precision is Precision.FLOAT:
            continue
        plans[precision] = {}
        for name, current in own.items():
            if current in (None, Precision.FLOAT) or current is precision:
                continue
            try:
                plans[precision].update(plan_precision(project, model, defaults, [name], precision))
            except SessionError:  # the precision does not apply to this layer (int4w on a convolution)
                continue
    return plans


def search(model: nn.Module, batches: list, metric: Any, project: Project, *, rungs: list[Precision],
           own: Mapping[str, Precision | None], plans: Mapping[Precision, Mapping[str, LayerPlan]],
           models: Mapping[Precision, nn.Module], ranking: Any = None, target: float | None = None,
           tolerance: float | None = None, budget_bytes: int | None = None, output: Any = None,
           progress: ProgressCallback | None = None, cancel: CancelToken | None = None) -> tuple[Any, FallbackRecord]:
    """The ladder search (:func:`workbench.analysis.ladder.ladder_search`) from the calibrated ``model`` over the
    rung ``models`` (:func:`rung_models` of ``plans``); the result and the record to append to the project's
    fallback searches."""
    from workbench.analysis.ladder import ladder_search

    in_rung = {precision: {name: precision for name in plan} | {n: p for n, p in own.items() if p is precision}
               for precision, plan in plans.items()}
    blocks = {name: (d.weight_desc or {}).get("block_size", DEFAULT_BLOCK_SIZE) for name, d in project.layers.items()}
    for precision, plan in plans.items():
        for name, (_, _, weight_desc) in plan.items():
            if precision is Precision.INT4W and weight_desc:
                blocks[name] = weight_desc.get("block_size", DEFAULT_BLOCK_SIZE)
    result = ladder_search(model, batches, metric, ladder=rungs, rung_of=rung_source(models, in_rung),
                           precisions=dict(own), target=target, tolerance=tolerance, budget_bytes=budget_bytes,
                           ranking=ranking, progress=progress, cancel=cancel, output=output, block_sizes=blocks,
                           layer_order=list(project.layers))  # fusion-aware (the lint's rules)
    result.notes += mix_notes(list(project.layers), result.precisions)
    return result, FallbackRecord(project.next_id(project.fallbacks), now_iso(), result.to_dict())
