"""Basic tensor quantization: the descriptor and the (fake) quantization functions.

Same vocabulary, signatures and defaults as pytorch-quantization's ``tensor_quant`` module:
``max_bound = 2**(num_bits - 1 + unsigned) - 1``, ``scale = max_bound / amax``,
``q = clamp(round(x * scale), min_bound, max_bound)`` with ``min_bound`` 0 (unsigned), ``-max_bound``
(narrow range) or ``-max_bound - 1``; fake quantization returns ``q / scale``. An amax at or below
2**-24 quantizes to 0. float16/bfloat16 inputs are computed in float32 and returned in their dtype.
The backward pass is the straight-through estimator with clipping (zero gradient where |x| > amax).

Unlike the original, every call is one fused pass over memory on CPU (see :mod:`workbench.quant.kernels.fake_quant`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch.autograd import Function

import workbench.quant.kernels.fake_quant as kernels
import workbench.quant.kernels.ste as ste
from workbench.quant.descriptor import (  # noqa: F401 - pytorch-quantization's tensor_quant offers them
    CALIB_METHODS,
    E2M1,
    E4M3,
    E4M3_MAX,
    MAX_NUM_BITS,
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
    ScaledQuantDescriptor,
    is_int,
)
from workbench.quant.kernels.fake_quant import ROUNDINGS, Rounding  # noqa: F401 - offered here too

logger = logging.getLogger(__name__)

__all__ = [
    "ScaledQuantDescriptor", "QuantDescriptor",
    "QUANT_DESC_8BIT_PER_TENSOR", "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "TensorQuantFunction", "FakeTensorQuantFunction", "LegacyFakeTensorQuantFunction",
    "FakeAffineTensorQuantFunction", "ScaledE4M3Function",
    "tensor_quant", "fake_tensor_quant", "legacy_fake_tensor_quant", "fake_affine_tensor_quant", "scaled_e4m3",
    "max_bound_of", "min_bound_of",
]

def max_bound_of(num_bits: int, unsigned: bool) -> float:
    """Largest integer of the grid: ``2**(num_bits - 1 + unsigned) - 1``. The one place this is written.

    Raises:
        ValueError: ``num_bits`` is not an integer, e.g. ``(4, 3)`` for FP8 E4M3, whose grid is not
            uniform, so it has no integer bound, step size or integer-grid calibration.
    """
    if not is_int(num_bits):
        raise ValueError(f"num_bits={num_bits!r} has no integer grid (FP8 E4M3 is not uniform): integer bounds, "
                         "step size and entropy/mse calibration need an integer num_bits.")
    return float(2 ** (num_bits - 1 + int(unsigned)) - 1)


def min_bound_of(num_bits: int, unsigned: bool, narrow_range: bool) -> float:
    """Smallest integer of the grid: 0 (unsigned), ``-max_bound`` (narrow) or ``-max_bound - 1``."""
    if unsigned:
        return 0.0
    max_bound = max_bound_of(num_bits, unsigned)
    return -max_bound if narrow_range else -max_bound - 1.0


def _as_amax_tensor(amax: Any, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(amax, torch.Tensor):
        amax = torch.tensor(amax, dtype=torch.float32, device=like.device)
    if amax.dtype not in (torch.float32, torch.float64):
        amax = amax.float()
    return amax


def _symmetric_amax(amax: Any, like: torch.Tensor) -> torch.Tensor:
    """amax of the symmetric functions as a float tensor on ``like``'s device.

    A Python number or list is checked for negative values while it is still on the host: once on a
    GPU it is no longer read back per call (the CPU path checks it in the kernel dispatcher).
    """
    if not isinstance(amax, torch.Tensor) and like.device.type != "cpu":
        host = torch.tensor(amax, dtype=torch.float32)
        kernels.check_amax_on_host(host)
        return host.to(like.device)
    return _as_amax_tensor(amax, like)


def _broadcasts(amax_shape: torch.Size, shape: torch.Size) -> bool:
    """torch's broadcasting rule on the shapes alone (plain Python: no tensor work per call)."""
    return all(a == b or a == 1 or b == 1 for a, b in zip(reversed(amax_shape), reversed(shape)))


def _check_args(inputs: torch.Tensor, amax: torch.Tensor, num_bits: Any) -> None:
    """Per-call checks that read no tensor values (so no device synchronisation on CUDA).

    A negative amax is caught where its values are read anyway: :mod:`workbench.quant.kernels.fake_quant`
    (see :func:`kernels.check_amax_on_host`).
    """
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__name__}.")
    if not inputs.dtype.is_floating_point:
        raise TypeError(f"inputs must be a floating point tensor, got {inputs.dtype}.")
    if not is_int(num_bits) or not 0 <= num_bits <= MAX_NUM_BITS:
        raise ValueError(f"num_bits must be an integer between 1 and {MAX_NUM_BITS}, got {num_bits!r}.")
    if amax.numel() == 0:
        raise ValueError("amax is empty.")
    if (amax.dim() > inputs.dim() and amax.numel() != 1) or not _broadcasts(amax.shape, inputs.shape):
        raise ValueError(f"amax of shape {tuple(amax.shape)} does not broadcast to inputs of shape "
                         f"{tuple(inputs.shape)}.")


