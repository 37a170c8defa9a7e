"""The straight-through estimator's backward, fused: ``grad_in = where(|x| <= amax, grad_out, 0)``.

Quantization-aware training runs this for every quantized tensor on every step. Written as torch
operations (:func:`ste_grad_reference`: ``abs``, ``<=``, ``where``) it makes about four passes over
memory and allocates a mask; here it is one pass: the C kernel ``csrc/ste_grad.c`` on CPU (GIL
released, AVX2 with a portable fallback), and on CUDA one elementwise kernel compiled by
``torch.compile``, checked bit for bit against the reference on its first use for each dtype.

Every path returns exactly the reference's bits. The subtle part is the comparison's dtype: torch
compares ``|x| <= amax`` in the promoted dtype of the two, so a 0-dim float32 amax against a float16
``x`` is compared *in float16* (amax rounded), while a per-channel float32 amax compares in float32.
:func:`thresholds` reproduces that rounding once per call on the (small) amax, so the kernels can
compare in float32 and still agree with torch on every element.
"""
from __future__ import annotations

import logging
import threading

import torch

import workbench.quant.kernels.triton_kernels as triton_kernels
from workbench.quant.kernels.compiled import ElementwiseKernel, device_key
from workbench.quant.kernels.fake_quant import (
    ChannelLayout,
    channel_layout,
    count_differences,
    cpu_extension,
    fused_enabled,
)

