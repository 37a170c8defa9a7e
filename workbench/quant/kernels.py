"""Fused symmetric (fake) quantization, dispatched to the fastest exact implementation at hand.

On CPU, float32/float16/bfloat16 tensors go through the C kernel in ``csrc/fake_quant.c`` (one pass
over memory, GIL released). Everything else (CUDA tensors, float64, amax shapes that are not a single
axis, or a machine where the extension did not build) goes through :func:`quantize_reference`, a
chain of torch operations that computes bit-identical numbers: both implement exactly the formulas
below, so which one ran never changes a result.

Two rounding conventions exist in the field and both are kept:

``"pytorch_quantization"``
    ``scale = max_bound / amax``; ``q = clamp(round(x * scale))``; fake-quant output ``q / scale``.
    This is pytorch-quantization's formula, so scripts written for it get the same numbers.
``"onnx"``
    ``step = amax / max_bound``; ``q = clamp(round(x / step))``; fake-quant output ``q * step``.
    This is what ONNX QuantizeLinear/DequantizeLinear (and onnxruntime) compute, so a fake-quantized
    PyTorch model matches its exported QDQ graph to float rounding.

They differ only where ``x * scale`` lands within one float rounding of a .5 boundary (a one-step
flip on a few elements in a million) and in the last bit of the dequantized value.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch

logger = logging.getLogger(__name__)

Rounding = Literal["pytorch_quantization", "onnx"]
ROUNDINGS: tuple[str, ...] = ("pytorch_quantization", "onnx")

# amax at or below this quantizes to zero (the smallest fp16 subnormal, as in pytorch-quantization)
TINY_AMAX = 1.0 / (1 << 24)

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_MODE_CODES = {"pytorch_quantization": 0, "onnx": 1}

try:  # the extension is optional: without a C compiler the package installs and runs on torch ops
    from workbench.quant import _cpu_kernels as _cpu_ext
except ImportError:  # pragma: no cover - exercised on machines without a compiler
    _cpu_ext = None
    logger.debug("CPU fake-quant kernel not built; using torch operations")


def backend_name() -> str:
    """Which CPU implementation is active: ``'c-avx2'``, ``'c-portable'`` or ``'torch'``."""
    if _cpu_ext is None:
        return "torch"
    return f"c-{_cpu_ext.isa()}"


def kernel_available() -> bool:
    """True when the compiled CPU kernel is importable."""
    return _cpu_ext is not None


@dataclass(frozen=True)
class ChannelLayout:
    """A contiguous tensor seen as ``[outer, channels, inner]`` with one amax per channel."""

    outer: int
    channels: int
    inner: int


def channel_layout(shape: torch.Size, amax_shape: torch.Size) -> ChannelLayout | None:
    """How an amax of ``amax_shape`` broadcasts over ``shape``, or None if not per-tensor/single-axis."""
    numel = 1
    for size in shape:
        numel *= size
    amax_numel = 1
    for size in amax_shape:
        amax_numel *= size
    if amax_numel == 1:
        if len(amax_shape) > len(shape):
            return None  # broadcasting would add dimensions to the output
        return ChannelLayout(1, 1, numel)
    if len(amax_shape) > len(shape):
        return None
    padded = (1,) * (len(shape) - len(amax_shape)) + tuple(amax_shape)
    axes = [i for i, size in enumerate(padded) if size != 1]
    if len(axes) != 1 or padded[axes[0]] != shape[axes[0]]:
        return None
    axis = axes[0]
    outer = 1
    for size in shape[:axis]:
        outer *= size
    inner = 1
    for size in shape[axis + 1:]:
        inner *= size
    if inner == 0 or outer == 0:
        return ChannelLayout(0, shape[axis], max(inner, 1))
    return ChannelLayout(outer, shape[axis], inner)


def quant_params(amax: torch.Tensor, max_bound: float, rounding: Rounding) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element (a, b) so that ``q = round(x op1 a)`` and output ``q op2 b`` (see module doc).

    A tiny amax gets parameters that send every finite input to 0, as pytorch-quantization does.
    """
    if amax.dtype != torch.float64:
        amax = amax.float()
    tiny = amax <= TINY_AMAX
    if rounding == "pytorch_quantization":
        scale = torch.full_like(amax, max_bound) / amax
        a = torch.where(tiny, torch.zeros_like(scale), scale)
        b = torch.where(tiny, torch.ones_like(scale), scale)
    else:
        step = amax / max_bound
        # x / inf is 0 for finite x, so a tiny amax quantizes to 0 without a special case in the loop
        a = torch.where(tiny, torch.full_like(step, float("inf")), step)
        b = torch.where(tiny, torch.zeros_like(step), step)
    return a, b