def _quantize(inputs: torch.Tensor, amax: torch.Tensor, num_bits: int, unsigned: bool, narrow_range: bool,
              dequantize: bool, rounding: Rounding) -> torch.Tensor:
    """Shared body of the quantization functions; returns outputs in the dtype of ``inputs``.

    Raises ValueError for an unknown rounding or a negative amax (on the CPU; see kernels.quantize).
    """
    if num_bits == 0:
        # the kernel is skipped, so the checks it would make are made here
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}.")
        kernels.check_amax_on_host(amax)
        return torch.zeros_like(inputs)
    max_bound = max_bound_of(num_bits, unsigned)
    min_bound = min_bound_of(num_bits, unsigned, narrow_range)
    outputs, negative = kernels.quantize(inputs, amax, max_bound, min_bound, rounding=rounding,
                                         dequantize=dequantize, check_negative=unsigned)
    if negative:
        raise TypeError("Negative values encountered in unsigned quantization: an unsigned quantizer only "
                        "takes inputs >= 0 (for example after a ReLU). Use a signed descriptor for this tensor.")
    return outputs


def _scale_of(amax: torch.Tensor, num_bits: int, unsigned: bool) -> torch.Tensor:
    """pytorch-quantization's ``scale = max_bound / amax`` with 1 where amax is tiny."""
    max_bound = torch.tensor(max_bound_of(num_bits, unsigned), device=amax.device, dtype=amax.dtype)
    scale = max_bound / amax
    return torch.where(amax <= kernels.TINY_AMAX, torch.ones_like(scale), scale)


def _ste_grad(inputs: torch.Tensor, amax: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
    """Straight-through estimator with clipping: pass the gradient where |x| <= amax, else 0 (one fused
    pass where a kernel applies; see :mod:`workbench.quant.kernels.ste`)."""
    return ste.ste_grad(inputs, amax, grad_outputs)


class TensorQuantFunction(Function):
    """Quantize to integers (stored in the input's float dtype) and return ``(outputs, scale)``.

    Inputs are quantized within ``[-amax, amax]``; amax broadcasts to inputs (per tensor or per
    channel). ``outputs / scale`` dequantizes. Default ``narrow_range=True``: int8 uses [-127, 127].
    """

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        amax = _symmetric_amax(amax, inputs)
        _check_args(inputs, amax, num_bits)
        ctx.save_for_backward(inputs, amax)
        outputs = _quantize(inputs, amax, num_bits, unsigned, narrow_range, dequantize=False,
                            rounding="pytorch_quantization")
        scale = _scale_of(amax, num_bits, unsigned)
        if inputs.dtype == torch.half and scale.max() > 65504:
            raise ValueError(f"scale is too large for FP16 with amax={amax}: max_bound / amax exceeds 65504. "
                             "Quantize this tensor in float32 or use a larger amax.")
        return outputs, scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs, grad_scale):
        inputs, amax = ctx.saved_tensors
        return _ste_grad(inputs, amax, grad_outputs), None, None, None, None


class FakeTensorQuantFunction(Function):
    """Quantize then dequantize in one fused pass; STE gradient. ``rounding`` picks the convention
    (``"pytorch_quantization"``, the default, or ``"onnx"``; see :mod:`workbench.quant.kernels.fake_quant`)."""

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True, rounding="pytorch_quantization"):
        amax = _symmetric_amax(amax, inputs)
        _check_args(inputs, amax, num_bits)  # rounding is checked once, by the kernel dispatcher
        ctx.save_for_backward(inputs, amax)
        return _quantize(inputs, amax, num_bits, unsigned, narrow_range, dequantize=True, rounding=rounding)

    @staticmethod
    def backward(ctx, grad_outputs):
        inputs, amax = ctx.saved_tensors
        return _ste_grad(inputs, amax, grad_outputs), None, None, None, None, None


class LegacyFakeTensorQuantFunction(Function):
    """The unfused formula (several torch operations), kept as a reference for the fused kernel."""

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        amax = _symmetric_amax(amax, inputs)
        _check_args(inputs, amax, num_bits)
        kernels.check_amax_on_host(amax)
        ctx.save_for_backward(inputs, amax)
        if unsigned and (inputs < 0).any():
            raise TypeError("Negative values encountered in unsigned quantization.")
        if num_bits == 0:
            return torch.zeros_like(inputs)
        max_bound = max_bound_of(num_bits, unsigned)
        return kernels.quantize_reference(inputs, amax, max_bound, min_bound_of(num_bits, unsigned, narrow_range),
                                          "pytorch_quantization", dequantize=True)

    @staticmethod
    def backward(ctx, grad_outputs):
        inputs, amax = ctx.saved_tensors
        return ste.ste_grad_reference(inputs, amax, grad_outputs), None, None, None, None


