"""The mixed-precision ladder as a session job: one calibrated model per rung the project does not run yet,
the search over them (:func:`workbench.analysis.ladder.ladder_search`), and applying its mix.

Pure functions: the Session passes in what they need (its float base, its settings, the layer plans) and
stores what they return.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.export.naming import layer_of_quantizer
from workbench.graph.fold import FoldReport
from workbench.project import FallbackRecord, LayerDecision, Project
from workbench.project.model import now_iso
from workbench.project.settings import DefaultDescriptors, ProjectSettings
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.calibrate import calibrate as run_calibration
from workbench.quant.algorithms.format_rules import flow_notes, mix_notes
from workbench.quant.algorithms.precision import DEFAULT_BLOCK_SIZE, Precision
from workbench.quant.algorithms.residency import BlockResidency
from workbench.quant.algorithms.sequential import calibrate_sequential
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.quant.gemm import float_by_default_reason
from workbench.quant.nn import QuantMatMul, QuantSDPA
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.session import layer_edits
from workbench.session.build import Built, build_quantized
from workbench.session.decisions import LayerPlan, plan_precision
from workbench.session.errors import SessionError


@dataclass(frozen=True)
class MixChange:
    """What applying a ladder's mix does to one layer: its precision ``now`` and ``then``; ``hand_set`` when the
    user set it by hand (a precision or descriptors of their own), so that applying it overrides a hand edit."""

    layer: str
    now: str
    then: str
    hand_set: bool = False

    def text(self) -> str:
        return f"{self.layer}: {self.now} -> {self.then}" + (" (set by hand)" if self.hand_set else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _word(precision: Precision | None) -> str:
    return "custom" if precision is None else precision.value


def latest_ladder_record(project: Project, *, applied: bool | None = None) -> FallbackRecord | None:
    """The project's last ladder search record (with ``applied``: the last one applied, or not)."""
    from workbench.analysis.ladder import LADDER_FORMAT

    return next((r for r in reversed(project.fallbacks) if r.data.get("format") == LADDER_FORMAT
                 and (applied is None or bool(r.applied) == applied)), None)


def hand_set_layers(project: Project, own: Mapping[str, Precision | None]) -> set[str]:
    """The layers the user set by hand: a decision other than a new layer's (quantized with the default
    descriptors, or float where the type starts float), except the layers still as the last applied ladder left
    them (its mix is not a hand edit). The ladder keeps these as pins, and its Apply asks before overriding them."""
    record = latest_ladder_record(project, applied=True)
    applied = dict(record.data.get("precisions") or {}) if record is not None else {}
    pins = set()
    for name, decision in project.layers.items():
        starts_quantized = float_by_default_reason(decision.type) is None
        touched = decision.quantize != starts_quantized or (
            decision.quantize and (decision.input_desc is not None or decision.weight_desc is not None))
        word = _word(own.get(name))
        if touched and not (word != "custom" and applied.get(name) == word):
            pins.add(name)
    return pins


def mix_changes(project: Project, own: Mapping[str, Precision | None], mix: Mapping[str, str],
                hand_set: Collection[str]) -> list[MixChange]:
    """The layers whose precision applying ``mix`` (a ladder's) changes, in the project's order: a layer already in
    its mix precision keeps its decision as it is (its hand-edited descriptors too), and ``custom`` layers keep
    theirs."""
    changes = []
    for name in project.layers:
        then = mix.get(name)
        now = _word(own.get(name))
        if then is None or then == "custom" or then == now:
            continue
        changes.append(MixChange(name, now, then, name in hand_set))
    return changes


def gemm_layers(model: nn.Module, layers: Iterable[str]) -> set[str]:
    """The layers that are matrix GEMMs: a quantized 2-D weight (Linear, Hugging Face's Conv1D) or a product of
    activations. Quantized with float neighbours they are the W8A8 pattern of transformers (the fusion clean-up
    keeps them); a convolution alone among float layers stays a case for it (issue 27: the lint's
    isolated_quantized_layer on CNNs)."""
    modules = dict(model.named_modules())

    def is_gemm(module: nn.Module | None) -> bool:
        weight = getattr(module, "weight", None)
        return isinstance(module, (QuantMatMul, QuantSDPA)) or (
            getattr(module, "_weight_quantizer", None) is not None and isinstance(weight, torch.Tensor)
            and weight.dim() == 2)

    return {name for name in layers if is_gemm(modules.get(name))}


