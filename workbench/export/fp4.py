"""NVFP4 in ONNX as TensorRT 10.8+ reads it, and the low-precision initializers (FP4, FP8, INT4) of an export.

NVFP4 (see :mod:`workbench.quant.nvfp4`), opset 23:

* a weight is stored quantized: an FLOAT4E2M1 initializer (two values a byte) and an FLOAT8E4M3FN initializer of
  its block scales; ``DequantizeLinear(scales_fp8, global_scale)`` gives the float block scales and
  ``DequantizeLinear(values_fp4, block_scales, axis, block_size=16)`` the weight (the two-level dequantize);
* an activation goes through TensorRT's dynamic quantizer ``trt::TRT_FP4DynamicQuantize(x, global_scale,
  axis=-1, block_size=16, scale_type=FLOAT8E4M3FN)`` -> (FP4 values, FP8 block scales), then the same two
  DequantizeLinear (Model Optimizer's export writes this pattern).

onnxruntime 1.32 has no CPU kernel for a FLOAT4E2M1 DequantizeLinear (opset 23) nor TensorRT's custom op, so a
graph with NVFP4 is validated with ``onnx.reference.ReferenceEvaluator`` and :class:`TRTFP4DynamicQuantize`, this
module's implementation of the custom op (:func:`reference_session`).

The exporter writes each quantized weight as a ``Cast`` of a float (or int8) initializer to the low-precision
type; :func:`fold_low_precision_casts` folds those casts into initializers of that type with their bytes packed
in ``raw_data`` (INT4 and FP4 two values a byte), which is what TensorRT reads and what the external-data save
can move out of the graph (``int32_data`` holds one value per 4 bytes and always stays inside the graph).
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from workbench.export.network_dtype import bfloat16_matmul_op
from workbench.quant.nvfp4 import NVFP4_BLOCK_SIZE, block_axis_of, nvfp4_blocks, nvfp4_global_scale

__all__ = ["NVFP4_WEIGHT_OP", "NVFP4_ACTIVATION_OP", "TRT_DOMAIN", "FP4_DYNAMIC_QUANTIZE", "LOW_PRECISION_TYPES",
           "nvfp4_weight_tensors", "nvfp4_weight_reference", "nvfp4_activation_reference", "fp8_weight_reference",
           "nvfp4_weight_translation", "nvfp4_activation_translation", "fp8_weight_translation", "translations",
           "fp4_dynamic_quantize_schema", "fold_low_precision_casts", "pack_raw_data", "pack_fp4", "unpack_fp4",
           "needs_reference_evaluator", "reference_session", "ReferenceSession", "fp4_dynamic_quantize_op"]

NVFP4_WEIGHT_OP = "workbench::dq_nvfp4"
NVFP4_ACTIVATION_OP = "workbench::qdq_nvfp4"
FP8_WEIGHT_OP = "workbench::dq_fp8_weight"
TRT_DOMAIN = "trt"
FP4_DYNAMIC_QUANTIZE = "TRT_FP4DynamicQuantize"
# ONNX element type -> the numpy dtype (ml_dtypes) that numpy_helper packs into raw_data
LOW_PRECISION_TYPES: dict[int, Any] = {
    TensorProto.INT4: ml_dtypes.int4, TensorProto.UINT4: ml_dtypes.uint4,
    TensorProto.FLOAT4E2M1: ml_dtypes.float4_e2m1fn, TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
}


# ----- weights and activations in PyTorch (what the graph computes) ------------------------------------------

def nvfp4_weight_tensors(weight: torch.Tensor, amax: torch.Tensor, channel_axis: int,
                         block_size: int = NVFP4_BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A weight as the export stores it: the E2M1 values (float32 on the grid), the FP8 block scales (float32
    holding E4M3 values), the float32 global scale and the axis the blocks run along."""
    axis = block_axis_of(weight.dim(), channel_axis)
    global_scale = nvfp4_global_scale(amax)
    values, scales = nvfp4_blocks(weight.detach().to(torch.float32), global_scale, block_size, axis)
    return values.contiguous(), scales.to(torch.float32).contiguous(), global_scale, axis


