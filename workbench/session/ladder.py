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
from workbench.project import LayerDecision, Project
from workbench.project.settings import ProjectSettings
from workbench.quant.calibrate import calibrate as run_calibration
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.precision import Precision
from workbench.quant.snapshot import quantizer_names
from workbench.session.build import build_quantized

__all__ = ["rung_models", "rung_source", "LayerPlan"]

LayerPlan = tuple[bool, dict[str, Any] | None, dict[str, Any] | None]  # quantize, input and weight descriptors


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
