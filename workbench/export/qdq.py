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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workbench.quant.kernels import TINY_AMAX
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["QDQStandIn", "qdq_reference", "onnx_translation", "register_torchscript_symbolic", "ExportParams",
           "export_params"]

OP_NAME = "workbench::qdq"


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
    q = torch.clamp(torch.round(x.to(torch.float32) / s) + zp, qmin, qmax)
    return ((q - zp) * s).to(x.dtype)


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

    register_custom_op_symbolic(OP_NAME, symbolic, 13)
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

    @property
    def per_channel(self) -> bool:
        return self.scale.dim() == 1

    def axis_for(self, rank: int) -> int:
        """The ONNX ``axis`` for an input of ``rank`` dimensions (0 for per-tensor)."""
        if not self.per_channel:
            return 0
        padded = (1,) * (rank - len(self.amax_shape)) + tuple(self.amax_shape)
        return next(i for i, size in enumerate(padded) if size != 1)


def export_params(q: TensorQuantizer) -> ExportParams:
    """Scale and zero point exactly as the fake-quant ``"onnx"`` rounding computes them.

    ``step = amax / max_bound`` in float32 is bit-for-bit the step the fake-quant kernel uses, so
    ONNX's ``round(x / scale)`` equals the PyTorch result. A (channel) amax at or below 2**-24, which
    fake quantization maps to 0 whatever the input, gets :data:`ZERO_AMAX_SCALE`, so that ONNX maps
    every input below 2**99 to 0 as well (scale 1 would pass inputs above 0.5 through).
    Raises ValueError for what ONNX Q/DQ cannot express (the caller names the quantizer).
    """
    if isinstance(q._num_bits, tuple) or q._num_bits != 8:
        raise ValueError(f"num_bits={q._num_bits!r}: INT8 QDQ export supports 8-bit quantizers only")
    if not q._fake_quant:
        raise ValueError("fake_quant=False (returns integers): only fake quantizers export to Q/DQ")
    if q._learn_amax:
        low, high = float(q.clip.clip_value_min), float(q.clip.clip_value_max)
        amax = torch.tensor(max(-low, high), dtype=torch.float32)
        clip = (low, high)
    else:
        if "_amax" not in q._buffers:
            raise LookupError("not calibrated (no amax)")
        amax = q._buffers["_amax"].detach().to(torch.float32)
        clip = None
    if q._scale_amax is not None:
        amax = amax * q._scale_amax
    if torch.isnan(amax).any() or torch.isinf(amax).any():
        raise LookupError("amax is NaN or infinite (calibration saw no data?)")
    amax_shape = tuple(amax.shape)
    if amax.numel() > 1 and sum(1 for s in amax_shape if s != 1) != 1:
        raise ValueError(f"amax of shape {amax_shape} varies along several axes; ONNX Q/DQ takes one axis")
    max_bound = float(2 ** (8 - 1 + int(q._unsigned)) - 1)
    step = amax / max_bound  # the same float32 division as the fake-quant kernel
    tiny = amax <= TINY_AMAX
    # fake quant sends every finite input of a tiny amax to 0; a scale this large does the same in ONNX
    scale = torch.where(tiny, torch.full_like(step, ZERO_AMAX_SCALE), step)
    scale = scale.reshape(-1) if amax.numel() > 1 else scale.reshape(())
    dtype = torch.uint8 if q._unsigned else torch.int8
    zero_point = torch.zeros(scale.shape, dtype=dtype, device=scale.device)
    if q._unsigned:
        qmin, qmax = 0, 255
    else:
        qmin, qmax = (-127 if q._narrow_range else -128), 127
    return ExportParams(scale, zero_point, amax_shape, qmin, qmax, clip, int(tiny.sum()))


class QDQStandIn(nn.Module):
    """Stands in for a TensorQuantizer while a model is exported; see the module docstring.

    Carries ``_disabled = False`` because quantized RNN modules look at their quantizers' flags.
    """

    _disabled = False

    def __init__(self, name: str, quantizer: TensorQuantizer, params: ExportParams | None = None) -> None:
        super().__init__()
        if params is None:  # the exporter passes the parameters it checked the quantizer with
            params = export_params(quantizer)
        self.quantizer_name = name
        self.params = params
        self.register_buffer("scale", params.scale)
        self.register_buffer("zero_point", params.zero_point)
        pre = quantizer.pre_quant_scale
        if pre is not None:
            self.register_buffer("pre_quant_scale", pre.detach().clone())
        else:
            self.pre_quant_scale = None
        self.clip_range = params.clip

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.pre_quant_scale is not None:
            inputs = inputs * self.pre_quant_scale
        if self.clip_range is not None:
            inputs = torch.clamp(inputs, self.clip_range[0], self.clip_range[1])
        axis = self.params.axis_for(inputs.dim())
        return torch.ops.workbench.qdq(inputs, self.scale, self.zero_point, axis, self.params.qmin,
                                       self.params.qmax)

    def extra_repr(self) -> str:
        kind = "per-channel" if self.params.per_channel else "per-tensor"
        dtype = "uint8" if self.params.qmin == 0 else "int8"
        narrow = " narrow" if self.params.qmin == -127 else ""
        return f"{self.quantizer_name}: {dtype}{narrow} {kind}"
