"""The export-mode quantizer: one operator that exports as QuantizeLinear -> DequantizeLinear.

During export every active :class:`~workbench.quant.nn.TensorQuantizer` of the model is swapped,
on the model instance and only for the duration of the export, for a :class:`QDQStandIn` holding
the quantizer's ONNX parameters (``scale = amax / max_bound`` as float32, a zero point of 0 typed
int8 or uint8, the channel axis). Its forward calls ``torch.ops.workbench.qdq``, a custom operator
declared with :func:`torch.library.custom_op` (public API) that both of torch's ONNX exporters
translate into exactly one ``QuantizeLinear`` and one ``DequantizeLinear``:

* the torch.export-based exporter (torch >= 2.9 default) through ``custom_translation_table``,
  with an onnxscript function;
* the TorchScript exporter through ``torch.onnx.register_custom_op_symbolic``.

No class is patched, the user's or ours. Narrow-range quantizers (``[-127, 127]``) get an int8
``Clip(-127, 127)`` between Q and DQ: ONNX's int8 QuantizeLinear saturates to ``[-128, 127]``, and
with ``scale = amax / 127`` the value -128 appears for inputs below ``-amax * 127.5 / 127``; the Clip
makes the exported graph compute exactly what the fake-quant model computes.

Two more formats (see :mod:`workbench.quant.algorithms.precision`):

* FP8 E4M3 (``num_bits=(4, 3)``): ``torch.ops.workbench.qdq_fp8`` exports as QuantizeLinear ->
  DequantizeLinear with a ``float8e4m3fn`` zero point (opset 19), ``scale = amax / 448``; per-tensor or
  per-channel (weights).
* INT4 weights in blocks (``block_size``): the weight is quantized here, once, and
  ``torch.ops.workbench.dq_blocked`` exports as one DequantizeLinear(``block_size``, opset 21) reading an
  INT4 initializer (the float weight is no longer in the graph); no QuantizeLinear.
* FP8 weights are stored the same way, as a FLOAT8E4M3FN initializer into DequantizeLinear (a quarter of the
  float weight's bytes); NVFP4 (``num_bits=(2, 1)``) weights as FP4 + FP8-scale initializers and activations
  through TensorRT's dynamic FP4 quantizer (see :mod:`workbench.export.fp4`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workbench.export.fp4 import nvfp4_weight_tensors, pack_fp4, translations
from workbench.opsets import FORMAT_OPSET  # noqa: F401 - re-exported; its home is workbench.opsets
from workbench.quant.kernels.blocks import block_amax_to_scales, block_view, unblock
from workbench.quant.kernels.fake_quant import TINY_AMAX
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.nvfp4 import E2M1, nvfp4_global_scale
from workbench.quant.tensor_quant import E4M3, E4M3_MAX, max_bound_of, min_bound_of

__all__ = ["QDQStandIn", "qdq_reference", "onnx_translation", "register_torchscript_symbolic", "ExportParams",
           "export_params", "fp8_reference", "dq_blocked_reference", "fp8_translation", "dq_blocked_translation",
           "translation_table", "FORMAT_OPSET"]

OP_NAME = "workbench::qdq"
FP8_OP_NAME = "workbench::qdq_fp8"
DQ_BLOCKED_OP_NAME = "workbench::dq_blocked"


def qdq_reference(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, qmin: int,
                  qmax: int) -> torch.Tensor:
    """What ONNX QuantizeLinear -> (Clip) -> DequantizeLinear computes, in torch operations."""
    s = scale.to(torch.float32)
    zp = zero_point.to(torch.float32)
    if s.dim() == 1 and x.dim() > 1:
        shape = [1] * x.dim()
        shape[axis] = -1
        s = s.reshape(shape)
        zp = zp.reshape(shape)
    if torch.is_grad_enabled() and x.requires_grad:
        q = torch.clamp(torch.round(x.to(torch.float32) / s) + zp, qmin, qmax)
        return ((q - zp) * s).to(x.dtype)
    # one temporary, not six: the TorchScript tracer keeps every tensor of the trace alive until it ends, and
    # a weight-sized temporary per step held the weights five times over (the same operations, same bits)
    q = x.to(torch.float32) / s
    q.round_().add_(zp).clamp_(qmin, qmax).sub_(zp).mul_(s)
    return q.to(x.dtype)


@torch.library.custom_op(OP_NAME, mutates_args=())
def _qdq(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, qmin: int,
         qmax: int) -> torch.Tensor:
    return qdq_reference(x, scale, zero_point, axis, qmin, qmax)


@_qdq.register_fake
def _qdq_fake(x, scale, zero_point, axis, qmin, qmax):
    return torch.empty_like(x)


def onnx_translation(x, scale, zero_point, axis: int, qmin: int, qmax: int):
    """onnxscript translation of ``workbench::qdq`` for the torch.export-based ONNX exporter."""
    import onnx
    from onnxscript import opset18 as op

    q = op.QuantizeLinear(x, scale, zero_point, axis=axis)
    if qmin == -127:
        # a narrow signed range: QuantizeLinear saturates to [-128, 127], the Clip keeps -128 out
        low = op.Constant(value=onnx.helper.make_tensor("qmin", onnx.TensorProto.INT8, [], [qmin]))
        high = op.Constant(value=onnx.helper.make_tensor("qmax", onnx.TensorProto.INT8, [], [qmax]))
        q = op.Clip(q, low, high)
    return op.DequantizeLinear(q, scale, zero_point, axis=axis)


def _channel_shape(scale: torch.Tensor, rank: int, axis: int) -> torch.Tensor:
    if scale.dim() == 1 and rank > 1:
        shape = [1] * rank
        shape[axis] = -1
        return scale.reshape(shape)
    return scale


def fp8_reference(x: torch.Tensor, scale: torch.Tensor, axis: int) -> torch.Tensor:
    """What ONNX QuantizeLinear -> DequantizeLinear to ``float8e4m3fn`` (saturating) computes."""
    s = _channel_shape(scale.to(torch.float32), x.dim(), axis)
    q = torch.clamp(x.to(torch.float32) / s, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * s).to(x.dtype)


@torch.library.custom_op(FP8_OP_NAME, mutates_args=())
def _qdq_fp8(x: torch.Tensor, scale: torch.Tensor, axis: int, channels: int) -> torch.Tensor:
    return fp8_reference(x, scale, axis)


@_qdq_fp8.register_fake
def _qdq_fp8_fake(x, scale, axis, channels):
    return torch.empty_like(x)


def fp8_translation(x, scale, axis: int, channels: int):
    """onnxscript translation of ``workbench::qdq_fp8``: Q/DQ with a float8e4m3fn zero point (opset 19)."""
    import onnx
    from onnxscript import opset19 as op

    dims = [channels] if channels else []
    zero = op.Constant(value=onnx.helper.make_tensor("zero_point", onnx.TensorProto.FLOAT8E4M3FN, dims,
                                                     [0.0] * max(channels, 1)))
    q = op.QuantizeLinear(x, scale, zero, axis=axis)
    return op.DequantizeLinear(q, scale, zero, axis=axis)


def dq_blocked_reference(values: torch.Tensor, scale: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """What ONNX DequantizeLinear with ``block_size`` computes: ``values * scale``, each scale repeated over
    ``block_size`` elements along ``axis`` (the last block may be partial)."""
    size = values.shape[axis]
    expanded = torch.repeat_interleave(scale.to(torch.float32), block_size, dim=axis)
    expanded = expanded.narrow(axis, 0, size)
    return values.to(torch.float32) * expanded


@torch.library.custom_op(DQ_BLOCKED_OP_NAME, mutates_args=())
def _dq_blocked(values: torch.Tensor, scale: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    return dq_blocked_reference(values, scale, axis, block_size)


@_dq_blocked.register_fake
def _dq_blocked_fake(values, scale, axis, block_size):
    return torch.empty(values.shape, dtype=torch.float32, device=values.device)


def dq_blocked_translation(values, scale, axis: int, block_size: int):
    """onnxscript translation of ``workbench::dq_blocked``: the int8-held values cast to INT4 (folded into an
    INT4 initializer by the exporter's optimizer, or by :func:`fold_int4_casts`) into DequantizeLinear with
    ``block_size`` (opset 21)."""
    import onnx
    from onnxscript import opset21 as op

    packed = op.Cast(values, to=onnx.TensorProto.INT4)
    return op.DequantizeLinear(packed, scale, axis=axis, block_size=block_size)


def translation_table() -> dict:
    """The ``custom_translation_table`` of the torch.export-based exporter: every workbench operator."""
    return {torch.ops.workbench.qdq.default: onnx_translation,
            torch.ops.workbench.qdq_fp8.default: fp8_translation,
            torch.ops.workbench.dq_blocked.default: dq_blocked_translation, **translations()}


_torchscript_registered = False


def register_torchscript_symbolic() -> None:
    """Teach the TorchScript exporter ``workbench::qdq`` (once per process)."""
    global _torchscript_registered
    if _torchscript_registered:
        return
    from torch.onnx import register_custom_op_symbolic, symbolic_helper

    def symbolic(g, x, scale, zero_point, axis, qmin, qmax):
        axis_value = symbolic_helper._maybe_get_const(axis, "i")
        qmin_value = symbolic_helper._maybe_get_const(qmin, "i")
        q = g.op("QuantizeLinear", x, scale, zero_point, axis_i=axis_value)
        if qmin_value == -127:
            low = g.op("Constant", value_t=torch.tensor(qmin_value, dtype=torch.int8))
            high = g.op("Constant", value_t=torch.tensor(127, dtype=torch.int8))
            q = g.op("Clip", q, low, high)
        return g.op("DequantizeLinear", q, scale, zero_point, axis_i=axis_value)

    def symbolic_fp8(g, x, scale, axis, channels):
        axis_value = symbolic_helper._maybe_get_const(axis, "i")
        count = symbolic_helper._maybe_get_const(channels, "i")
        zero = g.op("Constant", value_t=torch.zeros([count] if count else [], dtype=torch.float8_e4m3fn))
        q = g.op("QuantizeLinear", x, scale, zero, axis_i=axis_value)
        return g.op("DequantizeLinear", q, scale, zero, axis_i=axis_value)

    def symbolic_fp8_weight(g, values, scale, axis, channels):  # an FP8 initializer into DequantizeLinear
        axis_value = symbolic_helper._maybe_get_const(axis, "i")
        count = symbolic_helper._maybe_get_const(channels, "i")
        zero = g.op("Constant", value_t=torch.zeros([count] if count else [], dtype=torch.float8_e4m3fn))
        return g.op("DequantizeLinear", values, scale, zero, axis_i=axis_value)

    register_custom_op_symbolic(OP_NAME, symbolic, 13)
    register_custom_op_symbolic(FP8_OP_NAME, symbolic_fp8, 19)
    register_custom_op_symbolic("workbench::dq_fp8_weight", symbolic_fp8_weight, 19)
    _torchscript_registered = True


# The scale of an amax at or below 2**-24: round(x / 2**100) is 0 for |x| < 2**99, as in fake quant, and
# 127 * 2**100 still fits in float32 (a TensorRT dynamic range).
ZERO_AMAX_SCALE = 2.0 ** 100


@dataclass
class ExportParams:
    """The ONNX parameters of one quantizer."""

    scale: torch.Tensor
    zero_point: torch.Tensor
    amax_shape: tuple[int, ...]
    qmin: int
    qmax: int
    clip: tuple[float, float] | None
    tiny_channels: int
    format: str = "int8"  # "int8", "fp8", "int4" (blockwise weights, dequantize only) or "nvfp4"
    block_size: int | None = None
    block_axis: int = 0  # int4: the weight axis the blocks run along (ONNX DequantizeLinear's axis)
    values: torch.Tensor | None = None  # int4, fp8, nvfp4 weights: the quantized weight (int8, float8, packed float4)
    block_scales: torch.Tensor | None = None  # nvfp4 weights: the FP8 block scales (float32 held)

    @property
    def per_channel(self) -> bool:
        return self.scale.dim() == 1 or self.format == "int4"

    def axis_for(self, rank: int) -> int:
        """The ONNX ``axis`` for an input of ``rank`` dimensions (0 for per-tensor)."""
        if not self.per_channel:
            return 0
        padded = (1,) * (rank - len(self.amax_shape)) + tuple(self.amax_shape)
        return next(i for i, size in enumerate(padded) if size != 1)


def export_params(q: TensorQuantizer, weight: torch.Tensor | None = None) -> ExportParams:
    """Scale and zero point exactly as the fake-quant ``"onnx"`` rounding computes them.

    ``step = amax / max_bound`` in float32 is bit-for-bit the step the fake-quant kernel uses, so
    ONNX's ``round(x / scale)`` equals the PyTorch result. A (channel) amax at or below 2**-24, which
    fake quantization maps to 0 whatever the input, gets :data:`ZERO_AMAX_SCALE`, so that ONNX maps
    every input below 2**99 to 0 as well (scale 1 would pass inputs above 0.5 through).
    Raises ValueError for what ONNX Q/DQ cannot express (the caller names the quantizer).
    """
    if q.num_bits == E2M1:
        return _nvfp4_params(q, weight)
    if q.block_size is not None:
        if weight is None:
            raise ValueError("blockwise quantizer without its weight: blocks export only for a layer's weight")
        return _blocked_params(q, weight)
    if isinstance(q.num_bits, tuple):
        if q.num_bits != E4M3:
            raise ValueError(f"num_bits={q.num_bits!r}: QDQ export takes 8-bit (INT8), (4, 3) (FP8 E4M3), or "
                             "4-bit weights in blocks")
    elif q.num_bits != 8:
        raise ValueError(f"num_bits={q.num_bits!r}: QDQ export takes 8-bit (INT8), (4, 3) (FP8 E4M3), or 4-bit "
                         "weights in blocks (block_size; precision int4w)")
    if not q.fake_quant:
        raise ValueError("fake_quant=False (returns integers): only fake quantizers export to Q/DQ")
    if q.learn_amax:
        low, high = float(q.clip.clip_value_min), float(q.clip.clip_value_max)
        amax = torch.tensor(max(-low, high), dtype=torch.float32)
        clip = (low, high)
    else:
        if not q.has_amax:
            raise LookupError("not calibrated (no amax)")
        amax = q.amax.detach().to(torch.float32)
        clip = None
    if q.scale_amax is not None:
        amax = amax * q.scale_amax
    if torch.isnan(amax).any() or torch.isinf(amax).any():
        raise LookupError("amax is NaN or infinite (calibration saw no data?)")
    amax_shape = tuple(amax.shape)
    if amax.numel() > 1 and sum(1 for s in amax_shape if s != 1) != 1:
        raise ValueError(f"amax of shape {amax_shape} varies along several axes; ONNX Q/DQ takes one axis")
    fp8 = isinstance(q.num_bits, tuple)
    max_bound = E4M3_MAX if fp8 else float(2 ** (8 - 1 + int(q.unsigned)) - 1)
    step = amax / max_bound  # the same float32 division as the fake-quant kernel
    tiny = amax <= TINY_AMAX
    # fake quant sends every finite input of a tiny amax to 0; a scale this large does the same in ONNX
    scale = torch.where(tiny, torch.full_like(step, ZERO_AMAX_SCALE), step)
    scale = scale.reshape(-1) if amax.numel() > 1 else scale.reshape(())
    if fp8:  # the zero point is a float8e4m3fn constant the translation writes; this one only has the shape
        values = None
        if weight is not None and clip is None:  # stored as FP8, quantized once here
            values = fp8_reference_values(_scaled(q, weight), scale, amax_shape)
        return ExportParams(scale, torch.zeros(scale.shape, dtype=torch.float32), amax_shape, -int(E4M3_MAX),
                            int(E4M3_MAX), clip,
                            int(tiny.sum()), format="fp8", values=values)
    dtype = torch.uint8 if q.unsigned else torch.int8
    zero_point = torch.zeros(scale.shape, dtype=dtype, device=scale.device)
    if q.unsigned:
        qmin, qmax = 0, 255
    else:
        qmin, qmax = (-127 if q.narrow_range else -128), 127
    return ExportParams(scale, zero_point, amax_shape, qmin, qmax, clip, int(tiny.sum()))


def _scaled(q: TensorQuantizer, weight: torch.Tensor) -> torch.Tensor:
    """The tensor the quantizer quantizes: the weight times its pre-quantization scale, where it has one."""
    pre = q.pre_quant_scale
    return weight.detach() * pre.detach() if pre is not None else weight.detach()


def fp8_reference_values(weight: torch.Tensor, scale: torch.Tensor, amax_shape: tuple[int, ...]) -> torch.Tensor:
    """A weight's E4M3 values (float32 held) as QuantizeLinear to float8e4m3fn computes them with ``scale``."""
    s = scale.reshape(amax_shape) if scale.dim() == 1 else scale
    x = weight.detach().to(torch.float32) / s.to(weight.device)
    # held as float8: the exporter writes a FLOAT8E4M3FN initializer itself (into the data file of a large graph)
    return torch.clamp(x, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).contiguous()


def _nvfp4_params(q: TensorQuantizer, weight: torch.Tensor | None) -> ExportParams:
    """NVFP4: the global scale; for a weight also its E2M1 values and FP8 block scales (quantized once, here)."""
    if q.learn_amax or not q.fake_quant:
        raise ValueError("NVFP4 exports from a fixed (calibrated) amax and fake quantization only")
    if not q.has_amax:
        raise LookupError("not calibrated (no amax)")
    amax = q.amax.detach().to(torch.float32)
    if q.scale_amax is not None:
        amax = amax * q.scale_amax
    if amax.numel() != 1:
        raise ValueError(f"NVFP4 takes one global amax per tensor, got {amax.numel()} values (recalibrate)")
    if torch.isnan(amax).any() or torch.isinf(amax).any():
        raise LookupError("amax is NaN or infinite (calibration saw no data?)")
    tiny = int(amax.reshape(()) <= TINY_AMAX)
    if weight is None:
        global_scale = nvfp4_global_scale(amax)
        # a tiny amax quantizes to 0; a scale TensorRT takes (positive) whose block scales all round to 0 does too
        scale = torch.where(global_scale > 0, global_scale, torch.tensor(ZERO_AMAX_SCALE)).reshape(())
        return ExportParams(scale, torch.zeros((), dtype=torch.float32), (), 0, 0, None, tiny, format="nvfp4",
                            block_size=q.block_size, block_axis=-1)
    channel_axis = q.axis if isinstance(q.axis, int) else 0
    values, scales, global_scale, axis = nvfp4_weight_tensors(_scaled(q, weight), amax, channel_axis, q.block_size)
    # held as FP4 (two a byte) and FP8: the exporter writes the low-precision initializers itself
    packed = pack_fp4(values)
    values = packed if packed is not None else values
    scales = scales.to(torch.float8_e4m3fn)
    scale = torch.where(global_scale > 0, global_scale, torch.tensor(ZERO_AMAX_SCALE)).reshape(())
    return ExportParams(scale, torch.zeros((), dtype=torch.float32), (), 0, 0, None, tiny, format="nvfp4",
                        block_size=q.block_size, block_axis=axis, values=values, block_scales=scales)


def _blocked_params(q: TensorQuantizer, weight: torch.Tensor) -> ExportParams:
    """INT4 (or other integer) blockwise weight: the quantized values and per-block scales, computed as the
    fake-quant kernel does (``round(w / step)``, ``step = amax / max_bound`` in float32)."""
    if isinstance(q.num_bits, tuple) or q.num_bits != 4:
        raise ValueError(f"num_bits={q.num_bits!r} in blocks: blockwise export takes INT4 weights only")
    if q.learn_amax or not q.fake_quant:
        raise ValueError("blockwise weights export from fixed (calibrated) amax and fake quantization only")
    if not q.has_amax:
        raise LookupError("not calibrated (no amax)")
    amax = q.amax.detach().to(torch.float32)
    if q.scale_amax is not None:
        amax = amax * q.scale_amax
    if torch.isnan(amax).any() or torch.isinf(amax).any():
        raise LookupError("amax is NaN or infinite (calibration saw no data?)")
    blocked = block_view(weight.detach().to(torch.float32), q.axis, q.block_size)
    if amax.dim() != 3 or any(a not in (1, b) for a, b in zip(amax.shape, blocked.shape)):
        raise ValueError(f"block amax of shape {tuple(amax.shape)} does not fit the weight {tuple(weight.shape)} in "
                         f"blocks of {q.block_size} (recalibrate)")
    max_bound = max_bound_of(4, False)
    low = min_bound_of(4, False, q.narrow_range)
    step = amax / max_bound
    tiny = amax <= TINY_AMAX
    safe = torch.where(tiny, torch.ones_like(step), step)
    # on the weight's device: a streamed export computes the scales now and the values (on meta) when written
    on = blocked.device
    values = torch.where(tiny.to(on), torch.zeros_like(blocked),
                         torch.clamp(torch.round(blocked / safe.to(on)), low, max_bound))
    values = unblock(values, tuple(weight.shape), q.axis).to(torch.int8).contiguous()
    along = 1 - q.axis % 2
    scale = block_amax_to_scales(torch.where(tiny, torch.ones_like(step), step), q.axis).contiguous()
    return ExportParams(scale, torch.zeros((), dtype=torch.int8), tuple(amax.shape), int(low), int(max_bound), None,
                        int(tiny.sum()), format="int4", block_size=q.block_size, block_axis=along, values=values)


class QDQStandIn(nn.Module):
    """Stands in for a TensorQuantizer while a model is exported; see the module docstring.

    Carries ``is_enabled = True`` because quantized RNN modules look at their quantizers' flags.
    """

    is_enabled = True

    def __init__(self, name: str, quantizer: TensorQuantizer, params: ExportParams | None = None) -> None:
        super().__init__()
        if params is None:  # the exporter passes the parameters it checked the quantizer with
            params = export_params(quantizer)
        self.quantizer_name = name
        self.params = params
        self.register_buffer("scale", params.scale)
        self.register_buffer("zero_point", params.zero_point)
        if params.values is not None:  # int4/fp8/nvfp4: the quantized weight replaces the float one in the graph
            self.register_buffer("values", params.values)
        if params.block_scales is not None:
            self.register_buffer("block_scales", params.block_scales)
        pre = quantizer.pre_quant_scale
        if pre is not None:
            self.register_buffer("pre_quant_scale", pre.detach().clone())
        else:
            self.pre_quant_scale = None
        self.clip_range = params.clip

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.params.format == "int4":
            return torch.ops.workbench.dq_blocked(self.values, self.scale, self.params.block_axis,
                                                  self.params.block_size).to(inputs.dtype)
        if self.params.format == "nvfp4":
            if self.params.values is not None:
                return torch.ops.workbench.dq_nvfp4(self.values, self.block_scales, self.scale, self.params.block_axis,
                                                    self.params.block_size).to(inputs.dtype)
            if self.pre_quant_scale is not None:
                inputs = inputs * self.pre_quant_scale
            return torch.ops.workbench.qdq_nvfp4(inputs, self.scale, self.params.block_size)
        if self.params.format == "fp8" and self.params.values is not None:
            channels = self.scale.numel() if self.scale.dim() == 1 else 0
            return torch.ops.workbench.dq_fp8_weight(self.values, self.scale, self.params.axis_for(inputs.dim()),
                                                     channels).to(inputs.dtype)
        # a bf16/fp16 network: Cast -> Q/DQ with float32 scales -> Cast back, as TensorRT reads them (and as
        # Model Optimizer writes them); onnx's QuantizeLinear takes no bf16 input before opset 19 and wants the
        # scale in the input's type. The fake quant computes in float32 the same way (a smoothing's float32 Mul
        # included, after the Cast), so the bits agree.
        network_dtype = inputs.dtype
        if network_dtype in (torch.bfloat16, torch.float16):
            inputs = inputs.to(torch.float32)
        if self.pre_quant_scale is not None:
            inputs = inputs * self.pre_quant_scale
        if self.clip_range is not None:
            inputs = torch.clamp(inputs, self.clip_range[0], self.clip_range[1])
        axis = self.params.axis_for(inputs.dim())
        if self.params.format == "fp8":
            channels = self.scale.numel() if self.scale.dim() == 1 else 0
            out = torch.ops.workbench.qdq_fp8(inputs, self.scale, axis, channels)
        else:
            out = torch.ops.workbench.qdq(inputs, self.scale, self.zero_point, axis, self.params.qmin,
                                          self.params.qmax)
        # only where it changes the type: the TorchScript tracer records even a no-op .to() as a Cast node
        return out.to(network_dtype) if out.dtype != network_dtype else out

    def extra_repr(self) -> str:
        if self.params.format == "int4":
            return f"{self.quantizer_name}: int4 blocks of {self.params.block_size}, dequantize only"
        if self.params.format == "nvfp4":
            kind = "weight, dequantize only" if self.params.values is not None else "dynamic"
            return f"{self.quantizer_name}: nvfp4 blocks of {self.params.block_size}, {kind}"
        if self.params.format == "fp8":
            kind = "per-channel" if self.params.per_channel else "per-tensor"
            return f"{self.quantizer_name}: float8e4m3fn {kind}"
        kind = "per-channel" if self.params.per_channel else "per-tensor"
        dtype = "uint8" if self.params.qmin == 0 else "int8"
        narrow = " narrow" if self.params.qmin == -127 else ""
        return f"{self.quantizer_name}: {dtype}{narrow} {kind}"
