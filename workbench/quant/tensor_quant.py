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

import copy
import logging
import numbers
from typing import Any

import numpy as np
import torch
from torch.autograd import Function

import workbench.quant.kernels.fake_quant as kernels
import workbench.quant.kernels.ste as ste
from workbench.quant.kernels.fake_quant import ROUNDINGS, Rounding

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

CALIB_METHODS = ("max", "histogram")
E4M3 = (4, 3)
E4M3_MAX = 448.0
E2M1 = (2, 1)  # FP4 E2M1: NVFP4 with block_size (see workbench.quant.nvfp4)
MAX_NUM_BITS = 32


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _validate_num_bits(num_bits: Any) -> int | tuple[int, int]:
    if _is_int(num_bits):
        num_bits = int(num_bits)
        if num_bits < 0 or num_bits > MAX_NUM_BITS:
            raise ValueError(f"num_bits must be between 1 and {MAX_NUM_BITS}, got {num_bits}.")
        if num_bits == 0:
            logger.error("num_bits is 0: every value quantizes to 0. Use it only for debugging.")
        return num_bits
    if isinstance(num_bits, (tuple, list)) and tuple(num_bits) == E4M3:
        return E4M3
    if isinstance(num_bits, (tuple, list)) and tuple(num_bits) == E2M1:
        return E2M1
    raise TypeError(
        f"num_bits must be a positive integer, the tuple (4, 3) for FP8 E4M3, or (2, 1) for FP4 E2M1 (NVFP4, "
        f"with block_size), got {num_bits!r} "
        f"of type {type(num_bits).__name__}.")


