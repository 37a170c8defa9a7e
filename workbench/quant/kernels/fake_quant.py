"""Fused symmetric (fake) quantization, dispatched to the fastest exact implementation at hand.

On CPU, float32/float16/bfloat16 tensors go through the C kernel in ``csrc/fake_quant.c`` (one pass
over memory, GIL released). On CUDA the same formula is compiled by ``torch.compile`` into one fused
kernel, checked bit for bit against the reference on its first use for each dtype and layout.
Everything else (float64, amax shapes that are not a single axis, a machine where the extension did
not build, a GPU where compiling fails) goes through :func:`quantize_reference`, a chain of torch
operations that computes bit-identical numbers: every path implements exactly the formulas below,
so which one ran never changes a result.

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

import array
import logging
import os
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

import workbench.quant.kernels.triton_kernels as triton_kernels
from workbench.quant.kernels.compiled import ElementwiseKernel, device_key

logger = logging.getLogger(__name__)

Rounding = Literal["pytorch_quantization", "onnx"]
ROUNDINGS: tuple[str, ...] = ("pytorch_quantization", "onnx")

# amax at or below this quantizes to zero (the smallest fp16 subnormal, as in pytorch-quantization)
TINY_AMAX = 1.0 / (1 << 24)

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_MODE_CODES = {"pytorch_quantization": 0, "onnx": 1}

# The compiled module (workbench.quant.kernels._cpu_kernels) or None: imported here once for every user
# (the histogram calibrator's collection and searches use it too).
try:  # the extension is optional: without a C compiler the package installs and runs on torch ops
    import workbench.quant.kernels._cpu_kernels as cpu_extension
except ImportError:  # pragma: no cover - exercised on machines without a compiler
    cpu_extension = None
    logger.debug("CPU fake-quant kernel not built; using torch operations")


def backend_name() -> str:
    """Which CPU implementation is active: ``'c-avx2'``, ``'c-portable'`` or ``'torch'``."""
    if cpu_extension is None:
        return "torch"
    return f"c-{cpu_extension.isa()}"


def kernel_available() -> bool:
    """True when the compiled CPU kernel is importable."""
    return cpu_extension is not None


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


def negative_amax_error(smallest: float) -> ValueError:
    """The error every path raises for an amax below zero (one message, wherever it is detected)."""
    return ValueError(f"Negative values in amax: the smallest is {smallest:.6g}. amax is the absolute range to "
                      "quantize to and must be >= 0.")


def refuse_negative_amax(amax: torch.Tensor) -> None:
    """Raise :func:`negative_amax_error` if ``amax`` holds a value below zero, on any device. It reads the
    values back, so it belongs where amax arrives (calibration, loading), not in the per-call path."""
    if amax.numel():
        smallest = amax.min()
        if smallest < 0:
            raise negative_amax_error(float(smallest))


def check_amax_on_host(amax: torch.Tensor) -> None:
    """Raise :func:`negative_amax_error` for a negative CPU ``amax``; a CUDA amax is not inspected.

    Reading a CUDA tensor's values would wait for the GPU on every call. A negative CUDA amax is not
    raised here; :func:`quant_params` turns it into NaN outputs instead (see there), and
    ``TensorQuantizer`` refuses negative values when amax is set or loaded.
    """
    if amax.device.type == "cpu":
        refuse_negative_amax(amax)


def quant_params(amax: torch.Tensor, max_bound: float | torch.Tensor,
                 rounding: Rounding) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element (a, b) so that ``q = round(x op1 a)`` and output ``q op2 b`` (see module doc).

    ``max_bound`` may be a 0-d tensor on amax's device (the compiled kernels pass one). The division
    ``amax / max_bound`` is always tensor by tensor: on CUDA both torch (a CPU-scalar divisor) and Inductor
    (a constant divisor) replace ``t / c`` with ``t * (1 / c)``, one ulp off the CPU's quotient for some
    amax; that shifted every element of those channels on the H200 (498905 of 16M in the diag).

    A tiny amax gets parameters that send every finite input to 0, as pytorch-quantization does.
    A negative amax (only reachable on CUDA, where it is not checked per call) gets NaN parameters,
    so its outputs are NaN: visible, rather than silently zero.
    """
    if amax.dtype != torch.float64:
        amax = amax.float()
    # one op: NaN compares false below and carries through the divisions
    amax = amax.masked_fill(amax < 0, float("nan"))
    tiny = amax <= TINY_AMAX
    bound = max_bound.to(amax.dtype) if isinstance(max_bound, torch.Tensor) else torch.full_like(amax, max_bound)
    if rounding == "pytorch_quantization":
        scale = bound / amax
        a = torch.where(tiny, torch.zeros_like(scale), scale)
        b = torch.where(tiny, torch.ones_like(scale), scale)
    else:
        step = amax / bound  # a tensor divisor: correctly rounded on every device (see above)
        # x / inf is 0 for finite x, so a tiny amax quantizes to 0 without a special case in the loop
        a = torch.where(tiny, torch.full_like(step, float("inf")), step)
        b = torch.where(tiny, torch.zeros_like(step), step)
    return a, b