def pack_fp4(values: torch.Tensor) -> torch.Tensor | None:
    """E2M1 values (float32 on the grid) as ``torch.float4_e2m1fn_x2``, two a byte along the last axis (the first
    in the low four bits, as ONNX packs FLOAT4E2M1), so the exporter writes a FLOAT4E2M1 initializer itself;
    None for an odd last axis (the export then casts, see :func:`fold_low_precision_casts`)."""
    if values.shape[-1] % 2:
        return None
    levels = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0))
    magnitude = torch.searchsorted(levels, values.abs().contiguous()).to(torch.uint8)
    codes = magnitude | (torch.signbit(values).to(torch.uint8) << 3)
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous().view(torch.float4_e2m1fn_x2)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_fp4`'s values back as float32 (a float tensor is returned as float32)."""
    if packed.dtype != torch.float4_e2m1fn_x2:
        return packed.to(torch.float32)
    raw = packed.view(torch.uint8)
    codes = torch.stack([raw & 0x0F, raw >> 4], dim=-1).reshape(*raw.shape[:-1], -1).to(torch.int64)
    levels = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), device=packed.device)
    magnitude = levels[codes & 7]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def _expand(scales: torch.Tensor, axis: int, block_size: int, size: int) -> torch.Tensor:
    return torch.repeat_interleave(scales, block_size, dim=axis).narrow(axis, 0, size)


def nvfp4_weight_reference(values: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, axis: int,
                           block_size: int) -> torch.Tensor:
    """What the two DequantizeLinear of a stored NVFP4 weight compute."""
    values = unpack_fp4(values)
    block_scales = scales.to(torch.float32) * global_scale.to(torch.float32)
    return values * _expand(block_scales, axis, block_size, values.shape[axis])


def nvfp4_activation_reference(x: torch.Tensor, global_scale: torch.Tensor, block_size: int) -> torch.Tensor:
    """What TRT_FP4DynamicQuantize and its two DequantizeLinear compute (blocks along the last axis)."""
    axis = x.dim() - 1
    values, scales = nvfp4_blocks(x.to(torch.float32), global_scale, block_size, axis)
    block_scales = scales.to(torch.float32) * global_scale.to(torch.float32)
    return (values * _expand(block_scales, axis, block_size, x.shape[axis])).to(x.dtype)


def fp8_weight_reference(values: torch.Tensor, scale: torch.Tensor, axis: int) -> torch.Tensor:
    """What DequantizeLinear of an FP8 weight initializer computes (``values`` float32 holding E4M3 values)."""
    s = scale.to(torch.float32)
    if s.dim() == 1 and values.dim() > 1:
        shape = [1] * values.dim()
        shape[axis] = -1
        s = s.reshape(shape)
    return values.to(torch.float32) * s


@torch.library.custom_op(NVFP4_WEIGHT_OP, mutates_args=())
def _dq_nvfp4(values: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, axis: int,
              block_size: int) -> torch.Tensor:
    return nvfp4_weight_reference(values, scales, global_scale, axis, block_size)


@_dq_nvfp4.register_fake
def _dq_nvfp4_fake(values, scales, global_scale, axis, block_size):
    shape = list(values.shape)
    if values.dtype == torch.float4_e2m1fn_x2:
        shape[-1] *= 2
    return torch.empty(shape, dtype=torch.float32, device=values.device)


@torch.library.custom_op(NVFP4_ACTIVATION_OP, mutates_args=())
def _qdq_nvfp4(x: torch.Tensor, global_scale: torch.Tensor, block_size: int) -> torch.Tensor:
    return nvfp4_activation_reference(x, global_scale, block_size)


@_qdq_nvfp4.register_fake
def _qdq_nvfp4_fake(x, global_scale, block_size):
    return torch.empty_like(x)


@torch.library.custom_op(FP8_WEIGHT_OP, mutates_args=())
def _dq_fp8_weight(values: torch.Tensor, scale: torch.Tensor, axis: int, channels: int) -> torch.Tensor:
    return fp8_weight_reference(values, scale, axis)


@_dq_fp8_weight.register_fake
def _dq_fp8_weight_fake(values, scale, axis, channels):
    return torch.empty(values.shape, dtype=torch.float32, device=values.device)


# ----- onnxscript translations (the torch.export-based exporter) --------------------------------------------

def _is(value: Any, data_type: int) -> bool:
    """Whether the exporter's symbolic ``value`` has the ONNX element type ``data_type`` already."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and int(dtype) == data_type


def nvfp4_weight_translation(values, scales, global_scale, axis: int, block_size: int):
    """An NVFP4 weight: the values cast to FLOAT4E2M1 and the block scales to FLOAT8E4M3FN (folded into
    initializers by :func:`fold_low_precision_casts`), then the two-level DequantizeLinear (opset 23)."""
    from onnxscript import opset23 as op

    values_fp4 = values if _is(values, TensorProto.FLOAT4E2M1) else op.Cast(values, to=TensorProto.FLOAT4E2M1)
    scales_fp8 = scales if _is(scales, TensorProto.FLOAT8E4M3FN) else op.Cast(scales, to=TensorProto.FLOAT8E4M3FN)
    block_scales = op.DequantizeLinear(scales_fp8, global_scale)
    return op.DequantizeLinear(values_fp4, block_scales, axis=axis, block_size=block_size)


def nvfp4_activation_translation(x, global_scale, block_size: int):
    """An NVFP4 activation: TensorRT's dynamic FP4 quantizer, then the two-level DequantizeLinear."""
    from onnxscript import opset23 as op
    from onnxscript.values import Op, Opset

    quantize = Op(Opset(TRT_DOMAIN, 1), FP4_DYNAMIC_QUANTIZE, fp4_dynamic_quantize_schema())
    values_fp4, scales_fp8 = quantize(x, global_scale, axis=-1, block_size=block_size,
                                      scale_type=TensorProto.FLOAT8E4M3FN)
    block_scales = op.DequantizeLinear(scales_fp8, global_scale)
    return op.DequantizeLinear(values_fp4, block_scales, axis=-1, block_size=block_size)


_schema: onnx.defs.OpSchema | None = None


def fp4_dynamic_quantize_schema() -> onnx.defs.OpSchema:
    """The signature of ``trt::TRT_FP4DynamicQuantize`` (as Model Optimizer's export writes it), registered with
    onnx once per process so that onnxscript can emit it and onnx.checker knows its inputs and attributes."""
    global _schema
    if _schema is not None:
        return _schema
    from onnx.defs import OpSchema

    schema = OpSchema(
        FP4_DYNAMIC_QUANTIZE, TRT_DOMAIN, 1,
        doc="TensorRT's dynamic NVFP4 quantizer: FP4 E2M1 values and FP8 E4M3 scales per block along axis.",
        inputs=[OpSchema.FormalParameter("x", "T"), OpSchema.FormalParameter("global_scale", "S")],
        outputs=[OpSchema.FormalParameter("y", "F4"), OpSchema.FormalParameter("y_scale", "F8")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "input"),
                          ("S", ["tensor(float)"], "global scale"), ("F4", ["tensor(float4e2m1)"], "values"),
                          ("F8", ["tensor(float8e4m3fn)"], "block scales")],
        attributes=[OpSchema.Attribute("axis", OpSchema.AttrType.INT, "the blocked axis"),
                    OpSchema.Attribute("block_size", OpSchema.AttrType.INT, "elements per scale"),
                    OpSchema.Attribute("scale_type", OpSchema.AttrType.INT, "element type of the scales")])
    try:
        onnx.defs.register_schema(schema)
    except onnx.defs.SchemaError:  # registered already (another copy of this module)
        pass
    _schema = onnx.defs.get_schema(FP4_DYNAMIC_QUANTIZE, 1, TRT_DOMAIN)
    return _schema


def fp8_weight_translation(values, scale, axis: int, channels: int):
    """An FP8 weight stored as FP8: the E4M3 values cast to FLOAT8E4M3FN (folded into an initializer) into
    DequantizeLinear with a float8e4m3fn zero point (opset 19), as Model Optimizer writes FP8 weights."""
    from onnxscript import opset19 as op

    dims = [channels] if channels else []
    zero = op.Constant(value=onnx.helper.make_tensor("zero_point", TensorProto.FLOAT8E4M3FN, dims,
                                                     [0.0] * max(channels, 1)))
    values_fp8 = values if _is(values, TensorProto.FLOAT8E4M3FN) else op.Cast(values, to=TensorProto.FLOAT8E4M3FN)
    return op.DequantizeLinear(values_fp8, scale, zero, axis=axis)


def translations() -> dict:
    """This module's entries of the exporter's ``custom_translation_table``."""
    return {torch.ops.workbench.dq_nvfp4.default: nvfp4_weight_translation,
            torch.ops.workbench.qdq_nvfp4.default: nvfp4_activation_translation,
            torch.ops.workbench.dq_fp8_weight.default: fp8_weight_translation}


# ----- initializers ----------------------------------------------------------------------------------------

def _packed(name: str, values: np.ndarray, data_type: int) -> onnx.TensorProto:
    """``values`` as an initializer of ``data_type`` with its bytes in raw_data (INT4/FP4 two a byte)."""
    return numpy_helper.from_array(np.asarray(values).astype(LOW_PRECISION_TYPES[data_type]), name)


def fold_low_precision_casts(proto: onnx.ModelProto, base_dir: str | None = None) -> int:
    """Fold every ``Cast(to=INT4 | UINT4 | FLOAT4E2M1 | FLOAT8E4M3FN)`` of an initializer into an initializer of
    that type (bytes in raw_data), in place; returns how many. ``base_dir``: where the graph's external data lies.

    The source initializer goes when nothing else reads it. The values are on the target grid already (the
    export quantized them), so the conversion is exact.
    """
    inits = {init.name: init for init in proto.graph.initializer}
    readers: dict[str, int] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    folded = 0
    for node in list(proto.graph.node):
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or node.input[0] not in inits:
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to not in LOW_PRECISION_TYPES:
            continue
        source = inits[node.input[0]]
        values = numpy_helper.to_array(source, base_dir or "")
        packed = _packed(node.output[0], values.astype(np.float32), to)
        readers[source.name] -= 1
        if source.data_location == TensorProto.EXTERNAL and base_dir:
            # the weights are in a data file: the packed bytes go there too, over the source's own bytes when
            # nothing else reads them (the file does not grow), else at its end
            _write_external(packed, source, base_dir, over_source=readers[source.name] <= 0)
        proto.graph.initializer.append(packed)
        proto.graph.node.remove(node)
        if readers[source.name] <= 0:
            proto.graph.initializer.remove(source)
            inits.pop(source.name)
        folded += 1
    return folded


def _write_external(tensor: onnx.TensorProto, source: onnx.TensorProto, base_dir: str, *, over_source: bool) -> None:
    """Move ``tensor``'s raw bytes into ``source``'s data file (at the source's offset, or appended)."""
    import os

    entries = {entry.key: entry.value for entry in source.external_data}
    path = os.path.join(base_dir, entries["location"])
    data = tensor.raw_data
    with open(path, "r+b") as handle:
        if over_source and len(data) <= int(entries.get("length", 0)):
            offset = int(entries.get("offset", 0))
        else:
            handle.seek(0, os.SEEK_END)
            offset = -(-handle.tell() // 4096) * 4096  # aligned, as onnx's external-data writer does
        handle.seek(offset)
        handle.write(data)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", entries["location"]), ("offset", str(offset)), ("length", str(len(data)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def pack_raw_data(proto: onnx.ModelProto) -> int:
    """Rewrite the INT4/UINT4/FP4/FP8 initializers held in ``int32_data`` (4 bytes a value: what
    ``onnx.helper.make_tensor`` and some exporters' constant folding write) with their bytes packed in raw_data;
    in place, returns how many. Initializers already in raw_data or external data are left alone."""
    rewritten = 0
    for index, init in enumerate(proto.graph.initializer):
        if init.data_type not in LOW_PRECISION_TYPES or init.raw_data or init.data_location == TensorProto.EXTERNAL:
            continue
        values = numpy_helper.to_array(init)
        packed = numpy_helper.from_array(values, init.name)
        packed.doc_string = init.doc_string
        proto.graph.initializer[index].CopyFrom(packed)
        rewritten += 1
    return rewritten


# ----- validation without onnxruntime ----------------------------------------------------------------------

def needs_reference_evaluator(proto: onnx.ModelProto) -> str | None:
    """Why onnxruntime cannot run this graph on the CPU (an FP4 type or TensorRT's dynamic FP4 quantizer), or None."""
    if any(node.op_type == FP4_DYNAMIC_QUANTIZE for node in proto.graph.node):
        return f"TensorRT's {FP4_DYNAMIC_QUANTIZE}"
    if any(init.data_type == TensorProto.FLOAT4E2M1 for init in proto.graph.initializer):
        return "FLOAT4E2M1 DequantizeLinear (opset 23)"
    return None


def _fp4_dynamic_quantize(x: np.ndarray, global_scale: np.ndarray, axis: int, block_size: int,
                          scale_type: int) -> tuple[np.ndarray, np.ndarray]:
    if scale_type != TensorProto.FLOAT8E4M3FN:
        raise ValueError(f"{FP4_DYNAMIC_QUANTIZE}: scale_type {scale_type} (only FLOAT8E4M3FN is written)")
    values, scales = nvfp4_blocks(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                                  torch.from_numpy(np.array(global_scale, dtype=np.float32)), block_size, axis)
    return (values.numpy().astype(ml_dtypes.float4_e2m1fn),
            scales.to(torch.float32).numpy().astype(ml_dtypes.float8_e4m3fn))


def fp4_dynamic_quantize_op() -> type:
    """The reference evaluator's implementation of ``trt::TRT_FP4DynamicQuantize`` (an OpRun class)."""
    from onnx.reference.op_run import OpRun

    class TRTFP4DynamicQuantize(OpRun):
        """``trt::TRT_FP4DynamicQuantize`` for onnx's reference evaluator: per block of ``block_size`` along
        ``axis``, the block scale ``e4m3(block_amax / 6 / global_scale)`` and the values
        ``e2m1(x / (scale * global_scale))`` (see :mod:`workbench.quant.nvfp4`)."""

        op_domain = TRT_DOMAIN

        def _run(self, x, global_scale, axis=-1, block_size=NVFP4_BLOCK_SIZE, scale_type=TensorProto.FLOAT8E4M3FN):
            return _fp4_dynamic_quantize(x, global_scale, int(axis), int(block_size), int(scale_type))

    TRTFP4DynamicQuantize.__name__ = FP4_DYNAMIC_QUANTIZE
    return TRTFP4DynamicQuantize


class _Input:
    def __init__(self, name: str) -> None:
        self.name = name


class ReferenceSession:
    """onnx's reference evaluator behind the two methods of an onnxruntime session the validation uses."""

    def __init__(self, path: str) -> None:
        from onnx.reference import ReferenceEvaluator

        model = onnx.load(path)  # external data loads with it
        initializers = {init.name for init in model.graph.initializer}
        self._inputs = [_Input(i.name) for i in model.graph.input if i.name not in initializers]
        # bf16 GEMMs on float32 BLAS, rounded once (as the block-by-block validation runs them: the same outputs)
        self._evaluator = ReferenceEvaluator(model, new_ops=[fp4_dynamic_quantize_op(), bfloat16_matmul_op()])

    def get_inputs(self) -> list[_Input]:
        return list(self._inputs)

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self._evaluator.run(output_names, feeds)
        return [np.asarray(out, dtype=np.float32) if getattr(out, "dtype", None) is not None
                and out.dtype.kind == "V" else out for out in outputs]


def reference_session(path: str) -> ReferenceSession:
    """A session-like runner of the graph at ``path`` on onnx's reference evaluator (with TensorRT's
    ``TRT_FP4DynamicQuantize``), for graphs onnxruntime cannot run (:func:`needs_reference_evaluator`)."""
    return ReferenceSession(path)
