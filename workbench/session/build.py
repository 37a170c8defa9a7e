"""Building the quantized model from a project: a pure function of the float model and the project's settings,
layer decisions, last calibration and active fine-tune.

:func:`build_quantized` swaps in quantized modules (with the project's per-layer descriptors), adds
QuantAdd/QuantConcat for functional operations, applies the TensorRT placement rules, and restores amax
(and calibrator statistics) and fine-tuned weights where they still fit. It changes neither the float
model nor the project; what it did is in the returned :class:`BuildReport`.
"""
from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.export.naming import layer_of_quantizer
from workbench.graph import FunctionalQuantReport, PlacementReport, PlacementRules
from workbench.graph.fold import FoldReport, fold_batchnorm
from workbench.graph.hf_attention import QuantHFAttention
from workbench.graph.prepare import prepare_for_tensorrt
from workbench.graph.tree import add_note
from workbench.plurals import count_text
from workbench.project import CalibrationRecord, FinetuneRecord, Project, QuantizerRecord
from workbench.project.settings import ProjectSettings, jsonable, make_descriptor
from workbench.quant import TensorQuantizer
from workbench.quant.algorithms.residency import DerivedWeight
from workbench.quant.algorithms.smoothing import LayerSmoothing, SmoothingError, apply_smoothing
from workbench.quant.algorithms.snapshot import holds_quantizers, quantizer_names
from workbench.quant.calib import HistogramCalibrator, MaxCalibrator
from workbench.quant.nn import QuantAdd, QuantConcat, QuantMatMul, QuantSDPA
from workbench.quant.replace import ReplacementReport
from workbench.sources.data_source import InputSpec
from workbench.sources.lazy_checkpoint import move_keeping_meta

logger = logging.getLogger(__name__)

# quantizers the functional rewrite creates (not a layer of the user's model)
FUNCTIONAL_MODULES = (QuantAdd, QuantConcat, QuantMatMul, QuantSDPA, QuantHFAttention)

__all__ = ["BuildReport", "Built", "build_quantized", "fold_base", "descriptor_of", "role_quantizer", "layer_of",
           "quantizable", "structural_copy", "to_numpy", "smoothing_items"]


@dataclass
class BuildReport:
    replacement: ReplacementReport | None = None
    functional: FunctionalQuantReport | None = None
    placement: PlacementReport | None = None
    restored: list[str] = field(default_factory=list)  # quantizers whose amax came from the project
    stale: list[str] = field(default_factory=list)      # calibrated with another descriptor: recalibrate
    folding: FoldReport | None = None                   # BatchNorms folded (None: folding is off)
    finetune: str | None = None                         # whether the fine-tuned weights apply, and why not
    smoothed: list[str] = field(default_factory=list)  # producers that carry a smoothing's 1/s (folded)
    smoothing_problem: str | None = None                # why the project's smoothing was not applied
    # smoothed weights of a lazily opened model: on meta, computed from the checkpoint's when their block loads
    derived_weights: list[DerivedWeight] = field(default_factory=list)


@dataclass
class Built:
    """A quantized model and what building it did."""

    model: nn.Module
    report: BuildReport


def descriptor_of(quantizer: TensorQuantizer) -> dict[str, Any]:
    """The descriptor fields of a live quantizer (what it was built from), as QuantDescriptor.dict()."""
    calib_method = "histogram" if isinstance(quantizer.calibrator, HistogramCalibrator) else "max"
    fields = {"num_bits": quantizer.num_bits, "name": None}
    if not quantizer.fake_quant:
        fields["fake_quant"] = False
    if quantizer.axis is not None:
        fields["axis"] = quantizer.axis
    if quantizer.scale_amax is not None:
        fields["scale_amax"] = quantizer.scale_amax
    if quantizer.learn_amax:
        fields["learn_amax"] = True
    if quantizer.unsigned:
        fields["unsigned"] = True
    if quantizer.narrow_range:
        fields["narrow_range"] = True
    if calib_method != "max":
        fields["calib_method"] = calib_method
    if quantizer.block_size is not None:
        fields["block_size"] = quantizer.block_size
    if not quantizer.enabled_by_descriptor:
        fields["enabled"] = False
    return jsonable(fields)


def role_quantizer(module: nn.Module | None, role: str) -> TensorQuantizer | None:
    """The ``role`` ("input" or "weight") quantizer of a quantized layer, None without one."""
    if module is None:
        return None
    if role == "weight":
        return getattr(module, "weight_quantizer", None)
    candidates = [getattr(module, attr, None) for attr in ("_input_quantizer", "_input0_quantizer",
                                                           "_input1_quantizer", "_q_quantizer")]
    candidates = [q for q in candidates if q is not None]
    # a placement rule may bypass one input of an add (the identity branch): show the one in use
    return next((q for q in candidates if q.is_enabled), candidates[0] if candidates else None)


def layer_of(quantizer_name: str) -> tuple[str, str]:
    """``"conv1._input_quantizer"`` -> ``("conv1", "input")``; RNN/LSTM lists map to their layer too."""
    return layer_of_quantizer(quantizer_name)


