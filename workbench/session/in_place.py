"""A descriptor edit applied to the live quantized model: the edited quantizers are swapped, nothing is rebuilt.

Rebuilding the quantized model after an edit re-runs module replacement, the fx rewrite (tracing, with its
checks against the original module) and the placement rules: seconds on a transformer, for what changes one
quantizer. A quantizer that belongs to one plain quantized module (a Linear's, a Conv's), that no placement
rule shares or switched off, can instead be replaced by a new one made from the new descriptor, with the
project's calibration restored onto it exactly as a rebuild would (its amax where the descriptor it was
calibrated with is the new one, stale otherwise). Anything else (functional layers such as attention
products, shared scales, learned ranges of a fine-tune) is left to the rebuild, which is always right.

The same holds for a reset to the default descriptor (the default is what a rebuild would give the layer:
the project's default descriptor for the role, else the module class's own) and for a change of precision
that keeps the layer quantized (new descriptors for both roles at once). A change of the quantize flag (a layer
to or from float) switches the layer's own quantizers off (or gives it new ones, on) where nothing else depends on
that flag: a plain quantized module with every quantizer off computes what the original module does, and without
placement rules at work (nothing shared or switched off by them, no functional add or concatenation whose placement
follows the layers around it) no other quantizer changes with it. An attention layer (a QuantSDPA, or the
QuantHFAttention of a Hugging Face attention module) does too: with its query, key, value and probabilities
quantizers off it calls the attention function it stands for, which is what its rebuilt float form calls. It comes
back on in place with the same quantizers where its descriptors did not change and the project's calibration holds
each one's range (what a rebuild restores onto it); otherwise, and for the other functional layers (whose float form
computes another way), the model is rebuilt. A layer switched off in place stays a quantized module with its
quantizers off until the next rebuild; it is back on in place too.

Pure functions: they get the model and what they need, and return what they did.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.project import CalibrationRecord, FinetuneRecord
from workbench.project.settings import DefaultDescriptors, jsonable, make_descriptor
from workbench.quant import QuantDescriptor, TensorQuantizer
from workbench.quant.algorithms.snapshot import holds_quantizers, quantizer_names
from workbench.quant.nn import QuantAdd, QuantConcat
from workbench.quant.nn.modules.quant_attention import QuantSDPA
from workbench.session.build import FUNCTIONAL_MODULES, BuildReport, descriptor_of, layer_of, load_record

__all__ = ["ROLE_ATTRIBUTES", "LayerState", "swap_descriptors", "default_fields", "layer_changes", "swap_layers",
           "LayerChanges", "switches_in_place"]

# the quantizer a plain quantized module uses for each role (functional layers have others: not swapped here)
ROLE_ATTRIBUTES = {"input": "_input_quantizer", "weight": "_weight_quantizer"}

_Swap = tuple[nn.Module, str, str, TensorQuantizer]  # module, attribute, quantizer name, its new quantizer
# a layer's decision as the project stores it: quantize, input descriptor, weight descriptor (None: the default)
LayerState = tuple[bool, "dict[str, Any] | None", "dict[str, Any] | None"]


def swap_descriptors(model: nn.Module, descriptors: Mapping[str, dict[str, Any]], role: str, *,
                     calibration: CalibrationRecord | None, finetune: FinetuneRecord | None,
                     report: BuildReport, device: torch.device) -> list[str] | None:
    """Give the ``role`` quantizer of each layer in ``descriptors`` (layer -> stored descriptor fields) a new
    quantizer made from its descriptor, in ``model`` itself; ``report`` (the model's build report) learns
    which quantizers are restored from ``calibration`` and which are stale.

    All or nothing: returns the swapped quantizer names, or None (and ``model`` untouched) when one of the
    layers cannot be edited in place, so that the caller rebuilds the model instead.
    """
    planned = _plan(model, descriptors, role, finetune=finetune, device=device)
    return None if planned is None else _apply(model, planned, calibration, report, device)


def swap_layers(model: nn.Module, changes: Mapping[str, Mapping[str, dict[str, Any]]], *,
                calibration: CalibrationRecord | None, finetune: FinetuneRecord | None, report: BuildReport,
                device: torch.device, off: Collection[str] = (), on: Collection[str] = ()) -> list[str] | None:
    """:func:`swap_descriptors` for several roles at once (``changes``: layer -> role -> descriptor fields), all
    or nothing across the roles: returns the swapped quantizer names, or None with ``model`` untouched. The layers
    ``off`` (to float) get their quantizers switched off; the layers ``on`` (back from float, switched off in place)
    are in ``changes`` with both roles and get new quantizers although theirs are off, but for an attention, which
    gets its own quantizers back on, their ranges restored from ``calibration``."""
    by_role: dict[str, dict[str, dict[str, Any]]] = {}
    for layer, roles in changes.items():
        for role, fields in roles.items():
            by_role.setdefault(role, {})[layer] = fields
    planned: list[_Swap] = []
    for role, descriptors in by_role.items():
        part = _plan(model, descriptors, role, finetune=finetune, device=device, reviving=on)
        if part is None:
            return None
        planned += part
    switched = _plan_off(model, off, finetune=finetune)
    revived = _plan_attention_on(model, on, calibration=calibration, finetune=finetune)
    if switched is None or revived is None:
        return None
    swapped = _apply(model, planned, calibration, report, device)
    for name, quantizer in revived:
        quantizer.enable()  # the quantizers it had: a rebuild gives the same descriptors, and the range restored here
        _restore(quantizer, name, calibration, report, device)
    _in_model_order(model, report)
    for name, quantizer in switched:
        quantizer.disable()  # in float: the module computes what the original does (its input and weight as they are)
        report.restored = [n for n in report.restored if n != name]
        report.stale = [n for n in report.stale if n != name]
    return swapped + [name for name, _ in switched] + [name for name, _ in revived]


def default_fields(module: nn.Module | None, role: str, default: QuantDescriptor | None) -> dict[str, Any] | None:
    """The stored descriptor fields a rebuild gives ``module``'s ``role`` quantizer when its layer has no override:
    ``default`` (the project's default descriptor for the role) or else the module class's own default, as
    :func:`workbench.quant.replace.replace_modules` chooses; None when the module has no such default."""
    if default is None:
        default = getattr(type(module), f"default_quant_desc_{role}", None) if module is not None else None
    return None if default is None else jsonable(default.dict())


@dataclass
class LayerChanges:
    """What going from one set of layer decisions to another does to the model in place: the new descriptor
    fields per layer and role (``roles``), the layers switched to float (``off``) and back from it (``on``, also in
    ``roles`` with both of their roles)."""

    roles: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    off: list[str] = field(default_factory=list)
    on: list[str] = field(default_factory=list)


def switches_in_place(model: nn.Module, report: BuildReport) -> bool:
    """Whether a layer of ``model`` can go to or from float in place: no placement rule shared or switched off a
    quantizer, and no functional add or concatenation (their placement follows which layers around them are
    quantized), so one layer's flag changes no other quantizer."""
    placement = report.placement
    if placement is not None and (placement.applications or placement.groups):
        return False
    return not any(isinstance(module, (QuantAdd, QuantConcat)) for module in model.modules())


def layer_changes(model: nn.Module, before: Mapping[str, LayerState], after: Mapping[str, LayerState],
                  defaults: DefaultDescriptors, *, switches: bool = False) -> LayerChanges | None:
    """What going from the decisions ``before`` to ``after`` (layer -> :data:`LayerState`) changes in ``model``
    built from ``before``: layer -> role -> the descriptor fields its quantizer must get (a reset role gets
    its default, :func:`default_fields` with the project's ``defaults``), for :func:`swap_layers`.

    None when only a rebuild gives the right model: a layer's quantize flag changed and ``switches`` (see
    :func:`switches_in_place`) is False or the layer is not a plain quantized module, or a float layer is still a
    module with quantizers (a functional one, or one switched off in place) whose descriptors changed. A layer
    float before and after, built as the original float module, changes nothing: its stored descriptors wait for it
    to be quantized again.
    """
    modules = dict(model.named_modules())
    changes = LayerChanges()
    for layer, (quantize, *descriptors) in after.items():
        was_quantized, *old_descriptors = before[layer]
        module = modules.get(layer)
        plain = module is not None and not isinstance(module, FUNCTIONAL_MODULES) and holds_quantizers(module)
        if quantize != was_quantized and isinstance(module, QuantSDPA):
            # an attention: its own quantizers off, or the same ones back on where the decision gives them the
            # descriptor they have (query, key and value take the layer's input descriptor; probabilities follow it)
            fields = descriptors[0] or default_fields(module, "input", defaults.descriptor("input"))
            if not switches or (quantize and not _attention_has(module, fields)):
                return None
            (changes.on if quantize else changes.off).append(layer)
            continue
        if quantize != was_quantized:
            if not (switches and plain):
                return None
            if not quantize:
                changes.off.append(layer)
                continue
            changes.on.append(layer)  # back on: new quantizers for both roles, from the decision
            old_descriptors = [None, None]
            descriptors = [d if d is not None else {} for d in descriptors]
        if not quantize:
            if module is not None and holds_quantizers(module) and old_descriptors != descriptors:
                return None
            continue
        for role, old, new in zip(("input", "weight"), old_descriptors, descriptors):
            if old == new:
                continue
            fields = new or default_fields(module, role, defaults.descriptor(role))
            if fields is None:
                return None
            changes.roles.setdefault(layer, {})[role] = fields
    return changes


def _attention_has(module: QuantSDPA, fields: dict[str, Any] | None) -> bool:
    """Whether the query, key and value quantizers of ``module`` have the descriptor ``fields`` make."""
    if fields is None:
        return False
    try:
        wanted = descriptor_of(TensorQuantizer(make_descriptor(fields)))
    except (TypeError, ValueError):
        return False  # the caller validated the fields; a rebuild reports anything left
    return all(isinstance(q, TensorQuantizer) and descriptor_of(q) == wanted for q in module.quantizers()[:3])


class _Ownership:
    """Which quantizers of ``model`` a layer may change in place: its own (one name, the one it is found under),
    neither scaled by a smoothing pass nor holding a range learned in a fine-tune."""

    def __init__(self, model: nn.Module, finetune: FinetuneRecord | None) -> None:
        self.modules = dict(model.named_modules())
        self.names = quantizer_names(model)
        self.uses: dict[int, int] = {}  # how many names each quantizer has (more than one: shared by a rule)
        for quantizer in self.names.values():
            self.uses[id(quantizer)] = self.uses.get(id(quantizer), 0) + 1
        self.learned = finetune.amax if finetune is not None and finetune.amax else {}

    def owned(self, name: str, quantizer: object) -> bool:
        """Whether ``quantizer``, found under ``name``, is its layer's own and has no smoothing or learned range."""
        return isinstance(quantizer, TensorQuantizer) and self.uses.get(id(quantizer)) == 1 \
            and self.names.get(name) is quantizer and quantizer.pre_quant_scale is None and name not in self.learned


def _plan_off(model: nn.Module, layers: Collection[str], *,
              finetune: FinetuneRecord | None) -> list[tuple[str, TensorQuantizer]] | None:
    """The quantizers to switch off for ``layers`` going to float (name, quantizer); None when one of them is not
    its layer's own (shared), scaled by a smoothing pass or learned in a fine-tune."""
    if not layers:
        return []
    owners = _Ownership(model, finetune)
    found: list[tuple[str, TensorQuantizer]] = []
    for layer in layers:
        module = owners.modules.get(layer)
        for attribute in _own_attributes(module):
            quantizer = module._modules.get(attribute) if module is not None else None
            name = f"{layer}.{attribute}"
            if quantizer is None:
                continue
            if not owners.owned(name, quantizer):
                return None
            found.append((name, quantizer))
    return found


def _own_attributes(module: nn.Module | None) -> list[str]:
    """The attributes of ``module``'s own quantizers: an attention's query, key, value and probabilities, a plain
    quantized module's input and weight."""
    if isinstance(module, QuantSDPA):
        return [name for name, child in module.named_children() if any(child is q for q in module.quantizers())]
    return list(ROLE_ATTRIBUTES.values())


def _plan_attention_on(model: nn.Module, layers: Collection[str], *, calibration: CalibrationRecord | None,
                       finetune: FinetuneRecord | None) -> list[tuple[str, TensorQuantizer]] | None:
    """The quantizers to switch back on for the attention layers among ``layers`` (switched off in place); None
    when one of them is not its own, or the project's calibration does not hold its range for its descriptor
    (a rebuild gives it none, or marks it stale: only a rebuild gives that model)."""
    if not layers:
        return []  # (the common edit: no walk over the model's quantizers)
    owners = _Ownership(model, finetune)
    attention = [layer for layer in layers if isinstance(owners.modules.get(layer), QuantSDPA)]
    found: list[tuple[str, TensorQuantizer]] = []
    for layer in attention:
        module = owners.modules[layer]
        for attribute in _own_attributes(module):
            quantizer = module._modules[attribute]
            name = f"{layer}.{attribute}"
            record = calibration.quantizers.get(name) if calibration is not None else None
            if not owners.owned(name, quantizer) or not quantizer.enabled_by_descriptor or record is None or \
                    record.descriptor not in (None, descriptor_of(quantizer)):
                return None
            found.append((name, quantizer))
    return found


def _plan(model: nn.Module, descriptors: Mapping[str, dict[str, Any]], role: str, *,
          finetune: FinetuneRecord | None, device: torch.device, reviving: Collection[str] = ()) -> list[_Swap] | None:
    """(module, attribute, quantizer name, new quantizer) for each layer of ``descriptors``; None when one of them
    cannot be swapped in place (nothing is changed either way)."""
    attribute = ROLE_ATTRIBUTES.get(role)
    if attribute is None:
        return None
    owners = _Ownership(model, finetune)
    planned: list[_Swap] = []
    for layer, fields in descriptors.items():
        module = owners.modules.get(layer)
        if module is None or isinstance(module, FUNCTIONAL_MODULES):
            return None
        old = module._modules.get(attribute)
        name = f"{layer}.{attribute}"
        if not owners.owned(name, old):
            return None  # not this module's own quantizer (shared by a rule, or none), smoothed, or learned
        if not old.is_enabled and old.enabled_by_descriptor and layer not in reviving:
            return None  # switched off by a placement rule
        try:
            descriptor = make_descriptor(fields)
        except (TypeError, ValueError):
            return None  # the caller validated the fields; a rebuild reports anything left
        new = TensorQuantizer(descriptor)
        new.rounding = old.rounding
        new.train(old.training)
        planned.append((module, attribute, name, new.to(device)))
    return planned


def _apply(model: nn.Module, planned: list[_Swap], calibration: CalibrationRecord | None,
           report: BuildReport, device: torch.device) -> list[str]:
    swapped = []
    for module, attribute, name, new in planned:
        module._modules[attribute] = new
        _restore(new, name, calibration, report, device)
        swapped.append(name)
    _in_model_order(model, report)
    return swapped


def _in_model_order(model: nn.Module, report: BuildReport) -> None:
    # as a rebuild lists them (``workbench show`` prints the stale ones in this order)
    order = {name: index for index, name in enumerate(quantizer_names(model))}
    report.restored.sort(key=lambda name: order.get(name, len(order)))
    report.stale.sort(key=lambda name: order.get(name, len(order)))


def _restore(quantizer: TensorQuantizer, name: str, calibration: CalibrationRecord | None, report: BuildReport,
             device: torch.device) -> None:
    """What :func:`workbench.session.build.restore_calibration` does for one quantizer."""
    report.restored = [n for n in report.restored if n != name]
    report.stale = [n for n in report.stale if n != name]
    record = calibration.quantizers.get(name) if calibration is not None else None
    if record is None or not quantizer.is_enabled:  # a switched-off quantizer needs no amax: never stale
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