def _validate_axis(axis: Any) -> int | tuple[int, ...] | None:
    if axis is None:
        return None
    if _is_int(axis):
        return int(axis)
    if isinstance(axis, (tuple, list)) and axis and all(_is_int(a) for a in axis):
        axes = tuple(int(a) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis must not repeat an axis, got {axis!r}.")
        return axes
    raise TypeError(f"axis must be None, an int or a non-empty tuple of ints, got {axis!r}.")


def _validate_amax(amax: Any) -> np.ndarray | None:
    if amax is None:
        return None
    if isinstance(amax, torch.Tensor):
        amax = amax.detach().cpu().numpy()
    if isinstance(amax, bool) or not isinstance(amax, (numbers.Real, list, tuple, np.ndarray)):
        raise TypeError(f"amax must be float, list or ndarray, not {type(amax).__name__}.")
    try:
        array = np.array(amax, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise TypeError(f"amax must hold numbers only, got {amax!r}.") from error
    if array.size == 0:
        raise ValueError("amax must not be empty.")
    if np.isnan(array).any():
        raise ValueError("amax must not be NaN.")
    if (array < 0).any():
        raise ValueError(f"amax must be non-negative, got a minimum of {float(array.min())}.")
    return array


def _validate_block_size(block_size: Any, axis: Any, learn_amax: bool, num_bits: Any = None) -> int | None:
    """Blocks run along the one weight dimension that ``axis`` does not keep: ``axis`` must be one int.

    FP4 E2M1 (NVFP4) needs blocks; on an activation (``axis`` None) they run along its last dimension.
    """
    if block_size is None:
        if num_bits == E2M1:
            raise ValueError("num_bits=(2, 1) (FP4 E2M1, NVFP4) needs block_size (16: an FP8 scale per 16 values).")
        return None
    if not _is_int(block_size) or int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer (elements per scale) or None, got {block_size!r}.")
    if num_bits == E2M1 and axis is None and not learn_amax:
        return int(block_size)
    if not _is_int(axis):
        raise ValueError(f"block_size needs axis set to the output-channel axis of a 2-D weight (the blocks run "
                         f"along the other, input, dimension), got axis={axis!r}.")
    if learn_amax:
        raise ValueError("block_size cannot be combined with learn_amax (a learned amax is per tensor).")
    return int(block_size)


def _validate_bool(field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{field} must be True or False, got {value!r}.")
    return bool(value)


class ScaledQuantDescriptor:
    """How a tensor is quantized: bits, granularity, range and calibration.

    Args:
        num_bits: number of bits (default 8), or ``(4, 3)`` for FP8 E4M3 per-tensor emulation.
        name: optional name, for messages.

    Keyword Arguments:
        fake_quant: quantize then dequantize (True, default) or return integers.
        axis: None (per tensor, default), an int or a tuple of ints: the axes that keep their own amax.
            For a KCRS convolution weight, ``axis=0`` is per output channel.
        amax: a float, list or ndarray: a fixed range instead of a calibrated or dynamic one.
        learn_amax: learn the range through a :class:`Clip` stage (per tensor only). Default False.
        scale_amax: multiply amax by this factor before quantizing (quick experiments). Default None.
        calib_method: ``"max"`` (default) or ``"histogram"``: which calibrator the quantizer gets.
        unsigned: use ``[0, 2**num_bits - 1]``. Default False.
        narrow_range: use ``[-max_bound, max_bound]`` instead of ``[-max_bound - 1, max_bound]``.
            Default False, as in pytorch-quantization.

    Raises:
        TypeError: a field has the wrong type, or an unknown keyword was given (the message names it).
        ValueError: a field has a value out of range (the message names it).
    """

    def __init__(self, num_bits: int | tuple[int, int] = 8, name: str | None = None, **kwargs: Any) -> None:
        self._num_bits = _validate_num_bits(num_bits)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string or None, not {type(name).__name__}.")
        self._name = name

        self._fake_quant = _validate_bool("fake_quant", kwargs.pop("fake_quant", True))
        self._axis = _validate_axis(kwargs.pop("axis", None))
        self._learn_amax = _validate_bool("learn_amax", kwargs.pop("learn_amax", False))
        if self._learn_amax and self._axis is not None:
            raise TypeError(f"axis is ignored and must be None when learn_amax is true (a learned amax is per "
                            f"tensor), got axis={self._axis!r}.")
        self._amax = _validate_amax(kwargs.pop("amax", None))

        scale_amax = kwargs.pop("scale_amax", None)
        if scale_amax is not None:
            if isinstance(scale_amax, bool) or not isinstance(scale_amax, numbers.Real):
                raise TypeError(f"scale_amax must be a number or None, got {scale_amax!r}.")
            if not np.isfinite(scale_amax) or scale_amax <= 0:
                raise ValueError(f"scale_amax must be a positive finite number, got {scale_amax!r}.")
        self._scale_amax = scale_amax

        calib_method = kwargs.pop("calib_method", "max")
        if calib_method not in CALIB_METHODS:
            raise ValueError(f"calib_method must be one of {CALIB_METHODS}, got {calib_method!r}.")
        self._calib_method = calib_method
        self._unsigned = _validate_bool("unsigned", kwargs.pop("unsigned", False))
        self._narrow_range = _validate_bool("narrow_range", kwargs.pop("narrow_range", False))
        # Not in pytorch-quantization (Model Optimizer has both ideas): blockwise scales and a quantizer that
        # the descriptor itself leaves off (INT4 weight-only keeps its activations in float).
        self._block_size = _validate_block_size(kwargs.pop("block_size", None), self._axis, self._learn_amax,
                                                self._num_bits)
        self._enabled = _validate_bool("enabled", kwargs.pop("enabled", True))

        if kwargs:
            raise TypeError(f"Unused keys: {sorted(kwargs)}. QuantDescriptor accepts fake_quant, axis, amax, "
                            "learn_amax, scale_amax, calib_method, unsigned, narrow_range, block_size and enabled.")

    @property
    def num_bits(self) -> int | tuple[int, int]:
        return self._num_bits

    @property
    def fake_quant(self) -> bool:
        return self._fake_quant

    @property
    def axis(self) -> int | tuple[int, ...] | None:
        return self._axis

    @property
    def amax(self) -> np.ndarray | None:
        return self._amax

    @property
    def learn_amax(self) -> bool:
        return self._learn_amax

    @property
    def scale_amax(self) -> float | None:
        return self._scale_amax

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def calib_method(self) -> str:
        return self._calib_method

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @property
    def block_size(self) -> int | None:
        """Elements per scale along the input dimension (blockwise, e.g. INT4 weights); None: whole axis."""
        return self._block_size

    @property
    def enabled(self) -> bool:
        """False: the quantizer is built switched off (the tensor stays in float)."""
        return self._enabled

    def __str__(self) -> str:
        s = (self._name + ": ") if self._name is not None else "QuantDescriptor"
        s += f"({'unsigned ' if self._unsigned else ''}{self._num_bits}bit"
        s += " fake" if self._fake_quant else " real"
        s += f" axis={self._axis if self._axis is not None else ' per-tensor'}"
        if self._amax is not None:
            s += f" amax={np.array2string(self._amax.flatten(), edgeitems=1, formatter={'all': '{:.2e}'.format})}"
        if self._learn_amax:
            s += " learn_amax"
        if self._scale_amax:
            s += f" scale_amax={self._scale_amax}"
        if self._narrow_range:
            s += " narrow"
        if self._calib_method != "max":
            s += f" calib={self._calib_method}"
        if self._block_size is not None:
            s += f" block={self._block_size}"
        if not self._enabled:
            s += " disabled"
        return s + ")"

    __repr__ = __str__

    def __eq__(self, rhs: object) -> bool:
        if not isinstance(rhs, ScaledQuantDescriptor):
            return NotImplemented
        mine, theirs = dict(self.__dict__), dict(rhs.__dict__)
        amax_a, amax_b = mine.pop("_amax"), theirs.pop("_amax")
        if (amax_a is None) != (amax_b is None):
            return False
        if amax_a is not None and not np.array_equal(amax_a, amax_b):
            return False
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type, like the original

    def dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults; ``QuantDescriptor(**d.dict())`` rebuilds ``d``."""
        obj: dict[str, Any] = {"num_bits": self._num_bits, "name": self._name}
        if not self._fake_quant:
            obj["fake_quant"] = self._fake_quant
        if self._axis is not None:
            obj["axis"] = self._axis
        if self._amax is not None:
            obj["amax"] = self._amax.tolist()
        if self._scale_amax is not None:
            obj["scale_amax"] = self._scale_amax
        if self._learn_amax:
            obj["learn_amax"] = self._learn_amax
        if self._unsigned:
            obj["unsigned"] = self._unsigned
        if self._narrow_range:
            obj["narrow_range"] = self._narrow_range
        if self._calib_method != "max":
            obj["calib_method"] = self._calib_method
        if self._block_size is not None:
            obj["block_size"] = self._block_size
        if not self._enabled:
            obj["enabled"] = False
        return obj

    def to_yaml(self) -> str:
        """YAML text of :meth:`dict` (axis written as a list)."""
        import yaml  # optional dependency, as in the original

        obj = self.dict()
        if "axis" in obj:
            obj["axis"] = list(obj["axis"]) if isinstance(obj["axis"], tuple) else [obj["axis"]]
        if isinstance(obj["num_bits"], tuple):
            obj["num_bits"] = list(obj["num_bits"])
        return yaml.dump(obj, width=120)

    @classmethod
    def from_yaml(cls, yaml_str: str) -> ScaledQuantDescriptor:
        """Build a descriptor from :meth:`to_yaml` text (safe loader: no code runs)."""
        import yaml

        obj = yaml.safe_load(yaml_str)
        if not isinstance(obj, dict):
            raise ValueError("QuantDescriptor YAML must be a mapping of field names to values.")
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> ScaledQuantDescriptor:
        """Build a descriptor from :meth:`dict` fields as JSON or YAML give them back (lists for tuples).

        Raises:
            TypeError, ValueError: as the constructor (the message names the field).
        """
        if not isinstance(fields, dict):
            raise TypeError(f"a descriptor is a mapping of field names to values, got {type(fields).__name__}.")
        fields = dict(fields)
        if isinstance(fields.get("axis"), list):
            fields["axis"] = tuple(fields["axis"]) if len(fields["axis"]) != 1 else fields["axis"][0]
        if isinstance(fields.get("num_bits"), list):
            fields["num_bits"] = tuple(fields["num_bits"])
        return cls(**{str(key): value for key, value in fields.items()})

    def replace(self, **changes: Any) -> ScaledQuantDescriptor:
        """A copy with some fields changed (validated like the constructor)."""
        fields = self.dict()
        fields.update(changes)
        return type(self)(**fields)

    def __deepcopy__(self, memo: dict) -> ScaledQuantDescriptor:
        new = type(self).__new__(type(self))
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return new


QuantDescriptor = ScaledQuantDescriptor

# Predefined descriptors. ConvTranspose weights are laid out (in, out, ...), so their output
# channel is axis 1; the original library used axis 0 here, which quantizes per input channel.
QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)


def max_bound_of(num_bits: int, unsigned: bool) -> float:
    """Largest integer of the grid: ``2**(num_bits - 1 + unsigned) - 1``. The one place this is written.

    Raises:
        ValueError: ``num_bits`` is not an integer, e.g. ``(4, 3)`` for FP8 E4M3, whose grid is not
            uniform, so it has no integer bound, step size or integer-grid calibration.
    """
    if not _is_int(num_bits):
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
    if not _is_int(num_bits) or not 0 <= num_bits <= MAX_NUM_BITS:
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