def scalar_params(amax: float, max_bound: float, rounding: Rounding) -> array.array:
    """:func:`host_params` for one amax, in plain Python (the per-tensor case, where numpy's own call
    overhead would dominate). Operands are float32 values; a float64 division of two float32 values
    rounded to float32 is the correctly rounded float32 quotient, so the numbers are the same."""
    value = float(np.float32(amax))
    if value < 0:
        raise negative_amax_error(value)
    bound = float(np.float32(max_bound))
    if value <= TINY_AMAX:
        pair = (0.0, 1.0) if rounding == "pytorch_quantization" else (float("inf"), 0.0)
    elif rounding == "pytorch_quantization":
        pair = (bound / value,) * 2
    else:
        pair = (value / bound,) * 2
    return array.array("f", pair)


def host_params(amax: torch.Tensor, max_bound: float, rounding: Rounding) -> np.ndarray:
    """:func:`quant_params` for the C kernel: float32 ``[channels, 2]`` rows of (a, b), computed in C.

    amax goes to the host anyway for the C kernel, so this is also where a negative amax is caught. One
    C loop instead of several numpy or torch calls: on a small weight (64 channels of 3x3x3) their
    per-call overhead was most of the time. Every path divides in float32, so the numbers are the same.
    Only called where the extension is loaded.
    """
    values = amax.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
    params = np.empty((values.numel(), 2), dtype=np.float32)
    smallest = cpu_extension.quant_params(values.data_ptr(), values.numel(), float(np.float32(max_bound)),
                                          _MODE_CODES[rounding], params.__array_interface__["data"][0])
    if smallest < 0:
        raise negative_amax_error(smallest)
    return params