logger = logging.getLogger(__name__)

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def ste_grad_reference(inputs: torch.Tensor, amax: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
    """Straight-through estimator with clipping as torch operations: pass the gradient where
    ``|x| <= amax``, else 0 (NaN inputs get 0). The definition every fast path is checked against."""
    inside = inputs.abs() <= amax.to(inputs.device)
    return torch.where(inside, grad_outputs, torch.zeros((), dtype=grad_outputs.dtype, device=grad_outputs.device))


def thresholds(inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor | None:
    """amax as the float32 values that make a float32 comparison ``|x| <= t`` agree with torch's
    ``inputs.abs() <= amax`` on every element, or None where that needs float64 (float64 inputs).

    torch compares in ``result_type(inputs, amax)``: amax is rounded to that dtype first. Rounded to
    float16/bfloat16/float32 it widens to float32 exactly. If the comparison is in float64 (a float64
    amax with more than zero dimensions), a float32 ``|x|`` is below amax exactly when it is below the
    largest float32 not above amax, so that value is the threshold.
    """
    compare = torch.result_type(inputs, amax)
    if inputs.dtype not in _DTYPE_CODES:
        return None
    if compare in _DTYPE_CODES:
        return amax.detach().to(compare).float()
    if compare != torch.float64:
        return None
    wide = amax.detach().double()
    narrow = wide.float()
    above = narrow.double() > wide
    return torch.where(above, torch.nextafter(narrow, torch.full_like(narrow, -float("inf"))), narrow)


def _dense_pair(inputs: torch.Tensor, grad: torch.Tensor, layout: ChannelLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """inputs and grad in one shared dense layout the kernel can walk in storage order."""
    if layout.channels == 1:
        # per tensor: elementwise, so any layout works as long as both tensors share it
        for fmt in (torch.contiguous_format, torch.channels_last):
            if inputs.dim() != 4 and fmt is torch.channels_last:
                continue
            if inputs.is_contiguous(memory_format=fmt):
                return inputs, grad.contiguous(memory_format=fmt)
    return inputs.contiguous(), grad.contiguous()


def _ste_grad_cpu(inputs: torch.Tensor, grad: torch.Tensor, limits: torch.Tensor,
                  layout: ChannelLayout) -> torch.Tensor:
    x, g = _dense_pair(inputs, grad, layout)
    out = torch.empty_like(g)
    limits = limits.reshape(-1).contiguous()
    cpu_extension.ste_grad(x.data_ptr(), g.data_ptr(), out.data_ptr(), _DTYPE_CODES[x.dtype], layout.outer,
                           layout.channels, layout.inner, limits.data_ptr(), torch.get_num_threads())
    return out


# ----- CUDA: one kernel from torch.compile, verified against the reference before first use ----------
#
# One compiled function per dtype and layout (each with its own dynamo cache: see workbench.quant.kernels.compiled),
# fed 1-D tensors with a 1-element threshold per tensor, or [outer, channels, inner] with [1, channels, 1]
# thresholds per channel: a few shape variants each, never the recompile limit.

def _ste_elementwise(x, g, t):
    return torch.where(x.abs() <= t, g, torch.zeros((), dtype=g.dtype, device=g.device))


_kernels_lock = threading.Lock()
_kernels: dict[tuple, ElementwiseKernel] = {}
_verified: dict[tuple, bool] = {}
_why_not: dict[tuple, str] = {}
_engines: dict[tuple, str] = {}  # "triton" or "compiled", per verified (device, dtype)


def compiled_ste(dtype: torch.dtype = torch.float32, per_tensor: bool = True) -> ElementwiseKernel | None:
    """The STE formula compiled into one fused kernel for one dtype and layout, or None when
    ``WORKBENCH_FUSED_CUDA=0`` (the same switch as the forward)."""
    if not fused_enabled():
        return None
    key = (dtype, per_tensor)
    with _kernels_lock:
        if key not in _kernels:
            tag = f"{str(dtype).split('.')[-1]}_{'tensor' if per_tensor else 'channel'}"
            _kernels[key] = ElementwiseKernel(_ste_elementwise, tag)
    return _kernels[key]


def compiled_kernels() -> dict[tuple, ElementwiseKernel]:
    """Every compiled STE kernel made so far, by (dtype, per_tensor)."""
    with _kernels_lock:
        return dict(_kernels)


def _run_compiled(inputs: torch.Tensor, grad: torch.Tensor, limits: torch.Tensor,
                  layout: ChannelLayout, engine: str = "compiled") -> torch.Tensor | None:
    if engine == "triton":
        flat = limits.to(device=inputs.device, dtype=torch.float32).reshape(-1).contiguous()
        out = triton_kernels.ste_grad(inputs.contiguous(), grad.contiguous(), flat, layout.channels, layout.inner)
        return None if out is None else out.view(inputs.shape)
    kernel = compiled_ste(inputs.dtype, layout.channels == 1)
    if kernel is None:
        return None
    limits = limits.to(inputs.device)
    if layout.channels == 1:
        out = kernel(inputs.contiguous().view(-1), grad.contiguous().view(-1), limits.reshape(1))
    else:
        shape = (layout.outer, layout.channels, layout.inner)
        out = kernel(inputs.contiguous().view(shape), grad.contiguous().view(shape),
                     limits.reshape(1, layout.channels, 1))
    return None if out is None else out.view(inputs.shape)


def fused_matches_reference(device: torch.device, dtype: torch.dtype) -> bool:
    """Run the compiled kernels on values at and around the threshold (in float16 rounding too), NaN,
    Inf and -0 gradients, per tensor and per channel, and compare their bits with the CPU result."""
    key = (device_key(device), dtype)
    if not fused_enabled():
        _why_not[key] = "switched off (WORKBENCH_FUSED_CUDA=0)"
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 1031, generator=generator) * 2
    x[0, 0, :5] = torch.tensor([1.0, -1.0, 1.0009766, float("nan"), float("inf")])
    x[1, 1, :4] = torch.nextafter(torch.tensor([1.0006] * 4), torch.tensor([0.0, 9.0, -9.0, 0.0]))
    g = torch.randn(4, 3, 1031, generator=generator)
    g[1, :, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    x, g = x.to(dtype), g.to(dtype)
    engines = ["triton", "compiled"] if torch.device(device).type == "cuda" and triton_kernels.ste_available() \
        else ["compiled"]
    for engine in engines:
        problem = _probe_engine(engine, device, x, g, dtype)
        if problem is None:
            _engines[key] = engine
            _why_not.pop(key, None)
            return True
        _why_not[key] = problem
        if engine != engines[-1]:
            logger.info("%s STE kernel not used on %s (%s): %s", engine, device, dtype, problem)
    logger.warning("fused STE backward differs or fails on %s (%s): %s; using torch operations", device, dtype,
                   _why_not[key])
    return False


def _probe_engine(engine: str, device: torch.device, x: torch.Tensor, g: torch.Tensor,
                  dtype: torch.dtype) -> str | None:
    """Why ``engine``'s STE kernel must not be used (None: every bit matched the CPU result)."""
    for amax in (torch.tensor(1.0006), torch.tensor([2.0, 1.0006, 0.0]).reshape(1, 3, 1)):
        expected = ste_grad_reference(x, amax, g)
        limits = thresholds(x, amax)
        layout = channel_layout(x.shape, amax.shape)
        fused = _run_compiled(x.to(device), g.to(device), limits, layout, engine)
        if fused is None:
            if engine == "triton":
                return f"compile or run failed: {triton_kernels.ste_error()}"
            kernel = compiled_ste(dtype, layout.channels == 1)
            return f"compile or run failed: {kernel.error if kernel else 'no kernel'}"
        count, largest = count_differences(fused, expected)
        if count:
            return f"{engine} kernel: {count} of {fused.numel()} elements differ from the CPU result (max |diff| " \
                f"{largest:.3g})"
    return None


def fused_status(device: torch.device | str, dtype: torch.dtype) -> tuple[bool | None, str]:
    """Whether the fused CUDA STE kernel is in use for this dtype (None: not tried yet) and, if not, why."""
    key = (device_key(device), dtype)
    if key not in _verified:
        return None, "not tried yet"
    if _verified[key]:
        return True, f"{_engines.get(key, 'compiled')} kernel, verified bit for bit against the CPU result"
    return False, _why_not.get(key, "unavailable")


def _cuda_fused(inputs: torch.Tensor, grad: torch.Tensor, limits: torch.Tensor,
                layout: ChannelLayout) -> torch.Tensor | None:
    key = (device_key(inputs.device), inputs.dtype)
    if key not in _verified:
        _verified[key] = fused_matches_reference(inputs.device, inputs.dtype)
    if not _verified[key]:
        return None
    engine = _engines.get(key, "compiled")
    out = _run_compiled(inputs, grad, limits, layout, engine)
    if out is None:  # this layout failed to compile after all: the reference from now on (logged once)
        _verified[key] = False
        kernel = compiled_ste(inputs.dtype, layout.channels == 1)
        _why_not[key] = (f"compile or run failed: {triton_kernels.ste_error()}" if engine == "triton" else
                         f"compile or run failed: {kernel.error if kernel else 'switched off'}")
    return out


def ste_grad(inputs: torch.Tensor, amax: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
    """``where(|inputs| <= amax, grad_outputs, 0)`` in one pass, bit-identical to
    :func:`ste_grad_reference`.

    Fast paths: CPU float32/float16/bfloat16 with the C kernel, CUDA with the compiled kernel; amax
    per tensor or along one axis, ``grad_outputs`` of the same shape and dtype as ``inputs``.
    Anything else (float64, multi-axis amax, no extension) runs the reference.
    """
    amax = amax.to(inputs.device)
    if (grad_outputs.dtype != inputs.dtype or grad_outputs.shape != inputs.shape or inputs.numel() == 0
            or grad_outputs.device != inputs.device):
        return ste_grad_reference(inputs, amax, grad_outputs)
    layout = channel_layout(inputs.shape, amax.shape)
    if layout is None:
        return ste_grad_reference(inputs, amax, grad_outputs)
    limits = thresholds(inputs, amax)
    if limits is None:
        return ste_grad_reference(inputs, amax, grad_outputs)
    if inputs.device.type == "cpu" and cpu_extension is not None:
        return _ste_grad_cpu(inputs, grad_outputs, limits, layout)
    if inputs.is_cuda and layout.outer > 0:
        out = _cuda_fused(inputs, grad_outputs, limits, layout)
        if out is not None:
            return out
    return ste_grad_reference(inputs, amax, grad_outputs)