def data_flow(model: nn.Module, layers: Iterable[str], batch: Any, device: torch.device
              ) -> dict[str, tuple[set[str], set[str]]] | None:
    """Each layer's (producers, consumers), recorded on one sample batch
    (:func:`workbench.analysis.layer_flow.record_layer_flow`); None without a sample or when the forward fails."""
    if batch is None:
        return None
    from workbench.analysis.layer_flow import record_layer_flow

    flow = record_layer_flow(model, list(layers), batch, device)
    if flow is None:
        return None
    return {name: (flow.producers.get(name, set()), flow.consumers.get(name, set())) for name in layers}

__all__ = ["rung_models", "rung_source", "LayerPlan", "parse_rungs", "rung_plans", "search", "MixChange",
           "hand_set_layers", "mix_changes", "data_flow", "gemm_layers", "latest_ladder_record", "apply_mix",
           "restore_layers", "mark_applied"]


def rung_models(project: Project, base: nn.Module, folding: FoldReport | None, device, settings: ProjectSettings,
                plans: Mapping[Precision, Mapping[str, LayerPlan]], batches: Iterable, *,
                example_inputs: Any = None, progress: ProgressCallback | None = None,
                cancel: CancelToken | None = None, build: Callable[[Project], Built] | None = None,
                residency_of: Callable[[Built], BlockResidency] | None = None) -> dict[Precision, nn.Module]:
    """For each precision, the project's model with the ``plans`` layers in it, calibrated on ``batches``
    with the project's calibration settings (the project itself is not changed). ``progress(done, total, message)``
    counts the calibrations' steps over all the rungs (which rung, which step); ``cancel`` stops them.

    ``build`` builds a variant of the project (default: :func:`build_quantized` of ``base`` with ``example_inputs``);
    with ``residency_of`` (the residency of a built variant's weights) each rung is calibrated one block at a time
    (:func:`~workbench.quant.algorithms.sequential.calibrate_sequential`: the same amax, one block's weights
    resident), as a lazily opened model needs."""
    batches = list(batches)
    options = settings.calibration
    models: dict[Precision, nn.Module] = {}
    rungs = [precision for precision, plan in plans.items() if plan]
    for index, precision in enumerate(rungs):
        plan = plans[precision]

        def report(done: int, total: int, message: str, index: int = index, precision: Precision = precision) -> None:
            # one bar over every rung's calibration: rung k's steps come after the k rungs before it
            if progress is not None and total:
                progress(index * total + done, len(rungs) * total,
                         f"calibrating the {precision.value} rung ({index + 1}/{len(rungs)}): {message}")

        report(0, len(batches), "building its model")
        layers = {name: dataclasses.replace(decision) for name, decision in project.layers.items()}
        for name, (quantize, input_desc, weight_desc) in plan.items():
            layers[name] = LayerDecision(name, layers[name].type, quantize, input_desc, weight_desc)
        variant = dataclasses.replace(project, layers=layers, calibrations=[], smoothing=dict(project.smoothing))
        built = build(variant) if build is not None else build_quantized(
            base, variant, device, folding=folding, settings=settings, example_inputs=example_inputs)
        model = built.model
        if residency_of is not None:
            calibrate_sequential(model, batches, num_batches=None, method=options.method.value,
                                 percentile=options.percentile, device=device, report_sqnr=False,
                                 block_method=options.block_method, progress=report, cancel=cancel,
                                 residency=residency_of(built))
        else:
            run_calibration(model, batches, num_batches=None, method=options.method.value,
                            percentile=options.percentile, device=device, report_sqnr=False,
                            block_method=options.block_method, progress=report, cancel=cancel)
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
           progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
           pins: Collection[str] = (), flow: Mapping[str, tuple[set[str], set[str]]] | None = None,
           on_partial: Callable[[Any], None] | None = None, walk: Any = None,
           revisit_pins: bool = False) -> tuple[Any, FallbackRecord]:
    """The ladder search (:func:`workbench.analysis.ladder.ladder_search`) from the calibrated ``model`` over the
    rung ``models`` (:func:`rung_models` of ``plans``); the result and the record to append to the project's
    fallback searches. ``pins``: layers it keeps as they are (:func:`hand_set_layers`); ``flow``: the layers'
    producers and consumers (:func:`data_flow`; None: model order) for the fusion clean-up. With ``walk`` (the
    :class:`~workbench.analysis.block_search.WalkOptions`) the search runs one block at a time
    (:func:`workbench.analysis.block_ladder.block_ladder_search`: output SQNR, no metric, no fusion clean-up).
    ``revisit_pins``: the user asked to search the layers set by hand too (kept in the record, so that a reopened
    project shows the choice the search was run with)."""
    from workbench.analysis.ladder import ladder_search

    in_rung = {precision: {name: precision for name in plan} | {n: p for n, p in own.items() if p is precision}
               for precision, plan in plans.items()}
    blocks = {name: (d.weight_desc or {}).get("block_size", DEFAULT_BLOCK_SIZE) for name, d in project.layers.items()}
    for precision, plan in plans.items():
        for name, (_, _, weight_desc) in plan.items():
            if precision is Precision.INT4W and weight_desc:
                blocks[name] = weight_desc.get("block_size", DEFAULT_BLOCK_SIZE)
    if walk is not None:
        from workbench.analysis.block_ladder import block_ladder_search
        from workbench.analysis.fallback import units_from_names
        from workbench.analysis.units import Unit

        candidates = None if ranking is None else units_from_names(
            model, [Unit(u.name, tuple(u.quantizers)) for u in ranking.units])
        result = block_ladder_search(model, batches, ladder=rungs, rung_of=rung_source(models, in_rung),
                                     precisions=dict(own), target=target, tolerance=tolerance,
                                     budget_bytes=budget_bytes, candidates=candidates, block_sizes=blocks, pins=pins,
                                     options=walk)
        result.notes += mix_notes(list(project.layers), result.precisions)
        result.revisit_pins = revisit_pins
        return result, FallbackRecord(project.next_id(project.fallbacks), now_iso(), result.to_dict())
    result = ladder_search(model, batches, metric, ladder=rungs, rung_of=rung_source(models, in_rung),
                           precisions=dict(own), target=target, tolerance=tolerance, budget_bytes=budget_bytes,
                           ranking=ranking, progress=progress, cancel=cancel, output=output, block_sizes=blocks,
                           layer_order=list(project.layers), neighbours=flow,  # fusion-aware, in the data flow
                           gemms=gemm_layers(model, project.layers), pins=pins, on_partial=on_partial)
    # the mix's hazards in the data flow when it was recorded (module order calls siblings neighbours)
    result.notes += flow_notes(flow, result.precisions, gemm_layers(model, project.layers)) if flow is not None \
        else mix_notes(list(project.layers), result.precisions)
    result.revisit_pins = revisit_pins
    return result, FallbackRecord(project.next_id(project.fallbacks), now_iso(), result.to_dict())