def elementwise(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, min_bound: float, max_bound: float,
                divide: bool, dequantize: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """The formula itself on broadcastable (a, b): what every implementation here computes."""
    xf = x.to(a.dtype)
    q = torch.round(xf / a) if divide else torch.round(xf * a)
    q = torch.clamp(q, min_bound, max_bound)  # clamp keeps NaN
    if dequantize:
        q = q * b if divide else q / b
    return q.to(out_dtype)


def _prepared(inputs: torch.Tensor, amax: torch.Tensor, max_bound: float, rounding: Rounding):
    compute_dtype = torch.float64 if inputs.dtype == torch.float64 else torch.float32
    a, b = quant_params(amax.to(inputs.device), max_bound, rounding)
    out_dtype = inputs.dtype if inputs.dtype.is_floating_point else compute_dtype
    return a.to(compute_dtype), b.to(compute_dtype), out_dtype


def quantize_reference(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    max_bound: float,
    min_bound: float,
    rounding: Rounding,
    dequantize: bool,
) -> torch.Tensor:
    """The same computation as the C kernel, with torch operations (several passes over memory).

    Used for float64, multi-axis amax, when the extension is missing, and on CUDA when the fused
    (compiled) version is unavailable.
    """
    a, b, out_dtype = _prepared(inputs, amax, max_bound, rounding)
    return elementwise(inputs, a, b, min_bound, max_bound, rounding == "onnx", dequantize, out_dtype)


# ----- CUDA: one fused kernel from torch.compile (Inductor/Triton), checked before first use -------------
#
# The four variants (divide or multiply, dequantize or not) are compiled separately per dtype, bounds and
# layout (workbench.quant.kernels.compiled gives each its own dynamo cache, exact division and a fallback on any
# error). Tensors reach them flattened to 1-D with one (a, b) per tensor, or as [outer, channels, inner]
# with parameters shaped [1, channels, 1], so each compiled function sees at most four shape variants.


def _fused_formula(x, amax, lo: float, hi: float, max_bound: torch.Tensor, divide: bool, dequantize: bool,
                   out_dtype: torch.dtype):
    # quant_params inside the kernel: Inductor folds the per-channel parameters into the one elementwise
    # loop, instead of ~8 tiny kernel launches per call before it. max_bound is a 0-d tensor input, not a
    # number: Inductor turns division by a constant into multiplication by its reciprocal (not exact)
    a, b = quant_params(amax, max_bound, "onnx" if divide else "pytorch_quantization")
    return elementwise(x, a.float(), b.float(), lo, hi, divide, dequantize, out_dtype)


_kernels_lock = threading.Lock()
_kernels: dict[tuple, ElementwiseKernel] = {}
_bounds: dict[tuple, torch.Tensor] = {}
_verified: dict[tuple, bool] = {}
_why_not: dict[tuple, str] = {}
# which verified kernel runs each case: "triton" (hand-written, one launcher call) or "compiled" (torch.compile)
_engines: dict[tuple, str] = {}


def fused_enabled() -> bool:
    """False when ``WORKBENCH_FUSED_CUDA=0`` switches the compiled CUDA kernels off (forward and STE)."""
    return os.environ.get("WORKBENCH_FUSED_CUDA", "1") != "0"


def compiled_variant(divide: bool, dequantize: bool, dtype: torch.dtype = torch.float32, min_bound: float = -127.0,
                     max_bound: float = 127.0, per_tensor: bool = True,
                     amax_dtype: torch.dtype = torch.float32) -> ElementwiseKernel | None:
    """The formula for one rounding convention, output kind, dtype, integer range, layout and amax dtype,
    compiled by torch.compile into one fused kernel (None when ``WORKBENCH_FUSED_CUDA=0``)."""
    if not fused_enabled():
        return None
    key = (divide, dequantize, dtype, float(min_bound), float(max_bound), per_tensor, amax_dtype)
    with _kernels_lock:
        if key not in _kernels:
            tag = "_".join(["div" if divide else "mul", "fq" if dequantize else "q", str(dtype).split(".")[-1],
                            "tensor" if per_tensor else "channel", str(len(_kernels))])
            _kernels[key] = ElementwiseKernel(_fused_formula, tag)
    return _kernels[key]


def compiled_kernels() -> dict[tuple, ElementwiseKernel]:
    """Every compiled forward kernel made so far, by (divide, dequantize, dtype, lo, hi, per_tensor, amax dtype)."""
    with _kernels_lock:
        return dict(_kernels)


def _as_rows(inputs: torch.Tensor, amax: torch.Tensor, layout: ChannelLayout) -> tuple[torch.Tensor, torch.Tensor]:
    x = inputs.contiguous()
    if layout.channels == 1:
        return x.view(-1), amax.reshape(1)
    return x.view(layout.outer, layout.channels, layout.inner), amax.reshape(1, layout.channels, 1)


def _run_fused(inputs: torch.Tensor, amax: torch.Tensor, layout: ChannelLayout, max_bound: float, min_bound: float,
               rounding: Rounding, dequantize: bool, engine: str = "compiled") -> torch.Tensor | None:
    if engine == "triton" and amax.dtype != torch.float64:  # a float64 amax: the compiled variant made for it
        flat_amax = amax.to(device=inputs.device, dtype=torch.float32).reshape(-1)
        out = triton_kernels.fake_quant(inputs.contiguous(), flat_amax.contiguous(), layout.channels, layout.inner,
                                        min_bound, max_bound, TINY_AMAX, rounding == "onnx", dequantize)
        return None if out is None else out.view(inputs.shape)
    kernel = _kernel_for(inputs, amax, layout, max_bound, min_bound, rounding, dequantize)
    if kernel is None:
        return None
    x, amax = _as_rows(inputs, amax.to(inputs.device), layout)
    bound = bound_tensor(max_bound, x.device, torch.float64 if amax.dtype == torch.float64 else torch.float32)
    out = kernel(x, amax, float(min_bound), float(max_bound), bound, rounding == "onnx", dequantize, inputs.dtype)
    return None if out is None else out.view(inputs.shape)


def bound_tensor(value: float, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``value`` as a 0-d tensor on ``device``, made once per (value, device, dtype): the compiled kernels'
    divisor, so that it stays a runtime operand (exact division) without a host-to-device copy per call."""
    key = (float(value), device_key(device), dtype)
    tensor = _bounds.get(key)
    if tensor is None:
        tensor = _bounds[key] = torch.tensor(float(value), dtype=dtype, device=device)
    return tensor


def _kernel_for(inputs: torch.Tensor, amax: torch.Tensor, layout: ChannelLayout, max_bound: float, min_bound: float,
                rounding: Rounding, dequantize: bool) -> ElementwiseKernel | None:
    amax_dtype = torch.float64 if amax.dtype == torch.float64 else torch.float32
    return compiled_variant(rounding == "onnx", dequantize, inputs.dtype, min_bound, max_bound, layout.channels == 1,
                            amax_dtype)


def probe_tensors(channels: int = 37, per_channel: int = 2052) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (``[4, channels, per_channel // 4]``) and per-channel amax (``[1, channels, 1]``) that find an
    inexact kernel: for every channel, values at and 1-2 float32 steps either side of each rounding boundary
    ``(k + 1/2) * amax / 127`` (where an approximate division or reciprocal flips the integer), plus random
    values, clipping, NaN, +-Inf, -0, subnormals; amax ranges over decades and includes 0 and a tiny value."""
    generator = torch.Generator().manual_seed(0)
    amax = torch.exp(torch.empty(channels).uniform_(-4.0, 3.0, generator=generator))
    amax[-2:] = torch.tensor([0.0, TINY_AMAX / 2])
    rows = torch.randn(channels, per_channel, generator=generator) * amax[:, None] * 0.7
    k = torch.arange(-130, 130, dtype=torch.float32) + 0.5
    for c in range(channels - 2):
        ties = k * (amax[c] / 127.0)
        near = [ties]
        for direction in (float("inf"), -float("inf")):
            step = ties
            for _ in range(2):
                step = torch.nextafter(step, torch.full_like(step, direction))
                near.append(step)
        values = torch.cat(near)[: per_channel - 8]
        rows[c, : values.numel()] = values
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, -1e-40, 3.0e38, -3.0e38])
    rows[:, -8:] = specials
    inner = per_channel // 4
    inputs = rows[:, : 4 * inner].reshape(channels, 4, inner).permute(1, 0, 2).contiguous()
    return inputs, amax.reshape(1, channels, 1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns (NaNs all alike: their payloads are not part of the promise)."""
    t = t.masked_fill(t.isnan(), float("nan"))
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def count_differences(result: torch.Tensor, expected: torch.Tensor) -> tuple[int, float]:
    """(elements whose bits differ, largest |difference| among finite values) of two same-shaped tensors."""
    result, expected = result.cpu(), expected.cpu()
    differ = _bits(result) != _bits(expected)
    count = int(differ.sum())
    if not count:
        return 0, 0.0
    delta = (result.double() - expected.double()).abs()
    delta = delta[differ & delta.isfinite()]
    return count, float(delta.max()) if delta.numel() else float("inf")


def fused_matches_reference(device: torch.device, dtype: torch.dtype, rounding: Rounding, dequantize: bool,
                            min_bound: float = -127.0, max_bound: float = 127.0) -> bool:
    """Run the compiled kernels (per tensor and per channel) on :func:`probe_tensors` and compare every bit
    with the CPU path (the C kernel or the reference, which agree); they are used only if they agree.
    The reason for a refusal is kept for :func:`fused_status`."""
    key = (device_key(device), dtype, rounding, dequantize, float(min_bound), float(max_bound))
    if not fused_enabled():
        _why_not[key] = "switched off (WORKBENCH_FUSED_CUDA=0)"
        return False
    engines = ["triton", "compiled"] if torch.device(device).type == "cuda" and triton_kernels.available() \
        else ["compiled"]
    for engine in engines:
        problem = _probe_engine(engine, device, dtype, rounding, dequantize, min_bound, max_bound)
        if problem is None:
            _engines[key] = engine
            _why_not.pop(key, None)
            return True
        _why_not[key] = problem
        if engine != engines[-1]:  # one line, then the next kernel gets its own check
            logger.info("%s fake-quant kernel not used on %s (%s, %s): %s", engine, device, dtype, rounding, problem)
    logger.warning("fused fake quantization differs or fails on %s (%s, %s): %s; using torch operations instead",
                   device, dtype, rounding, _why_not[key])
    return False


def _probe_engine(engine: str, device: torch.device, dtype: torch.dtype, rounding: Rounding, dequantize: bool,
                  min_bound: float, max_bound: float) -> str | None:
    """Why ``engine``'s kernel must not be used for this case (None: it matched every bit of the CPU path)."""
    inputs, channel_amax = probe_tensors()
    for amax in (channel_amax[0, 0, 0].clone(), channel_amax, channel_amax[0, 1, 0].clone()):
        probe = inputs.to(dtype)
        expected, _ = quantize(probe, amax, max_bound, min_bound, rounding, dequantize)
        layout = channel_layout(probe.shape, amax.shape)
        fused = _run_fused(probe.to(device), amax.to(device), layout, max_bound, min_bound, rounding, dequantize,
                           engine)
        if fused is None:
            if engine == "triton":
                return f"compile or run failed: {triton_kernels.error()}"
            kernel = _kernel_for(probe, amax, layout, max_bound, min_bound, rounding, dequantize)
            return f"compile or run failed: {kernel.error if kernel else 'no kernel'}"
        count, largest = count_differences(fused, expected)
        if count:
            return (f"{engine} kernel: {count} of {fused.numel()} elements differ from the CPU formula (max |diff| "
                    f"{largest:.3g}, {'per tensor' if layout.channels == 1 else 'per channel'})")
    return None


def fused_status(device: torch.device | str, dtype: torch.dtype, rounding: Rounding, dequantize: bool,
                 min_bound: float = -127.0, max_bound: float = 127.0) -> tuple[bool | None, str]:
    """Whether the fused CUDA kernel is in use for this case (None: not tried yet) and, if not, why."""
    key = (device_key(device), dtype, rounding, dequantize, float(min_bound), float(max_bound))
    if key not in _verified:
        return None, "not tried yet"
    if _verified[key]:
        return True, f"{_engines.get(key, 'compiled')} kernel, verified bit for bit against the CPU formula"
    return False, _why_not.get(key, "unavailable")


def _quantize_fused(inputs: torch.Tensor, amax: torch.Tensor, layout: ChannelLayout | None, max_bound: float,
                    min_bound: float, rounding: Rounding, dequantize: bool) -> torch.Tensor | None:
    """The compiled single-kernel path for CUDA tensors, or None when it is unavailable, unverified or failed."""
    if layout is None or layout.outer == 0:
        return None
    key = (device_key(inputs.device), inputs.dtype, rounding, dequantize, float(min_bound), float(max_bound))
    if key not in _verified:
        _verified[key] = fused_matches_reference(inputs.device, inputs.dtype, rounding, dequantize, min_bound,
                                                 max_bound)
    if not _verified[key]:
        return None
    engine = _engines.get(key, "compiled")
    out = _run_fused(inputs, amax, layout, max_bound, min_bound, rounding, dequantize, engine)
    if out is None:  # compiling this layout failed after all: the reference from now on (logged once)
        _verified[key] = False
        kernel = _kernel_for(inputs, amax, layout, max_bound, min_bound, rounding, dequantize)
        _why_not[key] = (f"compile or run failed: {triton_kernels.error()}" if engine == "triton" and
                         amax.dtype != torch.float64 else
                         f"compile or run failed: {kernel.error if kernel else 'switched off'}")
    return out


def _kernel_supports(inputs: torch.Tensor, layout: ChannelLayout | None) -> bool:
    return (
        cpu_extension is not None
        and layout is not None
        and inputs.device.type == "cpu"
        and inputs.dtype in _DTYPE_CODES
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
        amax: non-negative tensor broadcastable to ``inputs`` (per tensor or along one axis). A negative
            amax on the CPU raises ValueError; on CUDA it is not read back (that would stall the
            stream every call) and quantizes to NaN.
        max_bound, min_bound: the integer range, e.g. 127 and -127.
        rounding: ``"pytorch_quantization"`` or ``"onnx"`` (see the module docstring).
        dequantize: return ``q`` mapped back to real values (fake quantization) instead of ``q``.
        check_negative: also report whether any input is negative (one extra comparison per element
            inside the fused loop, instead of a separate pass).

    Raises:
        ValueError: unknown rounding, or a negative amax held on the CPU.

    Returns:
        The result in the dtype of ``inputs`` and whether a negative input was seen (False when not
        checked). Computation is in float32 for float16/bfloat16 inputs.
    """
    if rounding not in _MODE_CODES:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}.")
    if inputs.numel() == 0:
        check_amax_on_host(amax)
        return torch.empty_like(inputs), False
    layout = channel_layout(inputs.shape, amax.shape)
    if not _kernel_supports(inputs, layout):
        check_amax_on_host(amax)
        out = None
        if inputs.is_cuda and inputs.dtype in _DTYPE_CODES:
            out = _quantize_fused(inputs, amax, layout, max_bound, min_bound, rounding, dequantize)
        if out is None:
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
    if amax.numel() == 1:
        params = scalar_params(amax.item(), max_bound, rounding)
        params_ptr = params.buffer_info()[0]
    else:
        params = host_params(amax, max_bound, rounding)
        params_ptr = params.__array_interface__["data"][0]
    negative = cpu_extension.quantize(
        x.data_ptr(),
        out.data_ptr(),
        _DTYPE_CODES[x.dtype],
        layout.outer,
        layout.channels,
        layout.inner,
        params_ptr,  # params stays referenced until the call returns
        float(min_bound),
        float(max_bound),
        _MODE_CODES[rounding],
        int(dequantize),
        torch.get_num_threads(),
    )
    return out, bool(negative) if check_negative else False
