"""The quantization formats of an exported graph: which Q/DQ nodes carry INT8, FP8 or INT4, and the
TensorRT custom-op form of FP8 for TensorRT before 10.

* INT8: QuantizeLinear/DequantizeLinear with an int8/uint8 zero point.
* FP8 E4M3: the same operators with a ``float8e4m3fn`` zero point (opset 19).
* INT4 weights: one DequantizeLinear with ``block_size`` reading an INT4 initializer (opset 21).
* FP8 weights: one DequantizeLinear reading a FLOAT8E4M3FN initializer (no QuantizeLinear).
* NVFP4: a FLOAT4E2M1 weight initializer (or ``trt::TRT_FP4DynamicQuantize`` for an activation) read by a
  blocked DequantizeLinear whose scales come from a DequantizeLinear of FP8 block scales (opset 23; see
  :mod:`workbench.export.fp4`).

TensorRT 8.6 and 9 parse FP8 only as pytorch-quantization and Model Optimizer wrote it before opset 19
existed: ``trt::TRT_FP8QuantizeLinear(x, scale)`` -> ``trt::TRT_FP8DequantizeLinear(q, scale)``.
:func:`to_trt_fp8_ops` rewrites a validated standard graph into that form (onnxruntime cannot run it, so the
export validates the standard form and then writes this one).
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from workbench.export.fp4 import FP4_DYNAMIC_QUANTIZE, fold_low_precision_casts, pack_raw_data
from workbench.export.opset import convert_opset, default_opset
from workbench.quant.algorithms.precision import FP8_OPS

__all__ = ["FORMAT_NAMES", "FP8_OPS", "TRT_DOMAIN", "format_counts", "node_format", "to_trt_fp8_ops",
           "fold_int4_casts", "name_int4_weights"]

FORMAT_NAMES = {"int8": "INT8 Q/DQ", "fp8": "FP8 E4M3 Q/DQ", "int4": "INT4 blockwise DequantizeLinear",
                "nvfp4": "NVFP4 (FLOAT4E2M1 two-level DequantizeLinear)"}
TRT_DOMAIN = "trt"
_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


def _element_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every initializer and Constant output of the graph."""
    types = {init.name: init.data_type for init in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == FP4_DYNAMIC_QUANTIZE and len(node.output) == 2:  # TensorRT's FP4 values and FP8 scales
            types[node.output[0]] = TensorProto.FLOAT4E2M1
            types[node.output[1]] = TensorProto.FLOAT8E4M3FN
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    return types


def node_format(node: onnx.NodeProto, types: dict[str, int]) -> str | None:
    """``"int8"``, ``"fp8"``, ``"int4"`` or ``"nvfp4"`` for a Q or DQ node (from its zero point, block size and
    input), else None. Both DequantizeLinear of NVFP4 (the FP8 block scales', the FP4 values') are ``"nvfp4"``."""
    if node.op_type not in (_Q, _DQ):
        return None
    zero_point = node.input[2] if len(node.input) > 2 else ""
    if node.op_type == _DQ and (types.get(node.input[0]) == TensorProto.FLOAT4E2M1 or (
            types.get(node.input[0]) == TensorProto.FLOAT8E4M3FN and not zero_point)):
        return "nvfp4"
    if node.op_type == _DQ and (types.get(node.input[0]) == TensorProto.INT4
                                or any(a.name == "block_size" and a.i for a in node.attribute)):
        return "int4"
    if types.get(zero_point) == TensorProto.FLOAT8E4M3FN:
        return "fp8"
    return "int8"


def format_counts(proto: onnx.ModelProto) -> dict[str, int]:
    """DequantizeLinear nodes per format, plus TensorRT custom FP8 dequantize nodes under ``fp8`` (``nvfp4`` only
    when there are some: two per NVFP4 quantizer)."""
    types = _element_types(proto)
    counts = {"int8": 0, "fp8": 0, "int4": 0, "nvfp4": 0}
    for node in proto.graph.node:
        if node.op_type == _DQ:
            counts[node_format(node, types) or "int8"] += 1
        elif node.op_type == "TRT_FP8DequantizeLinear":
            counts["fp8"] += 1
    if not counts["nvfp4"]:  # the newest format is listed where it is used
        del counts["nvfp4"]
    return counts


def fold_int4_casts(proto: onnx.ModelProto, base_dir: str | None = None) -> int:
    """Fold the casts of quantized weights (INT4, FP8, FP4) into initializers of their type, packed in raw_data,
    and pack the INT4/FP4/FP8 initializers the exporter's own folding left in int32_data; in place, returns how
    many casts were folded. See :func:`workbench.export.fp4.fold_low_precision_casts`."""
    folded = fold_low_precision_casts(proto, base_dir)
    pack_raw_data(proto)
    return folded


def _unfold_fp8_weights(proto: onnx.ModelProto) -> int:
    """Each FP8 weight initializer read by a DequantizeLinear back to a float initializer and a QuantizeLinear
    (the TensorRT custom-op form takes FP8 only between its Q and DQ); in place, returns how many. The float
    values are ``fp8 * scale``: QuantizeLinear gives the same FP8 values back."""
    inits = {init.name: init for init in proto.graph.initializer}
    unfolded = 0
    for node in list(proto.graph.node):
        if node.op_type != _DQ or len(node.input) < 3 or node.input[0] not in inits \
                or inits[node.input[0]].data_type != TensorProto.FLOAT8E4M3FN or node.input[1] not in inits:
            continue
        source = inits[node.input[0]]
        values = numpy_helper.to_array(source).astype("float32")
        scale = numpy_helper.to_array(inits[node.input[1]]).astype("float32")
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and values.ndim > 1:
            shape = [1] * values.ndim
            shape[axis] = -1
            scale = scale.reshape(shape)
        float_name = source.name + ".float"
        proto.graph.initializer.append(numpy_helper.from_array(values * scale, float_name))
        proto.graph.initializer.remove(source)
        quantize = helper.make_node(_Q, [float_name, node.input[1], node.input[2]], [source.name],
                                    name=(node.name or source.name) + ".quantize", axis=axis)
        proto.graph.node.insert(list(proto.graph.node).index(node), quantize)
        unfolded += 1
    return unfolded


def to_trt_fp8_ops(proto: onnx.ModelProto, opset: int) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``proto`` with every FP8 Q/DQ pair as ``trt::TRT_FP8QuantizeLinear`` /
    ``trt::TRT_FP8DequantizeLinear`` (per-tensor scales, no zero point), converted to ``opset`` when the rest
    of the graph allows (FP8 then needs no opset 19). Returns the graph and notes on what was done."""
    result = onnx.ModelProto()
    result.CopyFrom(proto)
    _unfold_fp8_weights(result)
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
