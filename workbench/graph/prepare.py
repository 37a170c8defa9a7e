"""Prepare a float model for TensorRT INT8 in one call: quantized layers, functional quantizers, rules."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from workbench.graph.functional import FunctionalQuantReport, insert_functional_quantizers
from workbench.graph.rules import PlacementReport, PlacementRules, apply_placement_rules
from workbench.graph.runtime_quant import attach_runtime_quantizers
from workbench.plurals import count_text
from workbench.quant.algorithms.snapshot import holds_quantizers, owned_quantizers
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.replace import (
    DescriptorChoice,
    IgnoredLayer,
    IgnorePolicy,
    ReplacementReport,
    ignore_matcher,
    replace_to_quantization_module,
)
from workbench.quant.tensor_quant import QuantDescriptor

logger = logging.getLogger(__name__)

__all__ = ["PreparationReport", "prepare_for_tensorrt"]


@dataclass
class PreparationReport:
    """The three steps' reports, and what a user must look at."""

    replacement: ReplacementReport
    functional: FunctionalQuantReport | None
    rules: PlacementReport | None
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [self.replacement.summary()]
        if self.functional is not None:
            parts.append(self.functional.summary())
        if self.rules is not None:
            parts.append(self.rules.summary())
        parts.extend(self.warnings)
        return "; ".join(parts)


def _disable_ignored_inner(model: nn.Module, ignore_policy: IgnorePolicy, report: ReplacementReport) -> None:
    """Quantizers created inside another quantized module (a QuantMultiheadAttention's ``sdpa`` and
    ``out_proj``) are not swapped in by name, so the ignore policy is applied to them here: an ignored
    name keeps its module but its quantizers are disabled (float), and it is listed as ignored."""
    ignored = ignore_matcher(ignore_policy)
    if ignore_policy is None:
        return
    already = {layer.name for layer in report.ignored}
    for name, module in model.named_modules():
        if not name or name in already or not holds_quantizers(module):
            continue
        reason = ignored(name)
        if reason is None:
            continue
        for _, quantizer in owned_quantizers(module):
            quantizer.disable()
        report.ignored.append(IgnoredLayer(name, type(module).__name__, reason))


def _quantize_direct_weights(model: nn.Module, functional: FunctionalQuantReport) -> None:
    """Quantized layers whose weight another module's code uses without calling the layer (Hugging Face
    Mamba's ``conv1d.weight`` in ``causal_conv1d_fn`` and ``dt_proj.weight @ x`` in its torch path) are quantized
    where the weight is used: the owner's run-time plan fake-quantizes the weight with the layer's weight quantizer
    and the GEMM's activation with its input quantizer (see :mod:`workbench.graph.runtime_quant`)."""
    for use in functional.record.direct_weights:
        owner = model.get_submodule(use.owner) if use.owner else model
        attach_runtime_quantizers(owner, {}, [(model.get_submodule(use.layer), use.parameter)])
        logger.info("%s: quantized where %s's forward uses its weight (%s)", use.layer, use.owner or "the model",
                    use.operation)


def prepare_for_tensorrt(model: nn.Module, *, ignore_policy: IgnorePolicy = None,
                         quant_desc_input: QuantDescriptor | None = None,
                         quant_desc_weight: QuantDescriptor | None = None, functional: bool = True,
                         rules: PlacementRules | None = None, apply_rules: bool = True,
                         descriptor_for: DescriptorChoice | None = None, add: bool = True, concat: bool = True,
                         matmul: bool = True, attention: bool = True,
                         residual_adds_in_transformer_blocks: bool = False, example_inputs: Any = None,
                         ) -> tuple[nn.Module, PreparationReport]:
    """Quantize ``model`` the way TensorRT's ``--best`` fuses it, before calibration.

    1. :func:`workbench.quant.replace_to_quantization_module` (layers with a quantized counterpart);
    2. :func:`workbench.graph.insert_functional_quantizers` (adds and concatenations), unless
       ``functional`` is False;
    3. :func:`workbench.graph.apply_placement_rules` with ``rules`` (default: all), unless
       ``apply_rules`` is False.

    ``ignore_policy`` applies to layer names and to the names of the new functional quantizers.
    ``descriptor_for(name, module)`` gives per-layer ``(input, weight)`` descriptors (module is None
    for a functional operation); ``add`` / ``concat`` / ``matmul`` / ``attention`` choose which functional
    operations to quantize; ``residual_adds_in_transformer_blocks`` and ``example_inputs`` (one small
    sample batch: traced modules are checked against their originals on it) are passed to
    :func:`workbench.graph.insert_functional_quantizers`.
    Use the returned model (see :func:`insert_functional_quantizers`).
    """
    replacement = replace_to_quantization_module(model, ignore_policy, quant_desc_input=quant_desc_input,
                                                 quant_desc_weight=quant_desc_weight, descriptor_for=descriptor_for)
    functional_report = None
    if functional and (add or concat or matmul or attention):
        functional_choice = None if descriptor_for is None else (lambda name: descriptor_for(name, None)[0])
        model, functional_report = insert_functional_quantizers(
            model, quant_desc_input=quant_desc_input, ignore_policy=ignore_policy, add=add, concat=concat,
            descriptor_for=functional_choice, matmul=matmul, attention=attention,
            residual_adds_in_transformer_blocks=residual_adds_in_transformer_blocks, example_inputs=example_inputs)
    if functional_report is not None and functional_report.record is not None:
        _quantize_direct_weights(model, functional_report)
    _disable_ignored_inner(model, ignore_policy, replacement)
    rules_report = apply_placement_rules(model, rules, runtime=functional_report) if apply_rules else None
    report = PreparationReport(replacement, functional_report, rules_report)
    if not any(isinstance(m, TensorQuantizer) for m in model.modules()):
        report.warnings.append(
            f"nothing was quantized: every quantizable layer is left in float ({len(replacement.ignored)} by the "
            "ignore policy or the layers' decisions)" if replacement.ignored else
            "nothing was quantized: the model has no layer with a quantized counterpart and no functional add or "
            "concatenation that could be traced")
    if functional_report is not None and functional_report.failures:
        failed = count_text(len(functional_report.failures), 'module')
        report.warnings.append(f"{failed} could not be traced; functional "
                               "operations in their own forward stay in floating point")
    for warning in report.warnings:
        if functional_report is None or not functional_report.failures or "could not be traced" not in warning:
            logger.warning(warning)  # the functional rewrite already said which modules could not be traced
    return model, report
