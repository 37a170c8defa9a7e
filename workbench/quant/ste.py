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
import os
import threading
from typing import Any

import torch

from workbench.quant.kernels import ChannelLayout, channel_layout, cpu_extension

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

def _ste_elementwise(x, g, t):
    return torch.where(x.abs() <= t, g, torch.zeros((), dtype=g.dtype, device=g.device))


_compile_lock = threading.Lock()
_compiled: list[Any] = []
_compile_failed = False
_verified: dict[tuple, bool] = {}


def compiled_ste() -> Any:
    """The STE formula compiled into one fused kernel, or None (no compiler, or
    ``WORKBENCH_FUSED_CUDA=0``, the same switch as the forward)."""
    global _compile_failed
    if _compile_failed or os.environ.get("WORKBENCH_FUSED_CUDA", "1") == "0":
        return None
    with _compile_lock:
        if not _compiled:
            try:
                _compiled.append(torch.compile(_ste_elementwise, dynamic=True, fullgraph=True))
            except Exception as error:  # noqa: BLE001 - no compiler, old torch: use torch operations
                logger.info("torch.compile unavailable for the fused STE backward: %s", error)
                _compile_failed = True
                return None
    return _compiled[0]


def _run_compiled(fn, inputs: torch.Tensor, grad: torch.Tensor, limits: torch.Tensor,
                  layout: ChannelLayout) -> torch.Tensor:
    x3 = inputs.contiguous().view(layout.outer, layout.channels, layout.inner)
    g3 = grad.contiguous().view(layout.outer, layout.channels, layout.inner)
    t3 = limits.to(inputs.device).reshape(1, layout.channels, 1)
    return fn(x3, g3, t3).view(inputs.shape)


def fused_matches_reference(device: torch.device, dtype: torch.dtype) -> bool:
    """Run the compiled kernel on values at and around the threshold (in float16 rounding too), NaN,
    Inf and -0 gradients, per tensor and per channel, and compare its bits with the reference."""
    fn = compiled_ste()
    if fn is None:
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4099, generator=generator) * 2
    x[0, :5] = torch.tensor([1.0, -1.0, 1.0009766, float("nan"), float("inf")])
    g = torch.randn(3, 4099, generator=generator)
    g[1, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    x, g = x.to(device=device, dtype=dtype), g.to(device=device, dtype=dtype)
    try:
        for amax in (torch.tensor(1.0006), torch.tensor([[2.0], [1.0006], [0.0]])):
            amax = amax.to(device)
            limits = thresholds(x, amax)
            layout = channel_layout(x.shape, amax.shape)
            fused = _run_compiled(fn, x, g, limits, layout)
            reference = ste_grad_reference(x, amax, g)
            if not torch.equal(fused.view(torch.int16 if dtype != torch.float32 else torch.int32),
                               reference.view(torch.int16 if dtype != torch.float32 else torch.int32)):
                logger.warning("fused STE backward differs from the reference on %s (%s); using torch operations",
                               device, dtype)
                return False
    except Exception as error:  # noqa: BLE001 - e.g. no Triton for this GPU: fall back quietly
        logger.info("fused STE backward unavailable on %s: %s", device, error)
        return False
    return True


def _cuda_ready(inputs: torch.Tensor) -> bool:
    key = (str(inputs.device), inputs.dtype)
    if key not in _verified:
        _verified[key] = fused_matches_reference(inputs.device, inputs.dtype)
    return _verified[key]


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
    if inputs.is_cuda and _cuda_ready(inputs):
        return _run_compiled(compiled_ste(), inputs, grad_outputs, limits, layout)
    return ste_grad_reference(inputs, amax, grad_outputs)