def quantize_reference(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    max_bound: float,
    min_bound: float,
    rounding: Rounding,
    dequantize: bool,
) -> torch.Tensor:
    """The same computation as the C kernel, with torch operations (several passes over memory).

    Used for CUDA tensors, float64, multi-axis amax, and when the extension is missing.
    """
    compute_dtype = torch.float64 if inputs.dtype == torch.float64 else torch.float32
    x = inputs.to(compute_dtype)
    a, b = quant_params(amax.to(x.device), max_bound, rounding)
    a, b = a.to(compute_dtype), b.to(compute_dtype)
    q = torch.round(x * a) if rounding == "pytorch_quantization" else torch.round(x / a)
    q = torch.clamp(q, min_bound, max_bound)  # clamp keeps NaN
    if dequantize:
        q = q / b if rounding == "pytorch_quantization" else q * b
    out_dtype = inputs.dtype if inputs.dtype.is_floating_point else compute_dtype
    return q.to(out_dtype)


def _kernel_supports(inputs: torch.Tensor, layout: ChannelLayout | None) -> bool:
    return (
        _cpu_ext is not None
        and layout is not None
        and inputs.device.type == "cpu"
        and inputs.dtype in _DTYPE_CODES
        and not inputs.is_complex()
    )


def quantize(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    max_bound: float,
    min_bound: float,
    rounding: Rounding = "pytorch_quantization",
    dequantize: bool = True,
    check_negative: bool = False,
) -> tuple[torch.Tensor, bool]:
    """Quantize ``inputs`` to the integer grid ``[min_bound, max_bound]`` given ``amax``.

    Args:
        inputs: float tensor on any device.
        amax: non-negative tensor broadcastable to ``inputs`` (per tensor or along one axis).
        max_bound, min_bound: the integer range, e.g. 127 and -127.
        rounding: ``"pytorch_quantization"`` or ``"onnx"`` (see the module docstring).
        dequantize: return ``q`` mapped back to real values (fake quantization) instead of ``q``.
        check_negative: also report whether any input is negative (one extra comparison per element
            inside the fused loop, instead of a separate pass).

    Returns:
        The result in the dtype of ``inputs`` and whether a negative input was seen (False when not
        checked). Computation is in float32 for float16/bfloat16 inputs.
    """
    if rounding not in _MODE_CODES:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if inputs.numel() == 0:
        return torch.empty_like(inputs), False
    layout = channel_layout(inputs.shape, amax.shape)
    if not _kernel_supports(inputs, layout):
        out = quantize_reference(inputs, amax, max_bound, min_bound, rounding, dequantize)
        negative = bool((inputs < 0).any()) if check_negative else False
        return out, negative

    assert layout is not None
    # Per-tensor quantization is elementwise, so any dense layout (channels_last included) can be
    # processed in storage order and keep its memory format; per-channel needs row-major order.
    if layout.channels == 1 and (inputs.is_contiguous() or inputs.is_contiguous(memory_format=torch.channels_last)):
        x = inputs
    else:
        x = inputs.contiguous()
    out = torch.empty_like(x)
    a, b = quant_params(amax.detach().reshape(-1).cpu().float(), max_bound, rounding)
    params = torch.stack([a, b], dim=1).contiguous()
    negative = _cpu_ext.quantize(
        x.data_ptr(),
        out.data_ptr(),
        _DTYPE_CODES[x.dtype],
        layout.outer,
        layout.channels,
        layout.inner,
        params.data_ptr(),
        float(min_bound),
        float(max_bound),
        _MODE_CODES[rounding],
        int(dequantize),
        torch.get_num_threads(),
    )
    return out, bool(negative) if check_negative else False
