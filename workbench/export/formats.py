"""The quantization formats of an exported graph: which Q/DQ nodes carry INT8, FP8 or INT4, and the
TensorRT custom-op form of FP8 for TensorRT before 10.

* INT8: QuantizeLinear/DequantizeLinear with an int8/uint8 zero point.
* FP8 E4M3: the same operators with a ``float8e4m3fn`` zero point (opset 19).
* INT4 weights: one DequantizeLinear with ``block_size`` reading an INT4 initializer (opset 21).

TensorRT 8.6 and 9 parse FP8 only as pytorch-quantization and Model Optimizer wrote it before opset 19
existed: ``trt::TRT_FP8QuantizeLinear(x, scale)`` -> ``trt::TRT_FP8DequantizeLinear(q, scale)``.
:func:`to_trt_fp8_ops` rewrites a validated standard graph into that form (onnxruntime cannot run it, so the
export validates the standard form and then writes this one).
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from workbench.export.opset import convert_opset, default_opset
from workbench.quant.algorithms.precision import FP8_OPS

__all__ = ["FORMAT_NAMES", "FP8_OPS", "TRT_DOMAIN", "format_counts", "node_format", "to_trt_fp8_ops",
           "fold_int4_casts", "name_int4_weights"]

FORMAT_NAMES = {"int8": "INT8 Q/DQ", "fp8": "FP8 E4M3 Q/DQ", "int4": "INT4 blockwise DequantizeLinear"}
TRT_DOMAIN = "trt"
_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


def _element_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every initializer and Constant output of the graph."""
    types = {init.name: init.data_type for init in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    return types


def node_format(node: onnx.NodeProto, types: dict[str, int]) -> str | None:
    """``"int8"``, ``"fp8"`` or ``"int4"`` for a Q or DQ node (from its zero point, block size and input), else None."""
    if node.op_type not in (_Q, _DQ):
        return None
    if node.op_type == _DQ and (types.get(node.input[0]) == TensorProto.INT4
                                or any(a.name == "block_size" and a.i for a in node.attribute)):
        return "int4"
    zero_point = node.input[2] if len(node.input) > 2 else ""
    if types.get(zero_point) == TensorProto.FLOAT8E4M3FN:
        return "fp8"
    return "int8"


def format_counts(proto: onnx.ModelProto) -> dict[str, int]:
    """DequantizeLinear nodes per format, plus TensorRT custom FP8 dequantize nodes under ``fp8``."""
    types = _element_types(proto)
    counts = {"int8": 0, "fp8": 0, "int4": 0}
    for node in proto.graph.node:
        if node.op_type == _DQ:
            counts[node_format(node, types) or "int8"] += 1
        elif node.op_type == "TRT_FP8DequantizeLinear":
            counts["fp8"] += 1
    return counts


def fold_int4_casts(proto: onnx.ModelProto, base_dir: str | None = None) -> int:
    """Fold ``Cast(to=INT4)`` of an int8 initializer into an INT4 initializer (in place); returns how many.

    The export writes INT4 weights as int8 values cast to INT4; the exporter's optimizer folds the cast of
    small weights only (its constant folding has a size limit). An INT4 initializer is what TensorRT wants
    (it packs two values per byte). ``base_dir``: where a graph's external data lies.
    """
    inits = {init.name: init for init in proto.graph.initializer}
    consumers: dict[str, int] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    folded = 0
    for node in list(proto.graph.node):
        if node.op_type != "Cast" or node.input[0] not in inits:
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to != TensorProto.INT4:
            continue
        source = inits[node.input[0]]
        values = numpy_helper.to_array(source, base_dir or "")
        tensor = helper.make_tensor(node.output[0], TensorProto.INT4, list(values.shape), values.reshape(-1))
        proto.graph.initializer.append(tensor)
        proto.graph.node.remove(node)
        if consumers.get(source.name, 0) <= 1:
            proto.graph.initializer.remove(source)
        folded += 1
    return folded


def to_trt_fp8_ops(proto: onnx.ModelProto, opset: int) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``proto`` with every FP8 Q/DQ pair as ``trt::TRT_FP8QuantizeLinear`` /
    ``trt::TRT_FP8DequantizeLinear`` (per-tensor scales, no zero point), converted to ``opset`` when the rest
    of the graph allows (FP8 then needs no opset 19). Returns the graph and notes on what was done."""
    result = onnx.ModelProto()
    result.CopyFrom(proto)
    types = _element_types(result)
    zero_points: set[str] = set()
    rewritten = 0
    for node in result.graph.node:
        if node.op_type in (_Q, _DQ) and node_format(node, types) == "fp8":
            zero_points.add(node.input[2])
            inputs = list(node.input[:2])
            del node.input[:]
            node.input.extend(inputs)
            del node.attribute[:]  # axis: per-tensor only in this form
            node.op_type = "TRT_FP8QuantizeLinear" if node.op_type == _Q else "TRT_FP8DequantizeLinear"
            node.domain = TRT_DOMAIN
            rewritten += 1
    used = {name for node in result.graph.node for name in node.input}
    for node in list(result.graph.node):  # the float8 zero points have no reader left
        if node.op_type == "Constant" and node.output[0] in zero_points and node.output[0] not in used:
            result.graph.node.remove(node)
    for init in list(result.graph.initializer):
        if init.name in zero_points and init.name not in used:
            result.graph.initializer.remove(init)
    # the FP8 tensors between the pairs: their float8 type is TensorRT's business now
    fp8_values = [v for v in result.graph.value_info if v.type.tensor_type.elem_type == TensorProto.FLOAT8E4M3FN]
    for value in fp8_values:
        result.graph.value_info.remove(value)
    if not any(entry.domain == TRT_DOMAIN for entry in result.opset_import):
        result.opset_import.append(helper.make_opsetid(TRT_DOMAIN, 1))
    notes = [f"FP8 written as TensorRT's custom ops ({rewritten} TRT_FP8QuantizeLinear/TRT_FP8DequantizeLinear "
             "nodes, for TensorRT before 10); onnxruntime cannot run them: the standard form "
             "(QuantizeLinear to float8e4m3fn) was validated, with the same scales"]
    current = default_opset(result)
    if opset < current:
        try:
            result, converted = convert_opset(result, opset)
        except ValueError as error:
            notes.append(f"kept opset {current} (the requested {opset} cannot express the rest of the graph: {error})")
        else:
            notes.extend(converted)
    return result, notes


def name_int4_weights(proto: onnx.ModelProto) -> int:
    """Give each INT4 weight initializer its quantizer's name (``fc1._weight_quantizer.int4_weight``, from the
    scale ``fc1._weight_quantizer.scale`` beside it) instead of the exporter's ``val_7``, for viewers and
    engine reports; in place, returns how many were renamed."""
    types = _element_types(proto)
    inits = {init.name: init for init in proto.graph.initializer}
    taken = set(inits) | {out for node in proto.graph.node for out in node.output}
    renamed = 0
    for node in proto.graph.node:
        if node.op_type != _DQ or types.get(node.input[0]) != TensorProto.INT4 or node.input[0] not in inits:
            continue
        scale = node.input[1]
        if not scale.endswith(".scale"):
            continue
        new = scale[: -len(".scale")] + ".int4_weight"
        old = node.input[0]
        if new in taken or sum(name == old for n in proto.graph.node for name in n.input) != 1:
            continue
        inits[old].name = new
        node.input[0] = new
        taken.add(new)
        renamed += 1
    return renamed
