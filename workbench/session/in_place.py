"""A descriptor edit applied to the live quantized model: the edited quantizers are swapped, nothing is rebuilt.

Rebuilding the quantized model after an edit re-runs module replacement, the fx rewrite (tracing, with its
checks against the original module) and the placement rules: seconds on a transformer, for what changes one
quantizer. A quantizer that belongs to one plain quantized module (a Linear's, a Conv's), that no placement
rule shares or switched off, can instead be replaced by a new one made from the new descriptor, with the
project's calibration restored onto it exactly as a rebuild would (its amax where the descriptor it was
calibrated with is the new one, stale otherwise). Anything else (functional layers such as attention
products, shared scales, learned ranges of a fine-tune) is left to the rebuild, which is always right.

Pure functions: they get the model and what they need, and return what they did.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from workbench.project import CalibrationRecord, FinetuneRecord
from workbench.project.settings import make_descriptor
from workbench.quant import TensorQuantizer
from workbench.quant.snapshot import quantizer_names
from workbench.session.build import FUNCTIONAL_MODULES, BuildReport, descriptor_of, layer_of, load_record

__all__ = ["ROLE_ATTRIBUTES", "swap_descriptors"]

# the quantizer a plain quantized module uses for each role (functional layers have others: not swapped here)
ROLE_ATTRIBUTES = {"input": "_input_quantizer", "weight": "_weight_quantizer"}


def swap_descriptors(model: nn.Module, descriptors: Mapping[str, dict[str, Any]], role: str, *,
                     calibration: CalibrationRecord | None, finetune: FinetuneRecord | None,
                     report: BuildReport, device: torch.device) -> list[str] | None:
    """Give the ``role`` quantizer of each layer in ``descriptors`` (layer -> stored descriptor fields) a new
    quantizer made from its descriptor, in ``model`` itself; ``report`` (the model's build report) learns
    which quantizers are restored from ``calibration`` and which are stale.

    All or nothing: returns the swapped quantizer names, or None (and ``model`` untouched) when one of the
    layers cannot be edited in place, so that the caller rebuilds the model instead.
    """
    attribute = ROLE_ATTRIBUTES.get(role)
    if attribute is None:
        return None
    modules = dict(model.named_modules())
    names = quantizer_names(model)
    uses: dict[int, int] = {}
    for quantizer in names.values():
        uses[id(quantizer)] = uses.get(id(quantizer), 0) + 1
    learned = finetune.amax if finetune is not None and finetune.amax else {}
    planned: list[tuple[nn.Module, str, TensorQuantizer]] = []
    for layer, fields in descriptors.items():
        module = modules.get(layer)
        if module is None or isinstance(module, FUNCTIONAL_MODULES):
            return None
        old = module._modules.get(attribute)
        name = f"{layer}.{attribute}"
        if not isinstance(old, TensorQuantizer) or uses.get(id(old)) != 1 or names.get(name) is not old:
            return None  # not this module's own quantizer: shared by a placement rule, or none
        if (not old.is_enabled and old.enabled_by_descriptor) or old.pre_quant_scale is not None or name in learned:
            return None  # switched off by a rule, scaled by a smoothing pass, or a range learned in fine-tuning
        try:
            descriptor = make_descriptor(fields)
        except (TypeError, ValueError):
            return None  # the caller validated the fields; a rebuild reports anything left
        new = TensorQuantizer(descriptor)
        new.rounding = old.rounding
        new.train(old.training)
        planned.append((module, name, new.to(device)))
    swapped = []
    for module, name, new in planned:
        module._modules[attribute] = new
        _restore(new, name, calibration, report, device)
        swapped.append(name)
    return swapped


def _restore(quantizer: TensorQuantizer, name: str, calibration: CalibrationRecord | None, report: BuildReport,
             device: torch.device) -> None:
    """What :func:`workbench.session.build.restore_calibration` does for one quantizer."""
    report.restored = [n for n in report.restored if n != name]
    report.stale = [n for n in report.stale if n != name]
    record = calibration.quantizers.get(name) if calibration is not None else None
    if record is None:
        return
    if record.descriptor is not None and record.descriptor != descriptor_of(quantizer):
        report.stale.append(name)
        return
    layer, role = layer_of(name)
    folded_now = set(report.folding.folded_into) if report.folding is not None else set()
    if role == "weight" and layer in folded_now ^ set(calibration.folded or []):
        report.stale.append(name)  # a weight amax taken before (or after) a BatchNorm was folded into it
        return
    load_record(quantizer, record, device)
    report.restored.append(name)
