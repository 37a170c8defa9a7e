"""Units of a sensitivity analysis: the sets of quantizers that are switched on or off together.

By default a unit is one quantized layer: a module whose direct children are TensorQuantizers
(``_input_quantizer``, ``_weight_quantizer``, a ModuleList of ``_input_quantizers``, a QuantAdd's
``_input0_quantizer``/``_input1_quantizer``...). Discovery looks only at that structure, never at the
module's class, so quantized modules written elsewhere or by the user are found alike. Groups (a
subtree such as ``model.4``, or a list of subtrees) are units holding every quantizer under them, as
the yolov5 script's per-block analysis does. Only quantizers that quantize (enabled, with quantization
on) belong to a unit: the layers a user already left in float are not analysed again.

Attention: the quantizers of one attention's matrix products move together. An attention module whose
forward holds several QuantMatMuls (``q @ k^T`` and ``p @ v``, named ``attn.matmul`` and
``attn.matmul_1``) gives one unit named after that module (``attn``); a QuantSDPA (or a Hugging Face
attention's ``sdpa``) is one unit already. ``units="transformer_blocks"`` makes each transformer block
(a module of a ModuleList/Sequential holding a LayerNorm or an attention) one unit, and every quantized
layer outside the blocks its own unit, so that a ranking of a 12-layer ViT has 12 block rows.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from workbench.graph.dataflow import in_transformer_block
from workbench.quant.algorithms.snapshot import holds_quantizers, is_quantizing, owned_quantizers
from workbench.quant.nn.modules.quant_attention import QuantMatMul
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

# is_quantizing and holds_quantizers live in workbench.quant.algorithms.snapshot; kept in __all__ for callers
# that import them from here

__all__ = ["Unit", "UnitsSpec", "find_units", "resolve_units", "quantizers_of", "is_quantizing", "holds_quantizers",
           "transformer_block_units", "UNIT_SCHEMES"]

# the named unit schemes a front end can offer (besides lists of module names)
UNIT_SCHEMES = ("layers", "transformer_blocks")


@dataclass(frozen=True)
class Unit:
    """A set of quantizers switched together: one quantized layer, or a group of layers.

    Attributes:
        name: the layer's (or group's) name, as shown to the user.
        quantizers: qualified names of its quantizers (``model.get_submodule(name)`` finds each).
    """

    name: str
    quantizers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "quantizers": list(self.quantizers)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Unit:
        return cls(str(data["name"]), tuple(str(q) for q in data["quantizers"]))


# None (every quantized layer); a list of subtree names, lists of names (one unit each) or Units;
# or a mapping from a group's name to its subtree name(s).
UnitsSpec = Sequence["str | Sequence[str] | Unit"] | Mapping[str, "str | Sequence[str]"] | None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _layer_units(model: nn.Module) -> Iterator[tuple[str, list[tuple[str, TensorQuantizer]]]]:
    """(owner name, its quantizers) for each module holding quantizers, in model order.

    Follows ``_modules`` itself rather than ``named_modules()``: a quantizer shared between two layers
    (TensorRT scale sharing) is deduplicated by ``named_modules`` and would vanish from the second one.
    """
    seen_owners: set[int] = set()

    def visit(module: nn.Module, prefix: str, path: frozenset[int]) -> Iterator:
        owned = owned_quantizers(module)
        # a container of quantizers is part of its owner, not a layer to visit
        claimed = {name.split(".", 1)[0] for name, _ in owned if "." in name}
        if owned and id(module) not in seen_owners:
            seen_owners.add(id(module))
            yield prefix, [(_join(prefix, name), q) for name, q in owned]
        for child_name, child in module._modules.items():
            if child is None or isinstance(child, TensorQuantizer) or child_name in claimed or id(child) in path:
                continue
            yield from visit(child, _join(prefix, child_name), path | {id(child)})

    yield from visit(model, "", frozenset({id(model)}))


def find_units(model: nn.Module) -> list[Unit]:
    """One unit per quantized layer of ``model``, in model order.

    A quantized layer is any module with TensorQuantizer children (directly or in a ModuleList); its
    unit holds those of them that quantize. Quantizers held directly by the model itself become one
    unit each, named after the quantizer.
    """
    units: list[Unit] = []
    products: dict[str, list[int]] = {}  # attention module -> indices of its products' units
    for owner, quantizers in _layer_units(model):
        active = [name for name, q in quantizers if is_quantizing(q)]
        if not active:
            continue
        if owner == "":
            units.extend(Unit(name, (name,)) for name in active)
            continue
        module = model.get_submodule(owner)
        if isinstance(module, QuantMatMul):
            products.setdefault(owner.rpartition(".")[0], []).append(len(units))
        units.append(Unit(owner, tuple(active)))
    merged: set[int] = set()
    taken = {u.name for u in units}
    for parent, indices in products.items():
        if len(indices) < 2:
            continue
        name = parent if parent and parent not in taken else f"{parent}.attention" if parent else "attention"
        quantizers = tuple(q for i in indices for q in units[i].quantizers)
        units[indices[0]] = Unit(name, quantizers)
        merged.update(indices[1:])
    return [u for i, u in enumerate(units) if i not in merged]


def transformer_block_units(model: nn.Module) -> list[Unit]:
    """One unit per transformer block, plus one per quantized layer outside the blocks, in model order.

    A block is a module held by a ModuleList or Sequential whose subtree has a LayerNorm-like layer or
    an attention (``encoder.layer.3``, ``blocks.7``, ``model.layers.0``).
    """
    blocks: list[str] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module._modules.items():
            if child is None or isinstance(child, TensorQuantizer):
                continue
            path = _join(prefix, name)
            if isinstance(module, (nn.ModuleList, nn.Sequential)) and in_transformer_block(child):
                blocks.append(path)
            else:
                visit(child, path)

    visit(model, "")
    if not blocks:
        raise ValueError("The model has no transformer block (a module of a ModuleList/Sequential holding a "
                         "LayerNorm or an attention): use per-layer units.")
    units: list[Unit] = []
    emitted: set[str] = set()
    for unit in find_units(model):
        block = next((b for b in blocks if unit.name == b or unit.name.startswith(b + ".")), None)
        if block is None:
            units.append(unit)
        elif block not in emitted:
            emitted.add(block)
            try:
                units.append(_group(model, block, [block]))
            except ValueError:
                continue
    return units


def quantizers_of(model: nn.Module, name: str) -> list[tuple[str, TensorQuantizer]]:
    """Every quantizer in the subtree ``name`` (the module itself if it is one), shared ones once.

    Raises:
        ValueError: no module of that name (the message suggests close names).
    """
    try:
        root = model.get_submodule(name) if name else model
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"The model has no module named {name!r}.{hint}") from None
    if isinstance(root, TensorQuantizer):
        return [(name, root)]
    found: list[tuple[str, TensorQuantizer]] = []
    seen: set[int] = set()

    def visit(module: nn.Module, prefix: str, path: frozenset[int]) -> None:
        for child_name, child in module._modules.items():
            if child is None or id(child) in path:
                continue
            child_path = _join(prefix, child_name)
            if isinstance(child, TensorQuantizer):
                if id(child) not in seen:
                    seen.add(id(child))
                    found.append((child_path, child))
            else:
                visit(child, child_path, path | {id(child)})

    visit(root, name, frozenset({id(root)}))
    return found


def _group(model: nn.Module, group_name: str, members: Sequence[str]) -> Unit:
    names: list[str] = []
    for member in members:
        if not isinstance(member, str):
            raise TypeError(f"Unit {group_name!r}: module names must be strings, got {member!r}.")
        names.extend(n for n, q in quantizers_of(model, member) if is_quantizing(q) and n not in names)
    if not names:
        raise ValueError(f"Unit {group_name!r} holds no quantizer that quantizes: its layers are not quantized "
                         f"or all their quantizers are disabled.")
    return Unit(group_name, tuple(names))


def resolve_units(model: nn.Module, units: UnitsSpec = None) -> list[Unit]:
    """The units an analysis of ``model`` uses.

    Args:
        model: the quantized model.
        units: None for :func:`find_units` (each quantized layer); a list whose items are a module name
            (its whole subtree is one unit, e.g. ``"model.4"``), a list of module names (one unit named
            ``"a+b"``) or a :class:`Unit`; or a mapping from a group's name to its module name(s).
            Names are exact module names, never substrings (the reference script's ``quant_layer in
            name`` test would put ``model.1`` and ``model.10`` together).

    Raises:
        ValueError: no units, an unknown module name, a unit without quantizers, or a repeated name.
        TypeError: an item of another type.
    """
    if units == "transformer_blocks":
        return transformer_block_units(model)
    if units is None or units == "layers":
        resolved = find_units(model)
        if not resolved:
            raise ValueError("The model has no quantized layer: quantize it first (replace_to_quantization_module), "
                             "and check that its quantizers are enabled.")
        return resolved
    resolved = []
    if isinstance(units, Mapping):
        for group_name, members in units.items():
            resolved.append(_group(model, str(group_name), [members] if isinstance(members, str) else list(members)))
    elif isinstance(units, (str, bytes)) or not isinstance(units, Sequence):
        raise TypeError("units must be None, a list of module names (or lists of names, or Units), or a mapping "
                        f"from group names to module names; got {type(units).__name__}.")
    else:
        for item in units:
            if isinstance(item, Unit):
                for quantizer in item.quantizers:  # fail now rather than half-way through the analysis
                    quantizers_of(model, quantizer)
                resolved.append(item)
            elif isinstance(item, str):
                resolved.append(_group(model, item, [item]))
            elif isinstance(item, Sequence):
                members = list(item)
                resolved.append(_group(model, "+".join(str(m) for m in members), members))
            else:
                raise TypeError(f"A unit must be a module name, a list of names or a Unit, got {item!r}.")
    if not resolved:
        raise ValueError("No units to analyse.")
    names = [u.name for u in resolved]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"Unit names must be unique; repeated: {', '.join(repeated)}.")
    return resolved
