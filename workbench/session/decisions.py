"""Layer decisions as session jobs: which layers are quantized (by name, pattern, type, subtree or an
ignore policy) and the descriptors of their quantizers. Decisions are plain data in the project; a
change invalidates the quantized model, which is rebuilt when next used.

Functions of a :class:`~workbench.session.Session` (its methods call them), like
:mod:`workbench.session.tensorrt`.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from workbench.project.settings import jsonable, make_descriptor
from workbench.quant.replace import ignore_matcher
from workbench.quant.tensorrt_rules import tensorrt_check
from workbench.session.build import descriptor_of, role_quantizer
from workbench.session.errors import SessionError
from workbench.session.events import SessionEvent
from workbench.session.in_place import swap_descriptors

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["select", "apply_ignore_policy", "set_quantize", "set_descriptor", "reset_descriptor", "descriptors",
           "swap_in_place"]


def select(session: Session, *, names: Iterable[str] | None = None, patterns: Iterable[str] | None = None,
           types: Iterable[str] | None = None, subtree: str | None = None) -> list[str]:
    """Quantizable layers matching any of the criteria (regex patterns match like the ignore policy)."""
    chosen: list[str] = []
    all_names = list(session.project.layers)
    if names is not None:
        unknown = [n for n in names if n not in session.project.layers]
        if unknown:
            raise SessionError(f"Not quantizable layers of this model: {', '.join(unknown[:10])}.")
        chosen += list(names)
    if patterns is not None:
        matcher = ignore_matcher(list(patterns))
        chosen += [n for n in all_names if matcher(n) is not None]
    if types is not None:
        wanted = {t.removeprefix("Quant") for t in types}
        chosen += [n for n, d in session.project.layers.items() if d.type.removeprefix("Quant") in wanted]
    if subtree is not None:
        prefix = subtree.rstrip(".")
        chosen += [n for n in all_names if n == prefix or n.startswith(prefix + ".")]
    return list(dict.fromkeys(chosen))


def apply_ignore_policy(session: Session, patterns: Iterable[str], quantize_others: bool) -> list[str]:
    """Leave the layers matching any of ``patterns`` in float (the matching of :meth:`ignore_preview`);
    with ``quantize_others``, quantize every other layer. One edit (the model is rebuilt once, when next
    used); returns the ignored layers.

    Raises:
        SessionError: no pattern, an invalid regex, or a pattern that matches no layer (named); the
            layers are then as they were.
    """
    patterns = [p for p in patterns if p]
    if not patterns:
        raise SessionError("Give at least one pattern of layers to leave in float.")
    matches = {pattern: session.ignore_preview([pattern]) for pattern in patterns}
    unmatched = [pattern for pattern, names in matches.items() if not names]
    if unmatched:
        raise SessionError(f"No quantizable layer matches {', '.join(map(repr, unmatched))}; the names are as in "
                           "the model tree, matched from their start.")
    ignored = session.ignore_preview(patterns)
    session.set_quantize(ignored, False)
    if quantize_others:
        left_in_float = set(ignored)
        session.set_quantize([name for name in session.project.layers if name not in left_in_float], True)
    return ignored


def _not_a_layer(session: Session, name: str) -> str:
    inside = [layer for layer in session.project.layers if layer.startswith(f"{name}.")]
    hint = f"; the quantizable layers inside it are {', '.join(inside[:8])}" if inside else ""
    return f"{name!r} is not a quantizable layer of this model{hint}."


def set_quantize(session: Session, names: Iterable[str], quantize: bool) -> list[str]:
    """Quantize or leave in float; returns the layers whose decision changed."""
    changed = []
    for name in names:
        if name not in session.project.layers:
            raise SessionError(_not_a_layer(session, name))
        decision = session.project.layers[name]
        if decision.quantize != quantize:
            decision.quantize = quantize
            changed.append(name)
    if changed:
        session._invalidate()
        session._changed(SessionEvent.LAYERS, names=changed)
    return changed


def set_descriptor(session: Session, names: Iterable[str], role: str, **fields: Any) -> list[str]:
    """Change descriptor fields of the ``role`` ("input" or "weight") quantizer of layers.

    Fields are validated like :class:`QuantDescriptor`'s and against what TensorRT builds
    (:func:`~workbench.quant.tensorrt_rules.tensorrt_check`): a descriptor it cannot use raises
    SessionError with the reason; one that only simulates (4-bit) is set and explained in :attr:`notes`.
    The layer's current descriptor (override or default) is the starting point, so one call can
    change just ``num_bits``.
    """
    sim_only: dict[str, list[str]] = {}  # note -> layers
    if role not in ("input", "weight"):
        raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
    model = session.quantized_model()
    modules = dict(model.named_modules())
    updates: dict[str, dict[str, Any]] = {}
    for name in list(names):
        if name not in session.project.layers:
            raise SessionError(f"{name!r} is not a quantizable layer of this model.")
        module = modules.get(name)
        current = getattr(session.project.layers[name], f"{role}_desc")
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
        verdict = tensorrt_check(role, made.num_bits, made.axis, session.project.layers[name].type)
        if verdict.error:  # refused when set, not at export
            raise SessionError(f"{name}: {verdict.error}")
        if verdict.sim_only:
            sim_only.setdefault(verdict.sim_only, []).append(name)
        if updated != current:
            updates[name] = jsonable(updated)
    # applied only once every layer validated: an error leaves all of them as they were
    for name, updated in updates.items():
        setattr(session.project.layers[name], f"{role}_desc", updated)
    session.notes = [f"{', '.join(layers)}: {note}" for note, layers in sim_only.items()]
    changed = list(updates)
    if changed:
        if swap_in_place(session, updates, role) is None:
            session._invalidate()
        session._changed(SessionEvent.LAYERS, names=changed)
    return changed


def swap_in_place(session: Session, updates: dict[str, dict[str, Any]], role: str) -> list[str] | None:
    """Apply new descriptors to the live quantized model without rebuilding it (see
    :mod:`workbench.session.in_place`); None when the model must be rebuilt instead (or is not built)."""
    if session.needs_rebuild:
        return None  # rebuilt on next use anyway
    return swap_descriptors(session.quantized_model(), updates, role,
                            calibration=session.project.current_calibration,
                            finetune=session.project.current_finetune, report=session.build_report,
                            device=session.device)


def reset_descriptor(session: Session, names: Iterable[str], role: str | None = None) -> list[str]:
    """Back to the layer type's default descriptor (both roles unless ``role`` is given)."""
    changed = []
    for name in names:
        decision = session.project.layers.get(name)
        if decision is None:
            raise SessionError(f"{name!r} is not a quantizable layer of this model.")
        for which in ("input", "weight") if role is None else (role,):
            if getattr(decision, f"{which}_desc") is not None:
                setattr(decision, f"{which}_desc", None)
                changed.append(name)
    changed = list(dict.fromkeys(changed))
    if changed:
        session._invalidate()
        session._changed(SessionEvent.LAYERS, names=changed)
    return changed


def descriptors(session: Session, names: Iterable[str], role: str) -> dict[str, dict[str, Any] | None]:
    """The descriptor fields each layer's ``role`` quantizer uses: its override, else the default it was built with.

    None for a layer without a quantizer for that role (a pooling layer has no weight quantizer).
    """
    if role not in ("input", "weight"):
        raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
    modules = dict(session.quantized_model().named_modules())
    result: dict[str, dict[str, Any] | None] = {}
    for name in names:
        decision = session.project.layers.get(name)
        if decision is None:
            raise SessionError(f"{name!r} is not a quantizable layer of this model.")
        quantizer = role_quantizer(modules.get(name), role)
        override = getattr(decision, f"{role}_desc")
        result[name] = None if quantizer is None else dict(override) if override is not None \
            else descriptor_of(quantizer)
    return result
