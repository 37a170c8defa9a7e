"""A fast, flat description of a model's module tree, for the layer tree view and the project file.

:func:`describe_model` walks ``nn.Module._modules`` once (no ``named_modules`` generator, no
per-module recursion over parameters), so a model of 10,000 modules is described in a few tens of
milliseconds. Quantizers (:class:`~workbench.quant.nn.TensorQuantizer`) are not rows of the tree: they
are listed on the module that owns them, with their state, and a quantizer shared by several
modules (a TensorRT scale-sharing rule, see :mod:`workbench.graph.rules`) says with whom.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch.fx as fx
from torch import nn

from workbench.plurals import count_text
from workbench.quant.algorithms.snapshot import holds_quantizers, owned_quantizers
from workbench.quant.gemm import unknown_weight_gemm
from workbench.quant.nn.modules._utils import QuantInputMixin, QuantMixin
from workbench.quant.nn.modules.quant_attention import ATTENTION_QUANTIZER_ROLES, QuantMatMul, QuantSDPA
from workbench.quant.nn.modules.quant_ops import QuantAdd, QuantConcat
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.replace import default_quant_map, quantized_class_for

__all__ = ["QuantizerInfo", "ModuleInfo", "ModelTree", "describe_model", "is_quantized_module",
           "quantizer_summary", "quantizer_role", "module_role", "add_note", "module_notes", "NOTES_ATTR"]

_QUANTIZED_BASES = (QuantMixin, QuantInputMixin, QuantAdd, QuantConcat, QuantMatMul, QuantSDPA)
# Short remarks a model transformation leaves on a module for the tree to show ("folded bn1"); a
# plain attribute, so it follows the module through copies and quantized_copy().
NOTES_ATTR = "_workbench_notes"


def add_note(module: nn.Module, text: str) -> None:
    """Attach a remark such as ``"folded bn1"`` to ``module`` (shown in :attr:`ModuleInfo.notes`)."""
    notes = module_notes(module)
    if text not in notes:
        setattr(module, NOTES_ATTR, notes + (text,))


def module_notes(module: nn.Module) -> tuple[str, ...]:
    """The remarks attached to ``module`` with :func:`add_note`."""
    return tuple(module.__dict__.get(NOTES_ATTR) or ())


@dataclass(frozen=True)
class QuantizerInfo:
    """The state of one TensorQuantizer, as the tree shows it."""

    name: str                 # qualified name, e.g. "layer1.0.conv1._input_quantizer"
    owner: str                # qualified name of the module it quantizes for ("" for the root)
    attr: str                 # attribute path under the owner, e.g. "_input_quantizer", "_input_quantizers.0"
    enabled: bool             # not bypassed
    quant: bool               # quantization step on
    calib: bool               # collecting calibration statistics
    num_bits: int | tuple[int, int]
    axis: int | tuple[int, ...] | None
    unsigned: bool
    narrow_range: bool
    calibrator: str | None    # "MaxCalibrator", "HistogramCalibrator" or None
    has_amax: bool
    amax: str                 # "dynamic", "1.2345" or "[min, max](channels)"
    shared_with: tuple[str, ...] = ()  # other qualified names of the same quantizer object
    role: str = ""            # what it quantizes when the attribute name does not say: "query", "key",
                              # "value", "probabilities" (attention products), "" otherwise

    @property
    def active(self) -> bool:
        """True when the quantizer changes values (enabled and quantizing)."""
        return self.enabled and self.quant


@dataclass(frozen=True)
class ModuleInfo:
    """One row of the module tree."""

    name: str                 # qualified name; "" for the model itself
    type_name: str            # class name
    type_path: str            # module.qualname of the class
    parent: str | None        # qualified name of the parent; None for the root
    depth: int
    children: tuple[str, ...]
    num_params: int           # parameters owned directly (not by children)
    total_params: int         # parameters of the whole subtree (each tensor once)
    quantizable: bool         # has a quantized counterpart, or is quantized already
    quantized: bool           # is a quantized module (holds quantizers)
    quant_type: str | None    # the quantized class it becomes (or is)
    quantizers: tuple[QuantizerInfo, ...] = ()
    traced: bool = False      # a torch.fx GraphModule standing in for the user's module (functional quantizers)
    notes: tuple[str, ...] = ()  # what transformations did to it, e.g. ("folded bn1",) (see add_note)
    role: str = ""            # what an attention quantizer module quantizes, e.g. "query x key"

    @property
    def display_type(self) -> str:
        """The type with its role, e.g. ``"QuantMatMul (probabilities x value)"``."""
        return f"{self.type_name} ({self.role})" if self.role else self.type_name


@dataclass
class ModelTree:
    """The rows of :func:`describe_model`, in pre-order (parents before children)."""

    modules: list[ModuleInfo]
    by_name: dict[str, ModuleInfo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.by_name:
            self.by_name = {m.name: m for m in self.modules}

    def __len__(self) -> int:
        return len(self.modules)

    def __getitem__(self, name: str) -> ModuleInfo:
        return self.by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __iter__(self) -> Iterator[ModuleInfo]:
        return iter(self.modules)

    @property
    def root(self) -> ModuleInfo:
        return self.modules[0]

    def children(self, name: str) -> list[ModuleInfo]:
        return [self.by_name[c] for c in self.by_name[name].children]

    def quantizers(self) -> list[QuantizerInfo]:
        """Every quantizer reference in tree order (a shared quantizer once per owner)."""
        return [q for m in self.modules for q in m.quantizers]

    def quantizable(self) -> list[ModuleInfo]:
        return [m for m in self.modules if m.quantizable]

    def summary(self) -> str:
        quantized = sum(1 for m in self.modules if m.quantized)
        quantizable = sum(1 for m in self.modules if m.quantizable and not m.quantized)
        return (f"{count_text(len(self.modules), 'module')}, "
                f"{count_text(self.root.total_params, 'parameter', grouped=True)}, {quantized} quantized, "
                f"{quantizable} more quantizable, {count_text(len(self.quantizers()), 'quantizer')}")


def is_quantized_module(module: nn.Module) -> bool:
    """True for modules that hold quantizers for their own computation (QuantConv2d, QuantAdd, ...)."""
    return isinstance(module, _QUANTIZED_BASES) or holds_quantizers(module)


def quantizer_summary(q: TensorQuantizer) -> str:
    """'dynamic', the per-tensor amax, or '[min, max](channels)'."""
    amax = q.amax
    if amax is None:
        return "dynamic"
    if amax.numel() == 1:
        return f"{float(amax):.4g}"
    return f"[{float(amax.min()):.4g}, {float(amax.max()):.4g}]({amax.numel()})"


def describe_model(model: nn.Module) -> ModelTree:
    """Describe ``model`` as a tree of :class:`ModuleInfo` rows.

    Every module appears once per path (a module registered under two names appears twice), except
    quantizers, which are attached to their owners. Parameter counts: ``num_params`` counts the
    tensors a module registers itself; ``total_params`` counts each tensor of the subtree once.
    amax values are summarised without copying per-channel tensors to the host one by one.

    Args:
        model: any ``nn.Module``.

    Returns:
        A :class:`ModelTree`; ``tree.root`` is the model (name ``""``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"describe_model expects an nn.Module, got {type(model).__name__}.")
    quant_map = default_quant_map()
    quantized_types = set(quant_map.values())

    # First pass: collect rows in pre-order with an explicit stack (deep models do not hit the
    # recursion limit) and remember every path each quantizer object is reachable under.
    rows: list[tuple[str, nn.Module, str | None, int, list[str]]] = []
    own_quantizers: dict[str, list[tuple[str, TensorQuantizer]]] = {}
    quantizer_paths: dict[int, list[str]] = {}
    stack: list[tuple[str, nn.Module, str | None, int]] = [("", model, None, 0)]
    while stack:
        name, module, parent, depth = stack.pop()
        children: list[str] = []
        rows.append((name, module, parent, depth, children))
        pending = []
        quantizers = owned_quantizers(module)
        # quantizers and containers of quantizers are shown on their owner's row, not as children
        shown_on_row = {attr.split(".", 1)[0] for attr, _ in quantizers}
        for attr, child in module._modules.items():
            if child is None or attr in shown_on_row:
                continue
            path = f"{name}.{attr}" if name else attr
            children.append(path)
            pending.append((path, child, name, depth + 1))
        own_quantizers[name] = quantizers
        for attr, q in quantizers:
            quantizer_paths.setdefault(id(q), []).append(f"{name}.{attr}" if name else attr)
        stack.extend(reversed(pending))

    # Second pass, children before parents: subtree parameter counts. A parameter registered by
    # two modules (tied weights) is counted once per subtree; the set arithmetic that takes is only
    # done when the model has such parameters, so the common case stays one addition per module.
    own_params: dict[str, list] = {}
    seen: set[int] = set()
    tied = False
    for name, module, _parent, _depth, _children in rows:
        params = [p for p in module._parameters.values() if p is not None]
        for _attr, q in own_quantizers[name]:
            if q.learn_amax:  # a learned range is a parameter of the quantizer's Clip stage
                params.extend(q.parameters())
        own_params[name] = params
        for p in params:
            if id(p) in seen:
                tied = True
            seen.add(id(p))
    own_counts = {name: sum(p.numel() for p in params) for name, params in own_params.items()}
    totals: dict[str, int] = {}
    if not tied:
        for name, _module, _parent, _depth, children in reversed(rows):
            totals[name] = own_counts[name] + sum(totals[c] for c in children)
    else:
        subtree_ids: dict[str, dict[int, int]] = {}
        for name, _module, _parent, _depth, children in reversed(rows):
            ids = {id(p): p.numel() for p in own_params[name]}
            for child in children:
                ids.update(subtree_ids[child])
            subtree_ids[name] = ids
            totals[name] = sum(ids.values())

    infos = []
    for name, module, parent, depth, children in rows:
        kind = type(module)
        quantized = kind in quantized_types or bool(own_quantizers[name]) or isinstance(module, _QUANTIZED_BASES)
        # subclasses that compute what their base does are quantizable; one with its own forward says why not
        quant_cls, not_quantizable = (None, None) if quantized else quantized_class_for(module, quant_map)
        if not quantized and quant_cls is None and not_quantizable is None and not module._modules:
            not_quantizable = unknown_weight_gemm(module)  # a weight GEMM of an unknown class: say it stays float
        quant_type = kind.__name__ if quantized else (quant_cls.__name__ if quant_cls else None)
        quantizers = tuple(
            _quantizer_info(f"{name}.{attr}" if name else attr, name, attr, q, quantizer_paths.get(id(q), []),
                            quantizer_role(module, attr))
            for attr, q in own_quantizers[name])
        traced = isinstance(module, fx.GraphModule)
        type_path = "torch.fx.GraphModule" if traced else f"{kind.__module__}.{kind.__qualname__}"
        infos.append(ModuleInfo(
            name=name, type_name=kind.__name__, type_path=type_path, parent=parent, traced=traced,
            depth=depth, children=tuple(children), num_params=own_counts[name], total_params=totals[name],
            quantizable=quantized or quant_cls is not None, quantized=quantized, quant_type=quant_type,
            quantizers=quantizers, notes=module_notes(module) + ((not_quantizable,) if not_quantizable else ()),
            role=module_role(module)))
    return ModelTree(infos)


