"""The fused fake-quantization formula as a hand-written Triton kernel: the CUDA fast path.

Why not only torch.compile (:mod:`workbench.quant.kernels.compiled`): on the H200 run a call through dynamo's guards
and Inductor's wrapper cost about 185 us of host time (more than the ~14 eager operations of the reference),
while the kernel itself reads and writes 16M float32 values in a few tens of microseconds. A Triton kernel
launched directly costs one launcher call. It computes :func:`workbench.quant.kernels.fake_quant.elementwise` with the
parameters of :func:`workbench.quant.kernels.fake_quant.quant_params` step by step, with correctly rounded division
(``div_rn``) and round-half-to-even (``rint``), and is used only after the same bit-for-bit check against the
CPU as the compiled kernels. Triton is optional: without it (or on any error) the callers go on with the
compiled kernel or the torch reference.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

_state: dict[str, Any] = {"kernel": None, "tried": False, "error": None}
tl: Any = None  # triton.language and its libdevice, bound by _build() (Triton is optional)
libdevice: Any = None
BLOCK = 1024


def _build() -> Any:
    global tl, libdevice  # triton.jit resolves the names a kernel uses in its module's globals, not closures
    import triton
    import triton.language as tl
    try:
        from triton.language.extra import libdevice
    except ImportError:  # older layouts
        from triton.language.extra.cuda import libdevice

    @triton.jit
    def fake_quant_kernel(x_ptr, amax_ptr, out_ptr, n, channels, inner, lo, hi, bound, tiny,
                          DIVIDE: tl.constexpr, DEQUANTIZE: tl.constexpr, PER_CHANNEL: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if PER_CHANNEL:
            amax = tl.load(amax_ptr + (offsets // inner) % channels, mask=mask, other=1.0)
        else:
            amax = tl.load(amax_ptr) + tl.zeros_like(x)
        # quant_params: a negative amax gives NaN, a tiny one sends every finite input to 0
        amax = tl.where(amax < 0.0, float("nan"), amax)
        is_tiny = amax <= tiny
        bounds = bound + tl.zeros_like(x)
        if DIVIDE:
            step = tl.div_rn(amax, bounds)
            a = tl.where(is_tiny, float("inf"), step)
            b = tl.where(is_tiny, 0.0, step)
            q = libdevice.rint(tl.div_rn(x, a))
        else:
            scale = tl.div_rn(bounds, amax)
            a = tl.where(is_tiny, 0.0, scale)
            b = tl.where(is_tiny, 1.0, scale)
            q = libdevice.rint(x * a)
        # torch.clamp keeps NaN: comparisons with NaN are false, so it passes through both selects
        q = tl.where(q < lo, lo, tl.where(q > hi, hi, q))
        if DEQUANTIZE:
            if DIVIDE:
                q = q * b
            else:
                q = tl.div_rn(q, b)
        tl.store(out_ptr + offsets, q.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def ste_kernel(x_ptr, g_ptr, t_ptr, out_ptr, n, channels, inner, PER_CHANNEL: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        g = tl.load(g_ptr + offsets, mask=mask, other=0.0)
        if PER_CHANNEL:
            t = tl.load(t_ptr + (offsets // inner) % channels, mask=mask, other=0.0)
        else:
            t = tl.load(t_ptr) + tl.zeros_like(x.to(tl.float32))
        # |x| in x's dtype widened to float32 exactly, as torch compares; NaN compares false: gradient 0
        keep = tl.abs(x).to(tl.float32) <= t
        tl.store(out_ptr + offsets, tl.where(keep, g, tl.zeros_like(g)), mask=mask)

    _state["ste"] = ste_kernel
    return fake_quant_kernel


def available() -> bool:
    """Whether the Triton fake-quant kernel can be used (Triton imports and the kernel has not failed before)."""
    _ensure_built()
    return _state["kernel"] is not None


def ste_available() -> bool:
    """Whether the Triton STE kernel can be used (independent of the fake-quant kernel's failures)."""
    _ensure_built()
    return _state.get("ste") is not None


def _ensure_built() -> None:
    if not _state["tried"]:
        _state["tried"] = True
        try:
            _state["kernel"] = _build()
        except Exception as error:  # noqa: BLE001 - no Triton, or one this code does not fit: fall back
            _state["error"] = f"{type(error).__name__}: {error}"[:300]
            logger.info("Triton fake-quant kernel unavailable (%s); using the compiled kernel", _state["error"])


def error() -> str | None:
    """Why the Triton kernel is not in use (None when it is, or has not been tried)."""
    return _state["error"]


def fake_quant(x: torch.Tensor, amax: torch.Tensor, channels: int, inner: int, min_bound: float, max_bound: float,
               tiny: float, divide: bool, dequantize: bool) -> torch.Tensor | None:
    """One pass over a contiguous ``x`` (float32/float16/bfloat16 on a GPU) with a float32 ``amax`` of
    ``channels`` values (1 per tensor); None when the kernel is unavailable or fails (then switched off,
    logged once)."""
    if not available():
        return None
    try:
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton_cdiv(n, BLOCK),)
        _state["kernel"][grid](x, amax, out, n, channels, inner, float(min_bound), float(max_bound),
                               float(max_bound), float(tiny), DIVIDE=divide, DEQUANTIZE=dequantize,
                               PER_CHANNEL=channels > 1, BLOCK_SIZE=BLOCK)
        return out
    except Exception as error:  # noqa: BLE001 - any launch or compile failure: the caller falls back
        _switch_off("kernel", "error", "fake-quant", error)
        return None


def ste_grad(x: torch.Tensor, grad: torch.Tensor, limits: torch.Tensor, channels: int,
             inner: int) -> torch.Tensor | None:
    """``where(|x| <= limits, grad, 0)`` over contiguous ``x`` and ``grad`` of one dtype, with float32 ``limits``
    (``channels`` values); None when the kernel is unavailable or fails (then switched off, logged once)."""
    if not ste_available():
        return None
    try:
        out = torch.empty_like(grad)
        n = x.numel()
        _state["ste"][(triton_cdiv(n, BLOCK),)](x, grad, limits, out, n, channels, inner,
                                                  PER_CHANNEL=channels > 1, BLOCK_SIZE=BLOCK)
        return out
    except Exception as error:  # noqa: BLE001 - any launch or compile failure: the caller falls back
        _switch_off("ste", "ste_error", "STE", error)
        return None


def _switch_off(kernel: str, error_key: str, what: str, error: Exception) -> None:
    """A kernel that failed to compile or launch is not tried again; why is kept and logged once."""
    _state[kernel] = None
    _state[error_key] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    logger.warning("Triton %s kernel failed (%s); using the compiled kernel from now on", what, _state[error_key])


def ste_error() -> str | None:
    """Why the Triton STE kernel is not in use (None when it is, or has not been tried)."""
    return _state.get("ste_error") or _state["error"]


def triton_cdiv(n: int, block: int) -> int:
    return (n + block - 1) // block
