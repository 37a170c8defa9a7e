"""Read-only views of an open session for the front ends: the layer rows of the model tree, the project
summary of ``workbench show``, descriptor and histogram read-outs. Functions of the project, the quantized
model and the values they show, passed in by the :class:`~workbench.session.Session`; nothing here changes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.graph.placement import is_attention
from workbench.graph.tree import module_notes, module_role
from workbench.plurals import agree, count_text
from workbench.project import Project, QuantizerRecord
from workbench.project.settings import ProjectSettings, jsonable
from workbench.quant import TensorQuantizer
from workbench.quant.algorithms.batches import model_inputs
from workbench.quant.algorithms.precision import grid_levels, precision_label, precision_of
from workbench.quant.algorithms.smoothing import describe_smoothing
from workbench.quant.algorithms.snapshot import owned_quantizers, quantizer_names
from workbench.quant.algorithms.tensorrt_rules import SIM_ONLY
from workbench.quant.calib import HistogramCalibrator
from workbench.quant.gemm import float_by_default_reason
from workbench.session.build import BuildReport, descriptor_of, layer_of, quantizable, role_quantizer
from workbench.sources.shapes_only import shapes_mode

__all__ = ["LayerView", "layer_views", "summary", "descriptor_summary", "jsonable", "sensitivity_ranks",
           "layer_shapes", "histogram_of", "weight_ranges"]


@dataclass
class LayerView:
    """One row of the model tree's quantizable layers, as both front ends show it."""

    name: str
    type: str
    quantize: bool
    kind: str  # "module" or "functional"
    input_summary: str
    weight_summary: str
    amax_summary: str
    sensitivity_rank: int | None
    parameters: int
    notes: list[str] = field(default_factory=list)  # what building did to the layer, e.g. ["folded bn1"]
    role: str = ""  # an attention quantizer's role, e.g. "query x key" (see workbench.graph.tree.module_role)
    amax_reason: str = ""  # how the input quantizer's amax method was chosen ("auto": the measured reason)
    warnings: list[str] = field(default_factory=list)  # calibration warnings naming the layer's quantizers
    # int8, fp8, int4w, float, or custom (descriptors matching none): workbench.quant.algorithms.precision
    precision: str = ""
    smoothing: str = ""  # the layer's SmoothQuant/AWQ scales, in words ("" without)

    @property
    def display_type(self) -> str:
        return f"{self.type} ({self.role})" if self.role else self.type


def descriptor_summary(fields: dict[str, Any] | None, method: str | None = None) -> str:
    """Short text such as ``int8 per-tensor hist/entropy`` or ``int8 per-channel(0) max``."""
    if fields is None:
        return "-"
    bits = fields.get("num_bits", 8)
    kind = ("fp4" if tuple(bits) == (2, 1) else "fp8") if isinstance(bits, (list, tuple)) \
        else f"{'uint' if fields.get('unsigned') else 'int'}{bits}"
    axis = fields.get("axis")
    granularity = "per-tensor" if axis is None else f"per-channel({axis})"
    calib = "hist" if fields.get("calib_method") == "histogram" else "max"
    if calib == "hist" and method and method != "max":
        calib += f"/{method}"
    if fields.get("block_size") is not None:
        granularity = f"block {fields['block_size']}"
    if not fields.get("enabled", True):
        return "float (off)"
    extras = " narrow" if fields.get("narrow_range") else ""
    exportable = bits == 8 or isinstance(bits, (list, tuple)) or (bits == 4 and fields.get("block_size"))
    if not exportable:  # simulates, but the QDQ export refuses it (workbench.quant.algorithms.tensorrt_rules)
        extras += f", {SIM_ONLY}"
    return f"{kind} {granularity} {calib}{extras}"


def sensitivity_ranks(project: Project) -> dict[str, int]:
    """Rank per layer from the project's latest sensitivity run (a group's rank goes to every layer in it)."""
    if not project.sensitivity:
        return {}
    ranks: dict[str, int] = {}
    for item in project.sensitivity[-1].data.get("units") or []:
        if not isinstance(item, dict) or "rank" not in item:
            continue
        layers = {layer_of(q)[0] for q in item.get("quantizers") or []} or {str(item.get("name"))}
        for layer in layers:
            ranks[layer] = min(int(item["rank"]), ranks.get(layer, int(item["rank"])))
    return ranks