class FakeAffineTensorQuantFunction(Function):
    """Asymmetric (scale + zero point) fake quantization over ``[min_range, max_range]``, per tensor.

    Kept for experiments, as in the original: TensorRT's INT8 path is symmetric.
    """

    @staticmethod
    def forward(ctx, inputs, min_range, max_range, num_bits=8):
        min_range = _as_amax_tensor(min_range, inputs)
        max_range = _as_amax_tensor(max_range, inputs)
        if bool((max_range <= min_range).any()):
            raise ValueError(f"max_range ({max_range}) must be greater than min_range ({min_range}).")
        ctx.save_for_backward(inputs, min_range, max_range)
        # 2**num_bits - 1 steps across the range, on the full signed grid [-2**(n-1), 2**(n-1) - 1]
        step_size = (max_range - min_range) / max_bound_of(num_bits, unsigned=True)
        min_bound = min_bound_of(num_bits, unsigned=False, narrow_range=False)
        max_bound = max_bound_of(num_bits, unsigned=False)
        quant_zero = torch.round(min_range / step_size) - min_bound
        quantized = torch.clamp(torch.round(inputs / step_size) - quant_zero, min_bound, max_bound)
        return (quantized + quant_zero) * step_size

    @staticmethod
    def backward(ctx, grad_outputs):
        inputs, min_range, max_range = ctx.saved_tensors
        inside = (inputs <= max_range) & (inputs >= min_range)
        return torch.where(inside, grad_outputs, torch.zeros_like(grad_outputs)), None, None, None


class ScaledE4M3Function(Function):
    """FP8 E4M3 fake quantization: scale so that amax maps to 448, round to E4M3, scale back.

    Values below 2**-24 in magnitude become 0, as in the original. ``rounding="onnx"`` computes what ONNX
    ``QuantizeLinear``/``DequantizeLinear`` to ``float8e4m3fn`` compute with ``scale = amax / 448``:
    ``e4m3(x / scale) * scale`` (the original multiplies by ``448 / amax`` and divides; the two can differ
    in the last bit, which can move a value across an E4M3 rounding boundary). An amax at or below 2**-24
    quantizes everything to 0 there, as the integer path does.
    """

    @staticmethod
    def forward(ctx, inputs, amax=None, E=4, M=3, rounding="pytorch_quantization"):
        if (E, M) != E4M3:
            raise NotImplementedError(f"Only E=4, M=3 (FP8 E4M3) is supported, got E={E}, M={M}.")
        ctx.save_for_backward(inputs)
        ctx.amax = amax
        x = inputs.float()
        if amax is not None and rounding == "onnx":
            amax_t = _as_amax_tensor(amax, inputs).to(inputs.device).float()
            tiny = amax_t <= kernels.TINY_AMAX
            scale = torch.where(tiny, torch.ones_like(amax_t), amax_t / E4M3_MAX)
            outputs = torch.where(tiny, torch.zeros((), device=x.device), _round_to_e4m3(x / scale) * scale)
            return outputs.to(inputs.dtype)
        if amax is None:
            outputs = _round_to_e4m3(x)
        else:
            amax_t = _as_amax_tensor(amax, inputs).to(inputs.device)
            scale = E4M3_MAX / amax_t
            outputs = _round_to_e4m3(x * scale) / scale
        outputs = torch.where(inputs.abs() < 1.0 / (1 << 24), torch.zeros_like(outputs), outputs)
        return outputs.to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs):
        (inputs,) = ctx.saved_tensors
        amax = ctx.amax if ctx.amax is not None else E4M3_MAX
        amax_t = _as_amax_tensor(amax, inputs).to(inputs.device)
        return _ste_grad(inputs, amax_t, grad_outputs), None, None, None, None


def _round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest FP8 E4M3 value, saturating at +-448 (NaN stays NaN)."""
    clamped = torch.clamp(x, -E4M3_MAX, E4M3_MAX)
    return clamped.to(torch.float8_e4m3fn).to(torch.float32)


tensor_quant = TensorQuantFunction.apply
legacy_fake_tensor_quant = LegacyFakeTensorQuantFunction.apply
fake_tensor_quant = FakeTensorQuantFunction.apply
fake_affine_tensor_quant = FakeAffineTensorQuantFunction.apply
scaled_e4m3 = ScaledE4M3Function.apply