def quantizable(model: nn.Module) -> list[tuple[str, str, str]]:
    """(name, type, kind) of every module that owns quantizers, in model order."""
    seen = []
    for name, module in model.named_modules():
        # an LSTM's ``_input_quantizers`` list is part of the LSTM, not a layer of its own
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)) and all(
                isinstance(child, TensorQuantizer) for child in module._modules.values()):
            continue
        if holds_quantizers(module):
            kind = "functional" if isinstance(module, FUNCTIONAL_MODULES) else "module"
            seen.append((name, type(module).__name__.removeprefix("Quant") if kind == "module"
                         else type(module).__name__, kind))
    return seen


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array for the project file (bfloat16 has no NumPy type: float32)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy().copy()


def structural_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every parameter and buffer with ``model``.

    Quantizing swaps modules, never weights, so the quantized model can share the float model's
    tensors: building it costs no memory for weights and no time copying them.
    """
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def fold_base(float_model: nn.Module, input_spec: InputSpec | None,
              device: torch.device) -> tuple[nn.Module, FoldReport]:
    """``float_model`` with BatchNorm folded into the layer before it, as TensorRT does.

    The result shares every unfolded tensor with the float model and the folded layers have tensors
    of their own, so the float model is never changed. A synthetic input of the project's input shape
    checks that folding keeps the outputs.
    """
    base = structural_copy(float_model).eval()
    return fold_batchnorm(base, inplace=True, example_inputs=_fold_example(input_spec, device))


def _fold_example(spec: InputSpec | None, device: torch.device) -> tuple[torch.Tensor] | None:
    dtype = getattr(torch, spec.dtype, None) if spec is not None else None
    # a float image-like input only: token ids and keyword inputs are not made up from noise
    if spec is None or spec.named or not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return None
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(spec.with_batch(1), generator=generator, dtype=dtype).to(device),)


def build_quantized(base: nn.Module, project: Project, device: torch.device, *, folding: FoldReport | None = None,
                    with_decisions: bool = True, example_inputs: Any = None,
                    settings: ProjectSettings | None = None) -> Built:
    """The quantized model of ``base`` (the float model, or :func:`fold_base` of it, with ``folding`` its report).

    With ``with_decisions`` the project's layer decisions and placement rules apply and the last
    calibration and the active fine-tune are restored where they fit; without, every quantizable layer
    is quantized with the default descriptors (to find which layers can be). ``example_inputs`` (one
    sample batch) lets the functional rewrite check every traced module against its original. ``settings``
    are the project's, typed (read from ``project`` when not given).
    """
    settings = settings if settings is not None else ProjectSettings.from_stored(project.settings)
    default_input = settings.defaults.descriptor("input")
    default_weight = settings.defaults.descriptor("weight")
    decisions = project.layers if with_decisions else {}
    float_layers = [n for n, d in decisions.items() if not d.quantize]

    def choose(name: str, module: nn.Module):
        decision = decisions.get(name)
        if decision is None:
            return None, None
        return make_descriptor(decision.input_desc), make_descriptor(decision.weight_desc)

    model = structural_copy(base).eval()
    exact = [f"^{re.escape(n)}$" for n in float_layers]
    functional, rules = settings.functional, settings.rules
    model, prepared = prepare_for_tensorrt(
        model, ignore_policy=exact or None, quant_desc_input=default_input, quant_desc_weight=default_weight,
        descriptor_for=choose, add=functional.add, concat=functional.concat, matmul=functional.matmul,
        attention=functional.attention,
        residual_adds_in_transformer_blocks=functional.residual_adds_in_transformer_blocks,
        example_inputs=example_inputs, apply_rules=with_decisions,
        rules=PlacementRules(concat=rules.concat, maxpool=rules.maxpool, residual=rules.residual,
                             pins=list(settings.pins)))
    report = BuildReport(prepared.replacement, prepared.functional, prepared.rules, folding=folding)
    if with_decisions and project.smoothing:
        try:
            items = smoothing_items(project)
            report.smoothed = apply_smoothing(model, items, report.derived_weights)
            modules = dict(model.named_modules())
            for item in items:  # the tree and the layer list show it beside the layer
                add_note(modules[item.layer], item.describe())
        except SmoothingError as error:  # the model changed since: build without, and say so
            report.smoothing_problem = str(error)
            logger.warning("smoothing not applied: %s", error)
    for quantizer in quantizer_names(model).values():
        quantizer.rounding = "onnx"  # the numbers the exported QDQ graph computes
    model = move_keeping_meta(model, device)  # a lazily opened model's weights stay on meta until loaded
    if with_decisions:
        restore_calibration(model, project.current_calibration, report, device)
        restore_finetune(model, project.current_finetune, project.current_calibration, report)
    return Built(model, report)


def smoothing_items(project: Project) -> list[LayerSmoothing]:
    """The project's smoothing records as :class:`LayerSmoothing` for :func:`apply_smoothing`."""
    return [LayerSmoothing(r.layer, r.method, r.alpha, torch.from_numpy(np.asarray(r.scales, np.float32).copy()),
                           r.folded_into, r.error_before, r.error_after) for r in project.smoothing.values()]