def layer_views(project: Project, model: nn.Module) -> list[LayerView]:
    """Every quantizable layer of ``project`` with its decision, descriptors, amax (in ``model``, its quantized
    model) and sensitivity rank."""
    ranks = sensitivity_ranks(project)
    calibration = project.current_calibration
    method = calibration.method if calibration else None
    kinds = {name: kind for name, _, kind in quantizable(model)}
    record_of = {}  # quantizer object -> its record in the current calibration
    if calibration is not None:
        live = quantizer_names(model)
        record_of = {id(live[name]): record for name, record in calibration.quantizers.items() if name in live}
    views = []
    modules = dict(model.named_modules())
    for name, decision in project.layers.items():
        module = modules.get(name)
        input_q = role_quantizer(module, "input")
        weight_q = getattr(module, "weight_quantizer", None)
        input_fields = decision.input_desc or (descriptor_of(input_q) if input_q is not None else None)
        weight_fields = decision.weight_desc or (descriptor_of(weight_q) if weight_q is not None else None)
        amax = "-"
        # weight-only (int4w) layers: the weight's block amax is the one there is to show
        shown = weight_q if input_q is None or not input_q.enabled_by_descriptor else input_q
        if decision.quantize and shown is not None:
            amax = shown.amax_summary(".4g") if shown.has_amax else "uncalibrated"
        params = sum(p.numel() for p in module.parameters(recurse=False)) if module is not None else 0
        precision = precision_of(input_fields if input_q is not None else None,
                                 weight_fields if weight_q is not None else None, decision.quantize)
        record = record_of.get(id(input_q)) if input_q is not None else None
        # a quantizer switched to another amax method (a histogram line picked) says so, not the run's method
        layer_method = record.method if record is not None else method
        reason = ""
        if record is not None and record.choice:  # auto picked this layer's method: show it, and why
            layer_method = f"{record.method} (auto)" if not record.choice.get("overridden") else record.method
            reason = record.reason if not record.choice.get("overridden") else \
                f"{record.method}: set by hand (auto had picked {record.choice.get('method')})"
        owned = [record_of.get(id(q)) for _, q in owned_quantizers(module)] if module is not None else []
        layer_warnings = [w["message"] for r in owned if r is not None for w in r.warnings]
        views.append(LayerView(name, decision.type, decision.quantize, kinds.get(name, "module"),
                               descriptor_summary(input_fields, layer_method) if decision.quantize else "float",
                               descriptor_summary(weight_fields) if decision.quantize and weight_fields else "-",
                               amax, ranks.get(name), params,
                               list(module_notes(module)) if module is not None else [],
                               module_role(module) if module is not None else "", reason, layer_warnings,
                               precision=precision_label(precision)))
        record = project.smoothing.get(name)
        if record is not None:
            views[-1].smoothing = describe_smoothing(record.method, record.alpha, float(record.scales.min()),
                                                     float(record.scales.max()), record.folded_into)
    return views


def summary(project: Project, model: nn.Module, report: BuildReport, settings: ProjectSettings, *,
            path: Path | None, model_description: str, export_paths: list[str], file_changes: list[str],
            layers: list[LayerView] | None = None) -> dict[str, Any]:
    """A JSON-able overview of ``project`` for ``workbench show``.

    Args:
        model: the project's quantized model as built now; ``report``: its build report.
        settings: the project's typed settings.
        path: the project's file (None before the first save).
        model_description: what the model source loaded, in words.
        export_paths: where each export of the history lies.
        file_changes: model files that changed since the project was saved.
        layers: :func:`layer_views`, when the caller has them.
    """
    layers = layer_views(project, model) if layers is None else layers
    run = project.current_calibration
    return {
        "name": project.name,
        "path": None if path is None else str(path),
        "model": project.model.label,
        "model_description": model_description,
        "input": None if project.input_spec is None else project.input_spec.describe(),
        "data": {role: spec.label for role, spec in project.data.items()},
        "layers": len(layers),
        "quantized_layers": sum(1 for layer in layers if layer.quantize),
        "float_layers": [layer.name for layer in layers if not layer.quantize],
        # subclasses of quantizable layers with a forward of their own stay float (quant/replace.py says why)
        "not_quantizable": [{"name": item.name, "type": item.float_type, "reason": item.reason}
                            for item in (report.replacement.not_quantizable if report.replacement else [])],
        # layer types a new project leaves float (LSTM), while they are float, with why
        "float_by_default": [{"name": layer.name, "type": layer.type, "reason": float_by_default_reason(layer.type)}
                             for layer in layers if not layer.quantize and float_by_default_reason(layer.type)],
        "calibration": None if run is None else {
            "method": run.method, "batches": run.num_batches, **_calibrated_counts(model, run),
            "output_sqnr_db": run.output_sqnr_db, "output_sqnr_stale": _stale_reasons(project, model, report, run),
            "created": run.created, "warnings": run.warnings, "sqnr_batches": run.sqnr_batches,
            "picked": _picked(run), "choices": {name: {"method": record.method, "reason": record.reason,
                                                       "warnings": [w["message"] for w in record.warnings]}
                                                for name, record in run.quantizers.items()
                                                if record.choice or record.warnings}},
        "stale_quantizers": list(report.stale),
        "sensitivity_runs": len(project.sensitivity),
        "exports": list(export_paths),
        "file_changes": list(file_changes),
        "folding": {"enabled": settings.fold_bn,
                    **(report.folding.to_dict() if report.folding is not None
                       else {"folded": [], "skipped": [], "failures": [], "max_relative_error": None})},
        "functional": _functional_summary(report.functional),
        "finetune": _finetune_summary(project, report),
        "finetune_runs": len(project.finetunes),
        "settings": settings.to_stored(),
    }