def apply_mix(project: Project, model: nn.Module, defaults: DefaultDescriptors, mix: Mapping[str, str],
              own: Mapping[str, Precision | None], *, keep_hand_edits: bool = False
              ) -> tuple[list[MixChange], layer_edits.LayerEdit]:
    """Set the layers whose precision ``mix`` changes (:func:`mix_changes`; with ``keep_hand_edits``, not the ones set
    by hand) to it, in the project's decisions: the changes, and the edit (its ``before`` undoes it) for the
    Session to apply to its model. All or nothing: a precision that does not apply raises before any change."""
    changes = [c for c in mix_changes(project, own, mix, hand_set_layers(project, own))
               if not (keep_hand_edits and c.hand_set)]
    groups: dict[str, list[str]] = {}
    for change in changes:
        groups.setdefault(change.then, []).append(change.layer)
    plans: dict[str, LayerPlan] = {}
    for precision, names in groups.items():
        plans.update(plan_precision(project, model, defaults, names, precision))
    before = {name: layer_edits.layer_state(project, name) for name in plans}
    for name, (quantize, input_desc, weight_desc) in plans.items():
        decision = project.layers[name]
        decision.quantize, decision.input_desc, decision.weight_desc = quantize, input_desc, weight_desc
    return changes, layer_edits.LayerEdit(before, [])


def restore_layers(project: Project, before: Mapping[str, layer_edits.in_place.LayerState]) -> layer_edits.LayerEdit:
    """Put the layers' decisions back to ``before`` (an Apply's undo); the edit that does it."""
    now = {name: layer_edits.layer_state(project, name) for name in before if name in project.layers}
    for name in now:
        decision = project.layers[name]
        decision.quantize, decision.input_desc, decision.weight_desc = before[name]
    return layer_edits.LayerEdit(now, [])


def mark_applied(project: Project, precisions: Mapping[str, str] | None, applied: bool) -> None:
    """The last ladder record (the one with these ``precisions``, when given) shows as applied or not, also after a
    save and reopen (the GUI's Apply stays disabled on an applied search)."""
    record = latest_ladder_record(project)
    if record is not None and (precisions is None or record.data.get("precisions") == dict(precisions)):
        record.applied = applied
        record.data = {**record.data, "applied": applied}