def restore_calibration(model: nn.Module, run: CalibrationRecord | None, report: BuildReport,
                        device: torch.device) -> None:
    """Give quantizers the amax (and statistics) of ``run`` where their descriptor is unchanged."""
    report.restored, report.stale = [], []
    if run is None:
        return
    # a weight amax taken before (or after) a BatchNorm was folded into the layer does not fit its weight now
    folded_now = set(report.folding.folded_into) if report.folding is not None else set()
    refolded = folded_now ^ set(run.folded or [])
    done: set[int] = set()
    for name, quantizer in quantizer_names(model).items():
        if id(quantizer) in done:  # shared by a placement rule: restored under its first name
            report.restored.append(name)
            continue
        record = run.quantizers.get(name)
        if record is None:
            continue
        if not quantizer.is_enabled:  # switched off (an INT4 weight-only layer's input): needs no amax, never stale
            continue
        if record.descriptor is not None and record.descriptor != descriptor_of(quantizer):
            report.stale.append(name)
            continue
        layer, role = layer_of(name)
        if role == "weight" and layer in refolded:
            report.stale.append(name)
            continue
        load_record(quantizer, record, device)
        done.add(id(quantizer))
        report.restored.append(name)


def restore_finetune(model: nn.Module, record: FinetuneRecord | None, run: CalibrationRecord | None,
                     report: BuildReport) -> None:
    """Give the model the weights (and learned amax) of the active fine-tune ``record``, when they fit.

    The weights become new tensors of the quantized model (the float model keeps its own). They only
    apply when the model is folded as it was for the fine-tune and every saved tensor finds its
    parameter; otherwise the model keeps its own weights and ``report.finetune`` says why.
    """
    report.finetune = None
    if record is None or not record.weights:
        return
    folded = sorted(report.folding.folded_into) if report.folding is not None else []
    if sorted(record.folded) != folded:
        report.finetune = (f"fine-tuned weights (run {record.id}) not used: they were trained with "
                           f"{count_text(len(record.folded), 'BatchNorm')} folded, the model now has "
                           f"{len(folded)}; switch "
                           "fold_bn back or fine-tune again")
        logger.warning("%s", report.finetune)
        return
    params = dict(model.named_parameters())
    problems = [f"{name} is not a parameter of the model" for name in record.weights if name not in params]
    problems += [f"{name} has shape {tuple(params[name].shape)}, saved {tuple(array.shape)}"
                 for name, array in record.weights.items()
                 if name in params and tuple(params[name].shape) != tuple(array.shape)]
    if problems:
        report.finetune = (f"fine-tuned weights (run {record.id}) not used: {'; '.join(problems[:3])}"
                           f"{'...' if len(problems) > 3 else ''}")
        logger.warning("%s", report.finetune)
        return
    replacements: dict[int, nn.Parameter] = {}
    for name, array in record.weights.items():
        old = params[name]
        value = torch.from_numpy(np.ascontiguousarray(array)).to(device=old.device, dtype=old.dtype)
        replacements[id(old)] = nn.Parameter(value, requires_grad=old.requires_grad)
    for module in model.modules():  # every owner of a tied parameter gets the same new one
        for attr, param in list(module._parameters.items()):
            if param is not None and id(param) in replacements:
                module._parameters[attr] = replacements[id(param)]
    learned = 0
    if record.amax and run is not None and record.calibration_id == run.id:
        quantizers = quantizer_names(model)
        for name, array in record.amax.items():
            quantizer = quantizers.get(name)
            amax = quantizer.amax if quantizer is not None else None
            if amax is not None and amax.numel() == array.size and name not in report.stale:
                amax.copy_(torch.from_numpy(np.asarray(array, dtype=np.float32)).reshape(amax.shape))
                learned += 1
    report.finetune = f"fine-tuned weights of run {record.id} in use" + (
        f", {learned} learned amax" if learned else "")


def load_record(quantizer: TensorQuantizer, record: QuantizerRecord, device: torch.device) -> None:
    """Load a stored calibration outcome (amax and calibrator statistics) into ``quantizer``."""
    amax = torch.from_numpy(np.asarray(record.amax, dtype=np.float32).copy()).to(device)
    quantizer.replace_amax(amax)
    state = record.calibrator_state
    calibrator = quantizer.calibrator
    if state and calibrator is not None:
        expected = "histogram" if isinstance(calibrator, HistogramCalibrator) else "max"
        if state.get("kind") == expected:
            try:
                calibrator.load_state(state)
            except ValueError as error:
                logger.warning("%s: saved statistics not restored (%s)", record.name, error)
    if isinstance(calibrator, MaxCalibrator) and calibrator.calib_amax is None:
        calibrator.load_state({"kind": "max", "calib_amax": record.amax})