def _functional_summary(report: Any) -> dict[str, Any]:
    """What the functional rewrite quantized, and every attention or module it could not, with why."""
    if report is None:
        return {"adds": 0, "concats": 0, "matmuls": 0, "attentions": 0, "unquantized_attention": [],
                "not_traced": [], "left_float": 0, "left_float_operations": [], "found_at_run_time": []}
    return {"adds": len(report.adds), "concats": len(report.concats), "matmuls": len(report.matmuls),
            "attentions": len(report.attentions),
            "unquantized_attention": [{"module": s.owner, "reason": s.reason} for s in report.unquantized_attention],
            "not_traced": [{"module": f.name or "<model>", "type": f.type_name, "reason": f.reason}
                           for f in report.failures],
            "left_float": len(report.skipped),
            "left_float_operations": _left_float(report.skipped),
            # modules torch.fx could not rewrite whose operations were found by running the model
            "found_at_run_time": [name or "<model>" for name in report.runtime]}


def _left_float(skipped: list[Any]) -> list[dict[str, Any]]:
    """Every operation left in float as (module, operation, reason, kind, count, and whether it is an attention
    product by the placement rules: a scan step is not): the steps of one loop (a scan over the sequence) are one
    line with their count."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for item in skipped:
        key = (item.owner or "<model>", item.operation.split("(")[0], item.reason)
        row = rows.setdefault(key, {"module": key[0], "operation": item.operation, "reason": item.reason,
                                    "kind": item.kind, "attention": is_attention(item.kind, item.reason),
                                    "count": 0})
        row["count"] += 1
    return list(rows.values())


def _picked(run: Any) -> dict[str, int]:
    """How many quantizers "auto" gave each method in ``run`` (empty when no method was chosen by auto)."""
    counts: dict[str, int] = {}
    for record in run.quantizers.values():
        if record.choice and not record.choice.get("overridden"):
            counts[record.method] = counts.get(record.method, 0) + 1
    return dict(sorted(counts.items(), key=lambda pair: -pair[1]))


def _calibrated_counts(model: nn.Module, run: Any) -> dict[str, int]:
    """``quantizers``: the quantizers calibrated, as calibration's own summary counts them (a quantizer two
    layers share by a placement rule counts once); ``quantizer_names``: the names they are stored under
    (a shared one under each of its names)."""
    live = quantizer_names(model)
    distinct = {id(live[name]) if name in live else name for name in run.quantizers}
    return {"quantizers": len(distinct), "quantizer_names": len(run.quantizers)}


def _stale_reasons(project: Project, model: nn.Module, report: BuildReport, run: Any) -> list[str]:
    """Why the last calibration's output SQNR no longer describes the model as it is now (empty: it does)."""
    reasons = []
    live = quantizer_names(model)
    active = {name for name, quantizer in live.items() if quantizer.is_enabled and quantizer.is_quant_enabled}
    if report.stale:
        reasons.append(f"{count_text(len(report.stale), 'quantizer')} {agree(len(report.stale), 'has', 'have')} other "
                       "descriptors than at calibration")
    off = sorted(name for name in run.quantizers if name not in active)
    if off:
        reasons.append(f"{count_text(len(off), 'calibrated quantizer')} {agree(len(off), 'is', 'are')} off now (layers "
                       "left in float since)")
    new = sorted(name for name in active if name not in run.quantizers)
    if new:
        reasons.append(f"{count_text(len(new), 'quantizer')} {agree(len(new), 'is', 'are')} new since (not calibrated)")
    if project.current_finetune is not None and _finetune_changed(project.current_finetune):
        reasons.append("the weights were fine-tuned since")
    return reasons


