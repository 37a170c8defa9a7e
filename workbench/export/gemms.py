"""The weight GEMMs of an exported graph and which of them kept their weight in floating point.

A Conv, ConvTranspose, Gemm or MatMul (or an ONNX LSTM/GRU/RNN) one of whose operands is a constant weight (an
initializer or a Constant, through layout-only nodes such as Transpose or Reshape) is a weight GEMM. TensorRT runs it in
INT8 only when that weight comes through a DequantizeLinear; one that does not stays float in the engine.
Counting them in the export report means a GEMM the quantizer never saw (a Linear-like of an unknown
class) can no longer pass the Q/DQ count check silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx

__all__ = ["WeightGemms", "weight_gemms"]

_GEMMS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
_RECURRENT = {"LSTM", "GRU", "RNN"}  # weights W and R are inputs 1 and 2
# nodes that only move or reshape a weight on its way to the GEMM
_LAYOUT = {"Transpose", "Reshape", "Identity", "Cast", "Unsqueeze", "Squeeze", "Flatten"}


@dataclass
class WeightGemms:
    """Weight GEMM nodes of a graph: how many, and the names of those whose weight has no Q/DQ."""

    total: int = 0
    float_nodes: list[str] = field(default_factory=list)

    @property
    def quantized(self) -> int:
        return self.total - len(self.float_nodes)


def _origin(name: str, producers: dict[str, onnx.NodeProto], constants: set[str]) -> str:
    """"dq" (a DequantizeLinear), "constant" (a float weight) or "activation", following layout nodes."""
    for _ in range(16):
        if name in constants:
            return "constant"
        node = producers.get(name)
        if node is None:
            return "activation"
        if node.op_type == "DequantizeLinear":
            return "dq"
        if node.op_type == "Constant":
            return "constant"
        if node.op_type not in _LAYOUT or not node.input:
            return "activation"
        name = node.input[0]
    return "activation"


def weight_gemms(proto: onnx.ModelProto) -> WeightGemms:
    """Count the weight GEMMs of ``proto`` (main graph) and name those whose weight is not dequantized."""
    graph = proto.graph
    producers = {output: node for node in graph.node for output in node.output}
    constants = {init.name for init in graph.initializer}
    result = WeightGemms()
    for node in graph.node:
        if node.op_type not in _GEMMS | _RECURRENT:
            continue
        operands = [name for name in node.input[:3 if node.op_type in _RECURRENT else 2] if name]
        if any(_dq_of_constant(name, producers, constants) for name in operands):
            result.total += 1  # its weight comes through Q/DQ: INT8 in the engine
        elif any(_origin(name, producers, constants) == "constant" for name in operands):
            result.total += 1
            result.float_nodes.append(node.name or node.output[0])
        # else: a product of two activations (attention), counted with the functional quantizers
    return result


def _dq_of_constant(name: str, producers: dict[str, onnx.NodeProto], constants: set[str]) -> bool:
    """Whether ``name`` is (through layout nodes) a DequantizeLinear of a constant: a quantized weight."""
    for _ in range(16):
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "DequantizeLinear":
            source = node.input[0]
            while source not in constants:
                inner = producers.get(source)
                if inner is None:
                    return False
                if inner.op_type == "Constant":
                    return True
                if inner.op_type not in _LAYOUT | {"QuantizeLinear"} or not inner.input:
                    return False
                source = inner.input[0]
            return True
        if node.op_type not in _LAYOUT or not node.input:
            return False
        name = node.input[0]
    return False
