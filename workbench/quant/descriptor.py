"""The quantization descriptor: what a quantizer is (bits, axis, amax, calibrator, range), checked when made.

Part of pytorch-quantization's vocabulary (its ``tensor_quant.QuantDescriptor``; ``workbench.quant.tensor_quant``
still offers every name here). Light on purpose, numpy but no torch: the project's settings build and check
descriptors when a command's ``--help`` reads the defaults.
"""
from __future__ import annotations

import copy
import logging
import numbers
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "ScaledQuantDescriptor", "QuantDescriptor", "CALIB_METHODS", "E4M3", "E4M3_MAX", "E2M1", "NVFP4_BLOCK_SIZE",
    "MAX_NUM_BITS", "is_int",
    "QUANT_DESC_8BIT_PER_TENSOR", "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
]

CALIB_METHODS = ("max", "histogram")
E4M3 = (4, 3)
E4M3_MAX = 448.0
E2M1 = (2, 1)  # FP4 E2M1: NVFP4 with block_size (see workbench.quant.nvfp4)
NVFP4_BLOCK_SIZE = 16  # TensorRT's and Model Optimizer's NVFP4 block
MAX_NUM_BITS = 32


def is_int(value: Any) -> bool:
    """An integer that is not a bool (``True`` is an int to Python, never a bit count or an axis)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _validate_num_bits(num_bits: Any) -> int | tuple[int, int]:
    if is_int(num_bits):
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
    if is_int(axis):
        return int(axis)
    if isinstance(axis, (tuple, list)) and axis and all(is_int(a) for a in axis):
        axes = tuple(int(a) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis must not repeat an axis, got {axis!r}.")
        return axes
    raise TypeError(f"axis must be None, an int or a non-empty tuple of ints, got {axis!r}.")


def _validate_amax(amax: Any) -> np.ndarray | None:
    if amax is None:
        return None
    if hasattr(amax, "detach"):  # a torch.Tensor, read without importing torch here
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
    if not is_int(block_size) or int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer (elements per scale) or None, got {block_size!r}.")
    if num_bits == E2M1 and axis is None and not learn_amax:
        return int(block_size)
    if not is_int(axis):
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