def _finetune_changed(record: Any) -> bool:
    """Whether a stored fine-tune changed the model (one that "kept the starting model" did not)."""
    from workbench.training import FinetuneResult

    return FinetuneResult.from_dict(record.data).changed


def _finetune_summary(project: Project, report: BuildReport) -> dict[str, Any] | None:
    record = project.current_finetune
    if record is None:
        return None
    from workbench.training import FinetuneResult

    result = FinetuneResult.from_dict(record.data)
    return {"id": record.id, "created": record.created, "summary": result.summary(),
            "status": report.finetune, "best_epoch": result.best_epoch,
            "epochs_completed": result.epochs_completed, "cancelled": result.cancelled,
            "metric": result.metric_name, "baseline_metric": result.baseline.metric,
            "best_metric": result.best.metric, "history": [e.to_dict() for e in result.history]}


def layer_shapes(model: nn.Module, sample: Any) -> dict[str, dict[str, Any]]:
    """Input, output and weight shapes of ``model``'s modules on one ``sample`` input (a tensor, or a dict of
    keyword inputs).

    Keys are module names; values ``{"inputs": [shape, ...], "output": shape | None, "weight": shape | None}``.
    """
    shapes: dict[str, dict[str, Any]] = {}

    def shape_of(value: Any) -> tuple[int, ...] | None:
        return tuple(value.shape) if isinstance(value, torch.Tensor) else None

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple, output: Any) -> None:
            if name not in shapes:  # a module called twice keeps its first call
                weight = getattr(module, "weight", None)
                shapes[name] = {"inputs": [s for s in map(shape_of, inputs) if s is not None],
                                "output": shape_of(output if not isinstance(output, (tuple, list)) else output[0]),
                                "weight": shape_of(weight)}
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules() if name]
    try:
        with torch.no_grad(), shapes_mode(sample):
            args, kwargs = model_inputs((sample, None))
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return shapes


def histogram_of(quantizer: TensorQuantizer, record: QuantizerRecord | None) -> dict[str, Any] | None:
    """Histogram counts, bin edges and the amax every method gives, for plotting; None without one."""
    calibrator = quantizer.calibrator
    if not isinstance(calibrator, HistogramCalibrator) or calibrator.calib_hist is None:
        return None
    current = None if not quantizer.has_amax else float(quantizer.amax.max())
    bits = quantizer.num_bits
    return {"counts": calibrator.calib_hist.cpu().numpy(), "edges": calibrator.calib_bin_edges.numpy(),
            "amax": calibrator.compute_all(), "current": current, "method": record.method if record else None,
            "auto": bool(record and record.choice and not record.choice.get("overridden")),
            "reason": record.reason if record else "",
            "warnings": [w["message"] for w in record.warnings] if record else [],
            # the values the layer's format can output with the amax in use (E4M3's uneven grid for FP8)
            "format": ("fp4" if bits == (2, 1) else "fp8") if isinstance(bits, tuple)
            else f"{'uint' if quantizer.unsigned else 'int'}{bits}",
            "grid": None if not current else grid_levels(bits, current, unsigned=quantizer.unsigned)}


def weight_ranges(module: nn.Module | None) -> np.ndarray | None:
    """Per-output-channel max |w| of a layer's weight (for the bar plot), or None without weights."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    quantizer = getattr(module, "weight_quantizer", None)
    axis = quantizer.axis if quantizer is not None and isinstance(quantizer.axis, int) else 0
    dims = [d for d in range(weight.dim()) if d != axis]
    ranges = weight.detach().abs().amax(dim=dims) if dims else weight.detach().abs()
    return ranges.float().cpu().numpy()  # a bf16 model's too (NumPy has no bfloat16; float32 holds it exactly)
