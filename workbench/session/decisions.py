"""Layer decisions as session jobs: which layers are quantized (by name, pattern, type, subtree or an
ignore policy) and the descriptors of their quantizers. Decisions are plain data in the project; a
change invalidates the quantized model, which is rebuilt when next used.

Functions of the project's decisions and the quantized model they are read from; the
:class:`~workbench.session.Session`'s methods call them, then rebuild (or edit in place) and tell the front
ends. Nothing here touches the session.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from workbench.plurals import count_text
from workbench.project import LayerDecision, Project
from workbench.project.settings import DefaultDescriptors, jsonable, make_descriptor
from workbench.quant.algorithms.precision import (
    DEFAULT_BLOCK_SIZE,
    Precision,
    descriptors_for,
    parse_precision,
    precision_of,
    weight_bytes,
)
from workbench.quant.algorithms.tensorrt_rules import (
    INT4_BLOCK_SIZES,
    gemm_input_features,
    int4_block_for,
    tensorrt_check,
)
from workbench.quant.gemm import float_by_default_reason
from workbench.quant.replace import default_quant_map, ignore_matcher, quantized_class_for
from workbench.session.build import descriptor_of, quantizable, role_quantizer
from workbench.session.errors import SessionError

logger = logging.getLogger("workbench.session.core")  # the logger this warning always came from

__all__ = ["synced_layers", "quantized_stand_in", "require_quantized", "select", "ignore_preview", "ignored_layers",
           "set_quantize", "plan_descriptor", "precision_groups", "reset_descriptor", "descriptors", "plan_precision",
           "precisions", "mix_weight_bytes", "precision_problems"]


def select(project: Project, *, names: Iterable[str] | None = None, patterns: Iterable[str] | None = None,
           types: Iterable[str] | None = None, subtree: str | None = None) -> list[str]:
    """Quantizable layers matching any of the criteria (regex patterns match like the ignore policy)."""
    chosen: list[str] = []
    all_names = list(project.layers)
    if names is not None:
        unknown = [n for n in names if n not in project.layers]
        if unknown:
            regexes = [n for n in unknown if any(c in n for c in "*+?[]()|^$\\")]
            hint = (f" Names are taken exactly; to choose layers by a regular expression use --pattern "
                    f"{regexes[0]!r}." if regexes else "")
            raise SessionError(f"Not quantizable layers of this model: {', '.join(unknown[:10])}.{hint}")
        chosen += list(names)
    if patterns is not None:
        matcher = ignore_matcher(list(patterns))
        chosen += [n for n in all_names if matcher(n) is not None]
    if types is not None:
        wanted = {t.removeprefix("Quant") for t in types}
        chosen += [n for n, d in project.layers.items() if d.type.removeprefix("Quant") in wanted]
    if subtree is not None:
        prefix = subtree.rstrip(".")
        chosen += [n for n in all_names if n == prefix or n.startswith(prefix + ".")]
    return list(dict.fromkeys(chosen))


def ignore_preview(project: Project, patterns: Iterable[str]) -> list[str]:
    """The layers an ignore policy (list of regexes) would leave in float, without changing anything."""
    try:
        return select(project, patterns=[p for p in patterns if p])
    except (ValueError, TypeError) as error:
        raise SessionError(str(error)) from error


def ignored_layers(project: Project, patterns: Iterable[str]) -> list[str]:
    """The layers matching any of ``patterns`` (the matching of :func:`ignore_preview`), each pattern
    checked to match some layer.

    Raises:
        SessionError: no pattern, an invalid regex, or a pattern that matches no layer (named).
    """
    patterns = [p for p in patterns if p]
    if not patterns:
        raise SessionError("Give at least one pattern of layers to leave in float.")
    matches = {pattern: ignore_preview(project, [pattern]) for pattern in patterns}
    unmatched = [pattern for pattern, names in matches.items() if not names]
    if unmatched:
        raise SessionError(f"No quantizable layer matches {', '.join(map(repr, unmatched))}; the names are as in "
                           "the model tree, matched from their start.")
    return ignore_preview(project, patterns)


def synced_layers(known: Mapping[str, LayerDecision], model: nn.Module) -> dict[str, LayerDecision]:
    """A decision for every quantizable layer of ``model`` (built without decisions): the ``known`` one, else a
    new one (quantize, but LSTMs start float); decisions of layers no longer in the model are dropped (logged)."""
    layers: dict[str, LayerDecision] = {}
    for name, module_type, _ in quantizable(model):
        # LSTMs start float (workbench.quant.gemm.FLOAT_BY_DEFAULT says why); the user may quantize them
        starts_quantized = float_by_default_reason(module_type) is None
        layers[name] = known.get(name) or LayerDecision(name, module_type, starts_quantized)
    dropped = [name for name in known if name not in layers]
    if dropped:
        logger.warning("Layers no longer in the model, their settings dropped: %s", ", ".join(dropped[:10]))
    return layers


def quantized_stand_in(module: nn.Module | None, defaults: DefaultDescriptors | None = None) -> nn.Module | None:
    """``module`` as its layer is when quantized, for reading which quantizers it has and their default descriptors.

    A layer left in float is the user's own module in the quantized model (no quantizers): its quantized class
    built over it (sharing its parameters, default descriptors) stands in, so that a precision or a descriptor
    set on a float layer means what it says (FP8 from float is FP8, not the default INT8; int4w sees the weight
    quantizer the layer will have); it gets ``defaults`` (the project's default descriptors) as a build would. A
    module that already holds quantizers (quantized, or a functional layer
    whose quantizers are off) is returned as it is.
    """
    if module is None or role_quantizer(module, "input") is not None or role_quantizer(module, "weight") is not None:
        return module
    quant_cls, _ = quantized_class_for(module, default_quant_map())
    if quant_cls is None:
        return module
    kwargs = {"quant_desc_input": defaults.descriptor("input") if defaults is not None else None}
    if hasattr(quant_cls, "default_quant_desc_weight"):
        kwargs["quant_desc_weight"] = defaults.descriptor("weight") if defaults is not None else None
    return quant_cls.from_float(module, **kwargs)


def require_quantized(project: Project, what: str) -> None:
    """SessionError when every layer of ``project`` is in float: there is nothing to ``what`` (calibrate, rank,
    smooth), and the message says how to quantize layers again (rather than a library's "no TensorQuantizer")."""
    if project.layers and not any(decision.quantize for decision in project.layers.values()):
        raise SessionError(f"every layer of this project is in float ({count_text(len(project.layers), 'layer')}), "
                           f"so there is "
                           f"nothing to {what}. Quantize layers first: workbench set --pattern '.*' --precision int8 "
                           "(or fp8, int4w), or choose a precision in the model tree.")


def _not_a_layer(project: Project, name: str) -> str:
    inside = [layer for layer in project.layers if layer.startswith(f"{name}.")]
    hint = f"; the quantizable layers inside it are {', '.join(inside[:8])}" if inside else ""
    return f"{name!r} is not a quantizable layer of this model{hint}."


def set_quantize(project: Project, names: Iterable[str], quantize: bool) -> list[str]:
    """Quantize or leave in float (the project's decisions); returns the layers whose decision changed."""
    changed = []
    for name in names:
        if name not in project.layers:
            raise SessionError(_not_a_layer(project, name))
        decision = project.layers[name]
        if decision.quantize != quantize:
            decision.quantize = quantize
            changed.append(name)
    return changed


def plan_descriptor(project: Project, model: nn.Module, names: Iterable[str], role: str,
                    fields: dict[str, Any], defaults: DefaultDescriptors | None = None
                    ) -> tuple[dict[str, dict[str, Any] | None], list[str]]:
    """What changing descriptor fields of the ``role`` ("input" or "weight") quantizer of layers makes of their
    stored descriptors, changing nothing: ``({layer: new descriptor}, notes)`` for the layers it changes, the
    notes saying which of them only simulate in TensorRT.

    Fields are validated like :class:`QuantDescriptor`'s and against what TensorRT builds
    (:func:`~workbench.quant.algorithms.tensorrt_rules.tensorrt_check`): a descriptor it cannot use raises
    SessionError with the reason. The layer's current descriptor (override, else the default ``model``
    was built with) is the starting point, so one call can change just ``num_bits``.

    A descriptor edited back to the layer's default becomes None (no override: it reads and digests as
    untouched); one edited back to its precision's default (``defaults``: the project's default descriptors)
    becomes the override :func:`plan_precision` writes; setting the values a layer has is no change.
    """
    sim_only: dict[str, list[str]] = {}  # note -> layers
    if role not in ("input", "weight"):
        raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
    modules = dict(model.named_modules())
    updates: dict[str, dict[str, Any]] = {}
    for name in list(names):
        if name not in project.layers:
            raise SessionError(f"{name!r} is not a quantizable layer of this model.")
        module = quantized_stand_in(modules.get(name), defaults)
        current = getattr(project.layers[name], f"{role}_desc")
        if current is None:
            quantizer = role_quantizer(module, role)
            if quantizer is None:
                raise SessionError(f"{name} has no {role} quantizer.")
            current = descriptor_of(quantizer)
        updated = dict(current)
        updated.update(fields)
        updated.pop("name", None)
        try:
            made = make_descriptor(updated)
        except (TypeError, ValueError) as error:
            raise SessionError(f"{name}: {error}") from error
        layer_type = project.layers[name].type
        verdict = tensorrt_check(role, made.num_bits, made.axis, layer_type, block_size=made.block_size,
                                 in_features=_in_features(module, layer_type))
        if verdict.error:  # refused when set, not at export
            raise SessionError(f"{name}: {verdict.error}")
        if verdict.sim_only:
            sim_only.setdefault(verdict.sim_only, []).append(name)
        override = getattr(project.layers[name], f"{role}_desc")
        default = descriptor_of(role_quantizer(module, role)) if override is None else \
            _class_default(defaults, module, role)
        precision_default = _precision_default(project, defaults, name, module, role, updated) \
            if defaults is not None else None
        if default is not None and _same_fields(updated, default):
            keep = None
        elif override is not None and _same_fields(updated, override):
            keep = override
        elif precision_default is not None and _same_fields(updated, precision_default):
            keep = precision_default  # as set_precision writes it
        else:
            keep = jsonable(updated)
        if keep != override:
            updates[name] = keep
    return updates, [f"{', '.join(layers)}: {note}" for note, layers in sim_only.items()]


def _normal_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A descriptor's fields without those at QuantDescriptor's defaults, and without the name."""
    made = jsonable(make_descriptor({k: v for k, v in fields.items() if k != "name"}).dict())
    made.pop("name", None)
    return made


def _same_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two descriptors' fields make the same quantizer (defaults and the name do not count)."""
    return _normal_fields(a) == _normal_fields(b)


def _class_default(defaults: DefaultDescriptors | None, module: Any, role: str) -> dict[str, Any] | None:
    """The descriptor a layer's ``role`` quantizer is built with when it has no override, as
    :func:`~workbench.quant.replace.replace_to_quantization_module` picks it: the project's default, else
    the quantized class's own. None where neither says (a functional layer): its default is not known then."""
    descriptor = (defaults.descriptor(role) if defaults is not None else None) or \
        getattr(type(module), f"default_quant_desc_{role}", None)
    return None if descriptor is None else jsonable(descriptor.dict())


def _precision_default(project: Project, defaults: DefaultDescriptors, name: str, module: Any, role: str,
                       fields: dict[str, Any]) -> dict[str, Any] | None:
    """The ``role`` descriptor :func:`plan_precision` gives the layer in the precision ``fields`` make (its
    other role as it is), from the project's defaults; None for float, custom descriptors or a precision that
    does not apply."""
    decision = project.layers[name]
    quantizers = {r: role_quantizer(module, r) for r in ("input", "weight")}
    pair = {r: (fields if r == role else getattr(decision, f"{r}_desc")
                or (descriptor_of(q) if q is not None else None)) for r, q in quantizers.items()}
    precision = precision_of(pair["input"] if quantizers["input"] is not None else None,
                             pair["weight"] if quantizers["weight"] is not None else None, decision.quantize)
    if precision is None or precision is Precision.FLOAT:
        return None
    try:
        made = descriptors_for(precision, decision.type, has_weight=quantizers["weight"] is not None,
                               weight_ndim=_weight_ndim(module),
                               block_size=int((pair["weight"] or {}).get("block_size") or DEFAULT_BLOCK_SIZE),
                               base_input=_fields_or(defaults.descriptor("input"), pair["input"]),
                               base_weight=_fields_or(defaults.descriptor("weight"), pair["weight"]))
    except (TypeError, ValueError):
        return None
    chosen = made[0] if role == "input" else made[1]
    return None if chosen is None else jsonable(chosen)


def reset_descriptor(project: Project, names: Iterable[str], role: str | None = None) -> list[str]:
    """Back to the layer type's default descriptor (both roles unless ``role`` is given); returns the layers
    whose decision changed."""
    changed = []
    for name in names:
        decision = project.layers.get(name)
        if decision is None:
            raise SessionError(f"{name!r} is not a quantizable layer of this model.")
        for which in ("input", "weight") if role is None else (role,):
            if getattr(decision, f"{which}_desc") is not None:
                setattr(decision, f"{which}_desc", None)
                changed.append(name)
    return list(dict.fromkeys(changed))


def descriptors(project: Project, model: nn.Module, names: Iterable[str],
                role: str) -> dict[str, dict[str, Any] | None]:
    """The descriptor fields each layer's ``role`` quantizer uses: its override, else the default ``model`` was
    built with.

    None for a layer without a quantizer for that role (a pooling layer has no weight quantizer).
    """
    if role not in ("input", "weight"):
        raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
    modules = dict(model.named_modules())
    result: dict[str, dict[str, Any] | None] = {}
    for name in names:
        decision = project.layers.get(name)
        if decision is None:
            raise SessionError(f"{name!r} is not a quantizable layer of this model.")
        quantizer = role_quantizer(modules.get(name), role)
        override = getattr(decision, f"{role}_desc")
        result[name] = None if quantizer is None else dict(override) if override is not None \
            else descriptor_of(quantizer)
    return result


def _fields_or(descriptor: Any, fallback: dict[str, Any] | None) -> dict[str, Any] | None:
    """A project default descriptor's fields; ``fallback`` where the project has none (the type's own)."""
    if fallback is None:
        return None
    if descriptor is None:  # the module's own default: what the precision decides is all there is
        return {}
    return jsonable(descriptor.dict())


def _in_features(module: Any, module_type: str) -> int | None:
    """A GEMM layer's input features (the INT4 blocks run along them); None for other layers."""
    weight = getattr(module, "weight", None)
    return gemm_input_features(tuple(weight.shape), module_type) if weight is not None and hasattr(weight, "shape") \
        else None


def _int4_block(name: str, module: Any, module_type: str, block_size: int | None) -> int:
    """The INT4 block of an int4w layer: ``block_size`` as given (checked with the rest), else the largest block
    TensorRT takes that divides the layer's input features."""
    if block_size is not None:
        return block_size
    in_features = _in_features(module, module_type)
    chosen = int4_block_for(in_features)
    if chosen is None:
        allowed = " or ".join(str(size) for size in sorted(INT4_BLOCK_SIZES))
        raise SessionError(f"{name}: int4w needs INT4 blocks TensorRT builds ({allowed} elements) that divide the "
                           f"layer's input features, and neither divides its {in_features}: run it in int8, fp8 or "
                           "float.")
    return chosen


def _weight_ndim(module: Any) -> int | None:
    weight = getattr(module, "weight", None)
    return weight.dim() if weight is not None and hasattr(weight, "dim") else None


LayerPlan = tuple[bool, "dict[str, Any] | None", "dict[str, Any] | None"]  # quantize, input_desc, weight_desc


def plan_precision(project: Project, model: nn.Module, defaults: DefaultDescriptors, names: Iterable[str],
                   precision: Precision | str, *, block_size: int | None = None,
                   fp8_weight_per_channel: bool = True) -> dict[str, LayerPlan]:
    """What running layers in ``precision`` (:class:`~workbench.quant.algorithms.precision.Precision`) makes of each
    one's decision, changing nothing: ``{name: (quantize, input_desc, weight_desc)}`` for the layers it
    changes. The descriptors become the precision's (:func:`~workbench.quant.algorithms.precision.descriptors_for`),
    keeping the fields a precision does not decide (the calibration method); ``float`` only clears the
    quantize flag, keeping the descriptors for when the layer is quantized again. Every layer is checked,
    so the caller applies all or nothing. ``model``: the project's quantized model (the descriptors it was
    built with); ``defaults``: the project's default descriptors. ``block_size`` (int4w): elements per INT4
    scale, one of the sizes TensorRT takes that divides each layer's input features; None picks the largest
    that does, per layer.

    Raises:
        SessionError: an unknown precision or layer, or a precision that does not apply to a layer (int4w
            on a convolution: the message names the layer and says why).
    """
    try:
        precision = parse_precision(precision)
    except ValueError as error:
        raise SessionError(str(error)) from error
    names = list(dict.fromkeys(names))
    modules = dict(model.named_modules())
    planned: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
    for name in names:
        decision = project.layers.get(name)
        if decision is None:
            raise SessionError(_not_a_layer(project, name))
        if precision is Precision.FLOAT:
            continue
        module = quantized_stand_in(modules.get(name), defaults)
        input_q, weight_q = role_quantizer(module, "input"), role_quantizer(module, "weight")
        current_input = decision.input_desc or (descriptor_of(input_q) if input_q is not None else None)
        current_weight = decision.weight_desc or (descriptor_of(weight_q) if weight_q is not None else None)
        if precision_of(current_input, current_weight) is not precision:
            # another format: start from the project's default descriptors (an FP8 layer made INT8 again gets
            # the default histogram calibration back, not FP8's max)
            current_input = _fields_or(defaults.descriptor("input"), current_input)
            current_weight = _fields_or(defaults.descriptor("weight"), current_weight)
        try:
            block = _int4_block(name, module, decision.type, block_size) if precision is Precision.INT4W \
                else DEFAULT_BLOCK_SIZE
            inputs, weight = descriptors_for(precision, decision.type, has_weight=weight_q is not None,
                                             weight_ndim=_weight_ndim(module), block_size=block,
                                             fp8_weight_per_channel=fp8_weight_per_channel,
                                             base_input=current_input, base_weight=current_weight)
            for role, fields in (("input", inputs), ("weight", weight)):
                if fields is None:
                    continue
                made = make_descriptor(fields)
                verdict = tensorrt_check(role, made.num_bits, made.axis, decision.type, block_size=made.block_size,
                                         in_features=_in_features(module, decision.type))
                if verdict.error:
                    raise ValueError(verdict.error)
        except (TypeError, ValueError) as error:
            raise SessionError(f"{name}: {error}") from error
        planned[name] = (None if input_q is None else jsonable(inputs),
                         None if weight_q is None else jsonable(weight))
    plans: dict[str, LayerPlan] = {}
    for name in names:
        decision = project.layers[name]
        before = (decision.quantize, decision.input_desc, decision.weight_desc)
        after = (False, decision.input_desc, decision.weight_desc) if precision is Precision.FLOAT \
            else (True, *planned[name])
        if after != before:
            plans[name] = after
    return plans


def precision_problems(project: Project, model: nn.Module, defaults: DefaultDescriptors, names: Iterable[str],
                       precision: Precision | str) -> dict[str, str]:
    """Why ``precision`` cannot be set on each of ``names`` it does not fit (int4w on a convolution, or on a layer
    whose input features take no INT4 block TensorRT builds); the layers it fits are not listed. Changes nothing."""
    problems: dict[str, str] = {}
    for name in names:
        try:
            plan_precision(project, model, defaults, [name], precision)
        except SessionError as error:
            problems[name] = str(error)
    return problems


def precisions(project: Project, model: nn.Module, names: Iterable[str] | None = None) -> dict[str, Precision | None]:
    """The precision each layer runs in (None: custom descriptors that match no precision)."""
    modules = dict(model.named_modules())
    result: dict[str, Precision | None] = {}
    for name in project.layers if names is None else names:
        decision = project.layers.get(name)
        if decision is None:
            raise SessionError(_not_a_layer(project, name))
        module = modules.get(name)
        input_q, weight_q = role_quantizer(module, "input"), role_quantizer(module, "weight")
        inputs = decision.input_desc or (descriptor_of(input_q) if input_q is not None else None)
        weight = decision.weight_desc or (descriptor_of(weight_q) if weight_q is not None else None)
        result[name] = precision_of(inputs if input_q is not None else None,
                                    weight if weight_q is not None else None, decision.quantize)
    return result


def mix_weight_bytes(project: Project, model: nn.Module, mix: Mapping[str, Precision | None] | None = None) -> int:
    """Weight bytes of the model (scales included) with each layer in its precision (``mix``, default: the
    layers' precisions now); int4w layers count their own block size. See
    :func:`workbench.quant.algorithms.precision.weight_bytes`."""
    mix = dict(precisions(project, model) if mix is None else mix)
    unknown = [name for name in mix if name not in project.layers]
    if unknown:
        raise SessionError(f"Not quantizable layers of this model: {', '.join(unknown[:10])}.")
    blocks = {name: int((project.layers[name].weight_desc or {}).get("block_size") or DEFAULT_BLOCK_SIZE)
              for name in mix}
    return weight_bytes(model, mix, block_size=blocks)


def precision_groups(project: Project, precisions: Mapping[str, str]) -> dict[str, list[str]]:
    """A mix (layer -> precision, a ladder's) as precision -> the project's layers to set to it, in the mix's order;
    layers marked ``custom`` (their own descriptors) and names that are no layer of the project are left out."""
    groups: dict[str, list[str]] = {}
    for name, precision in precisions.items():
        if precision != "custom" and name in project.layers:
            groups.setdefault(precision, []).append(name)
    return groups