def module_role(module: nn.Module) -> str:
    """What an attention quantizer module quantizes: "query x key", "probabilities x value",
    "query, key, value, probabilities"; "" for other modules."""
    if isinstance(module, QuantSDPA):
        return ", ".join(ATTENTION_QUANTIZER_ROLES.values())
    if isinstance(module, QuantMatMul) and getattr(module, "roles", None):
        return " x ".join(module.roles)
    return ""


def quantizer_role(module: nn.Module, attr: str) -> str:
    """What the quantizer ``attr`` of ``module`` quantizes in an attention ("query", "key", "value",
    "probabilities"), or "" when it is not an attention quantizer."""
    if isinstance(module, QuantSDPA):
        return ATTENTION_QUANTIZER_ROLES.get(attr, "")
    if isinstance(module, QuantMatMul):
        roles = getattr(module, "roles", None) or ()
        index = {"_input0_quantizer": 0, "_input1_quantizer": 1}.get(attr)
        return roles[index] if index is not None and index < len(roles) else ""
    return ""


def _quantizer_info(name: str, owner: str, attr: str, q: TensorQuantizer, paths: list[str],
                    role: str = "") -> QuantizerInfo:
    calibrator = q.calibrator
    return QuantizerInfo(
        name=name, owner=owner, attr=attr, enabled=q.is_enabled, quant=bool(q.is_quant_enabled),
        calib=bool(q.is_calib_enabled), num_bits=q.num_bits, axis=q.axis, unsigned=bool(q.unsigned),
        narrow_range=bool(q.narrow_range), calibrator=type(calibrator).__name__ if calibrator is not None else None,
        has_amax=q.has_amax, amax=quantizer_summary(q),
        shared_with=tuple(p for p in paths if p != name), role=role)
