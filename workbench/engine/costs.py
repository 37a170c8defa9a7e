"""What the quantization's boundaries cost in the engine's run: time shares of the layers that only convert.

A float layer between INT8 layers makes TensorRT write the INT8 layer's output in float and quantize it
again for the next INT8 layer: a standalone Quantize (``QuantizeLinear_40``, a Reformat from FP16 to INT8)
that computes nothing of the model. Layout and precision changes (``Reformatting CopyNode ...``) cost the
same way. Each such layer's share of the run is attributed to the module whose boundary forces it (the
float layer that wrote the tensor) and grouped by cause, with the fix:

* "after float residual adds": the add fused into the convolution reads its identity in float, so the
  fused layer writes float -> quantize the identity (TensorRT Engine Explorer's qat -> qat-residual step);
* "after a float average pool": a pool left in float (the qat-residual -> qat-residual-qgap step);
* "after a float MaxPool": a MaxPool whose output another float layer also reads, so TensorRT cannot move
  the Quantize before it (it does when every reader is quantized with one scale).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.engine.graph import POOL_OPS, EngineGraph, MappedLayer

__all__ = ["COST_KINDS", "EngineCost", "boundary_costs"]

# one vocabulary for the CLI, the GUI and the JSON: kind -> what it means
COST_KINDS = {
    "requantize": "re-quantizing a float tensor for the next INT8 layer (a float layer at a quantized boundary)",
    "reformat": "converting a tensor's layout or precision between layers (Reformat layers TensorRT inserted)",
    "input_quantize": "quantizing the network's input for the first INT8 layer (expected)",
}
_MAX_POOLS = ("MaxPool", "GlobalMaxPool", "ReduceMax")


@dataclass
class EngineCost:
    """Layers of one kind and cause, their share of the run and the modules whose boundary forces them."""

    kind: str                  # a key of COST_KINDS
    cause: str                 # "after float residual adds", "after float pooling", ...
    share: float | None        # percent of the run (None: no profile)
    time_ms: float | None      # per run
    layers: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self, with_fix: bool = True) -> str:
        share = f"{self.share:.1f}% of the run" if self.share is not None else "part of the run (no profile)"
        count = f"{len(self.layers)} layer{'s' if len(self.layers) != 1 else ''}"
        verb = {"requantize": "re-quantizes", "reformat": "reformats",
                "input_quantize": "quantizes the network input"}.get(self.kind, self.kind)
        cause = f" {self.cause}" if self.cause else ""
        where = f" ({', '.join(self.modules[:8])}{' ...' if len(self.modules) > 8 else ''})" if self.modules else ""
        return f"{share} {verb}{cause}{where}: {count}" + (f". Fix: {self.fix}" if self.fix and with_fix else "")


_ADDS_FIX = ("quantize the residual adds ({command}; with the residual rule on, only their identity input gets a "
             "Quantize) so each add fuses into its convolution in INT8 and writes INT8 (TensorRT Engine Explorer's "
             "qat -> qat-residual step)")


def set_command(modules: list[str]) -> str:
    """The ``workbench set`` command that quantizes ``modules`` (its patterns match from the name's start, as the
    ignore policy does): one pattern when they share a last name."""
    if not modules:
        return "workbench set PROJECT --quantize LAYER"
    last = {module.rsplit(".", 1)[-1] for module in modules}
    if len(modules) > 3 and len(last) == 1:
        return f"workbench set PROJECT --quantize '.*\\.{last.pop()}$'"
    return "workbench set PROJECT " + " ".join(f"--quantize '{re.escape(m)}$'" for m in modules)


def _share(mapped: MappedLayer, total_ms: float | None) -> float | None:
    layer = mapped.layer
    if layer.time_share is not None:
        return layer.time_share
    if layer.time_ms is not None and total_ms:
        return 100.0 * layer.time_ms / total_ms
    return None


def _cause(graph: EngineGraph, source: int | None) -> tuple[str, list[str], str]:
    """(cause, forcing modules, fix) of a conversion whose input the computing layer ``source`` wrote."""
    if source is None:
        return "of the network input", [], ""
    mapped = graph.layers[source]
    ops = mapped.ops
    by_op = {p.op: p.module for p in mapped.parts if p.module is not None}
    if "Add" in ops or "Sum" in ops:
        module = by_op.get("Add") or mapped.main
        return ("after float residual adds", [module] if module else [], _ADDS_FIX)
    pool = next((op for op in ops if op in POOL_OPS), None)
    if pool is not None:
        module = by_op.get(pool) or mapped.main or mapped.layer.name
        if pool in _MAX_POOLS:
            readers = _float_readers(graph, source)
            which = f" ({', '.join(readers)})" if readers else ""
            return ("after a float MaxPool", [module],
                    f"{module} ({pool}) passes INT8 through only when every reader of its output is quantized with "
                    f"one scale: quantize its float readers too{which}, so TensorRT moves the Quantize before the "
                    "pool and fuses the pool into the INT8 layer before it")
        return ("after a float average pool", [module],
                f"quantize {module} so the pool runs in INT8 and the layer before it writes INT8 (TensorRT Engine "
                "Explorer's qat-residual -> qat-residual-qgap step)")
    module = mapped.main or (mapped.modules[0] if mapped.modules else mapped.layer.name)
    op = next((op for op in reversed(ops) if op), "layer")
    return (f"after float {op}", [module],
            f"{module} runs in float between INT8 layers: quantize it, or leave its INT8 neighbours in float")


def _float_readers(graph: EngineGraph, index: int) -> list[str]:
    """The modules that read layer ``index``'s output in float (through data-only layers), not through a Quantize:
    for a layer of several modules, the one that reads that input (a fused add reads input 1 and up)."""
    found: list[str] = []
    stack, seen = [index], set()
    outputs = {t.name for t in graph.layers[index].layer.outputs}
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for reader in graph.readers_of(current):
            mapped = graph.layers[reader]
            if mapped.quantizes:
                continue
            if mapped.data_only:
                outputs |= {t.name for t in mapped.layer.outputs}
                stack.append(reader)
                continue
            slots = [i for i, t in enumerate(mapped.layer.inputs) if t.name in outputs]
            # the first other module of the fused layer is the op that reads that input (the add; its relu after)
            others = [m for m in mapped.modules if m != mapped.main][:1]
            modules = others if slots and min(slots) > 0 else [mapped.main]
            found.extend(m for m in modules if m and m not in found)
    return found


def boundary_costs(graph: EngineGraph, total_ms: float | None) -> list[EngineCost]:
    """The conversion layers of the engine grouped by kind and cause, most expensive first."""
    groups: dict[tuple[str, str], EngineCost] = {}
    listed: dict[tuple[str, str], set[str]] = {}  # each group's modules as a set: a list test is quadratic
    for index, mapped in enumerate(graph.layers):
        layer = mapped.layer
        if mapped.quantizes:
            kind = "input_quantize" if layer.reads_input else "requantize"
        elif mapped.data_only and "reformat" in (layer.kind.lower() + layer.name.lower()):
            kind = "reformat"
        else:
            continue
        if kind == "requantize":
            cause, modules, fix = _cause(graph, graph.computing_producer(index))
        else:  # the input's Quantize is needed; a layout change is TensorRT's choice of kernels: nothing to fix
            cause, modules, fix = "", mapped.modules, ""
        share, time = _share(mapped, total_ms), layer.time_ms
        cost = groups.setdefault((kind, cause), EngineCost(kind, cause, None, None, [], [], fix))
        cost.layers.append(layer.name)
        seen = listed.setdefault((kind, cause), set())
        for module in modules:
            if module and module not in seen:
                seen.add(module)
                cost.modules.append(module)
        if share is not None:
            cost.share = (cost.share or 0.0) + share
        if time is not None:
            cost.time_ms = (cost.time_ms or 0.0) + time
    for cost in groups.values():
        cost.fix = cost.fix.replace("{command}", f"`{set_command(cost.modules)}`")
    return sorted(groups.values(), key=lambda c: (c.kind != "requantize", -(c.share or 0.0)))
