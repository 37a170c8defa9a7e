"""The engine as a graph: which layer wrote each tensor and which layers read it, with each layer's modules.

trtexec's detailed layer information names every layer's input and output tensors, so the engine's own
data flow can be followed: a standalone ``QuantizeLinear_40`` quantizes the input of the layer it feeds, and
the float layer before it is what forced it. :class:`MappedLayer` is one engine layer with the modules its
name parts led to (:mod:`workbench.engine.mapping`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.engine.layers import EngineLayer
from workbench.engine.mapping import MAPPED_BY, op_of_part

__all__ = ["MappedPart", "MappedLayer", "EngineGraph", "DATA_ONLY_KINDS", "POOL_OPS"]

# layer kinds that move or re-lay data without computing anything of the model
DATA_ONLY_KINDS = ("reformat", "noop", "shuffle", "copy")
POOL_OPS = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax")


@dataclass
class MappedPart:
    part: str                 # the ONNX node (or weight) name in the engine layer's name
    module: str | None        # the project layer (or module) it belongs to
    how: str | None           # one of workbench.engine.mapping.MAPPED_BY
    qdq: bool = False         # a Quantize/Dequantize (or its Clip) of the module
    weight: int = 1           # 2: the module's main arithmetic, 1: other compute, 0: data movement

    @property
    def op(self) -> str:
        return op_of_part(self.part)


@dataclass
class MappedLayer:
    layer: EngineLayer
    parts: list[MappedPart] = field(default_factory=list)
    via_graph: list[str] = field(default_factory=list)   # modules found through the engine graph
    graph_role: str | None = None                          # "quantizes the input of" / "follows" (via_graph)

    @property
    def modules(self) -> list[str]:
        """The modules of this layer, in name order (those found through the graph last)."""
        return list(dict.fromkeys([p.module for p in self.parts if p.module is not None] + self.via_graph))

    @property
    def how(self) -> str | None:
        """The most direct way any of its modules was found (None: not mapped)."""
        ways = [p.how for p in self.parts if p.how is not None] + (["engine graph"] if self.via_graph else [])
        return min(ways, key=MAPPED_BY.index) if ways else None

    @property
    def main(self) -> str | None:
        """The module holding the layer's main arithmetic (its weighted op), else its first computing module."""
        computing = [p for p in self.parts if p.module is not None and not p.qdq]
        if not computing:
            return None
        return max(computing, key=lambda p: p.weight).module

    @property
    def ops(self) -> list[str]:
        return [p.op for p in self.parts]

    @property
    def data_only(self) -> bool:
        kind = self.layer.kind.lower()
        return any(word in kind for word in DATA_ONLY_KINDS) or self.layer.name.startswith("Reformatting CopyNode")

    @property
    def quantizes(self) -> bool:
        """A standalone Quantize: float in, INT8 out, and no computation of a module of its own."""
        layer = self.layer
        if layer.is_region or not layer.inputs or not layer.outputs:
            return False
        float_in = all(p not in ("INT8", None) for p in layer.input_precisions)
        int8_out = all(p == "INT8" for p in layer.output_precisions)
        standalone = self.data_only or "scale" in layer.kind.lower() or (
            bool(self.parts) and all(p.op == "QuantizeLinear" or p.qdq for p in self.parts))
        return float_in and int8_out and standalone

    def inputs_of(self, module: str) -> list[int]:
        """The input indexes ``module`` reads: the main module reads input 0 (TensorRT puts a fused
        convolution's data first), another module fused into it (a residual add) the others."""
        count = len(self.layer.inputs)
        computing = {p.module for p in self.parts if p.module is not None and not p.qdq}
        if count <= 1 or len(computing) <= 1:
            return list(range(count))
        return [0] if module == self.main else list(range(1, count))


class EngineGraph:
    """Producers and readers of every tensor of the engine's layers."""

    def __init__(self, layers: list[MappedLayer]) -> None:
        self.layers = layers
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for index, mapped in enumerate(layers):
            for tensor in mapped.layer.outputs:
                self.producer.setdefault(tensor.name, index)
            for tensor in mapped.layer.inputs:
                self.readers.setdefault(tensor.name, []).append(index)

    def producers_of(self, index: int) -> list[int]:
        return [self.producer[t.name] for t in self.layers[index].layer.inputs if t.name in self.producer]

    def readers_of(self, index: int) -> list[int]:
        return [r for t in self.layers[index].layer.outputs for r in self.readers.get(t.name, [])]

    def computing_producer(self, index: int, tensor: int = 0) -> int | None:
        """The layer that computed input ``tensor`` of layer ``index``, looking through data-only layers."""
        inputs = self.layers[index].layer.inputs
        if tensor >= len(inputs):
            return None
        current = self.producer.get(inputs[tensor].name)
        seen: set[int] = set()
        while current is not None and self.layers[current].data_only and current not in seen:
            seen.add(current)
            ins = self.layers[current].layer.inputs
            current = self.producer.get(ins[0].name) if ins else None
        return current

    def feeds_output(self, index: int) -> bool:
        """Whether layer ``index`` writes a network output, directly or through data-only layers."""
        stack, seen = [index], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if self.layers[current].layer.writes_output:
                return True
            stack.extend(r for r in self.readers_of(current) if self.layers[r].data_only or r == index)
        return False
