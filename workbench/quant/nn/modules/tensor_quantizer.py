"""TensorQuantizer: the module that (fake) quantizes one tensor, calibrates its range, or passes it through."""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn

import workbench.quant.calib as calib
import workbench.quant.kernels.fake_quant as kernels
import workbench.quant.utils as quant_utils
from workbench.quant.kernels.blocks import block_kept_axes, block_view, unblock
from workbench.quant.kernels.fake_quant import ROUNDINGS, Rounding
from workbench.quant.nn.modules.clip import Clip
from workbench.quant.nvfp4 import E2M1, block_axis_of, nvfp4_fake_quant
from workbench.quant.tensor_quant import (
    E4M3,
    E4M3_MAX,
    QuantDescriptor,
    fake_tensor_quant,
    max_bound_of,
    min_bound_of,
    scaled_e4m3,
    tensor_quant,
)

logger = logging.getLogger(__name__)

__all__ = ["TensorQuantizer"]


def _default_descriptor() -> QuantDescriptor:
    return QuantDescriptor()


class TensorQuantizer(nn.Module):
    """Quantizes a tensor with :func:`fake_tensor_quant` (or :func:`tensor_quant`), with three switches:

    * ``disable()`` / ``enable()``: bypass the module entirely.
    * ``disable_quant()`` / ``enable_quant()``: the quantization step.
    * ``enable_calib()`` / ``disable_calib()``: feed every input to the calibrator.

    amax comes from, in order: the ``_amax`` buffer (set from the descriptor, by
    :meth:`load_calib_amax` or the ``amax`` setter; it round-trips through ``state_dict``), else the
    input's own absolute max (dynamic quantization). With ``learn_amax`` a :class:`Clip` stage
    learns the range.

    Args:
        quant_desc: a :class:`QuantDescriptor`.
        disabled: start bypassed. Default False.
        if_quant: start with quantization on. Default True.
        if_clip: start with the clip stage on (needs ``learn_amax``). Default False.
        if_calib: start calibrating. Default False.
    """

    # Experimental switch kept from pytorch-quantization: use torch's native fake-quantize operators
    # (full int8 range) so that the TorchScript ONNX exporter emits QuantizeLinear/DequantizeLinear.
    use_fb_fake_quant = False
    _enable_onnx_export = False
    # Rounding convention of new quantizers (see workbench.quant.kernels.fake_quant). The workbench sets
    # "onnx" on the quantizers of models it exports so that PyTorch and the QDQ graph agree.
    default_rounding: Rounding = "pytorch_quantization"

    def __init__(self, quant_desc: QuantDescriptor | None = None, disabled: bool = False, if_quant: bool = True,
                 if_clip: bool = False, if_calib: bool = False) -> None:
        super().__init__()
        if quant_desc is None:
            quant_desc = _default_descriptor()
        if not isinstance(quant_desc, QuantDescriptor):
            raise TypeError(f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}.")
        self._num_bits = quant_desc.num_bits
        self._fake_quant = quant_desc.fake_quant
        self._axis = quant_desc.axis
        self._scale_amax = quant_desc.scale_amax
        self._learn_amax = quant_desc.learn_amax
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range
        self._block_size = quant_desc.block_size
        # what the descriptor says (kept apart from _disabled, which calibration and rules switch)
        self._enabled_by_desc = quant_desc.enabled
        disabled = disabled or not quant_desc.enabled
        self._rounding: Rounding = type(self).default_rounding

        self._scale = None
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = False
        self._if_calib = if_calib

        if quant_desc.amax is not None:
            self.register_buffer("_amax", torch.tensor(quant_desc.amax))

        if self._learn_amax:
            init_amax = float(quant_desc.amax.max()) if quant_desc.amax is not None else 1.0
            self.clip = Clip(-init_amax, init_amax, learn_min=True, learn_max=True)
            self.enable_clip()
        if if_clip:
            self.enable_clip()

        self._calibrator: calib.Calibrator | None
        # a blockwise quantizer's calibrator sees the blocked view of the weight (see blocks.block_view)
        if self._num_bits == E2M1:  # NVFP4 calibrates its global (per-tensor) amax; block scales are per call
            calib_axis = None
        else:
            calib_axis = block_kept_axes(self._axis) if self._block_size is not None else self._axis
        if quant_desc.calib_method == "histogram":
            self._calibrator = calib.HistogramCalibrator(num_bits=self._num_bits, axis=calib_axis,
                                                         unsigned=self._unsigned)
        else:
            self._calibrator = calib.MaxCalibrator(num_bits=self._num_bits, axis=calib_axis,
                                                   unsigned=self._unsigned)

    # ----- properties -------------------------------------------------------------------------

    @property
    def num_bits(self):
        return self._num_bits

    @num_bits.setter
    def num_bits(self, value):
        self._num_bits = value

    @property
    def maxbound(self) -> float:
        """Largest integer of the grid (448 for FP8 E4M3)."""
        if self._num_bits == E4M3:
            return E4M3_MAX
        return int(max_bound_of(self._num_bits, self._unsigned))

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @unsigned.setter
    def unsigned(self, value: bool) -> None:
        self._unsigned = value

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @narrow_range.setter
    def narrow_range(self, value: bool) -> None:
        self._narrow_range = value

    @property
    def axis(self):
        return self._axis

    @property
    def block_size(self) -> int | None:
        """Elements per amax along the weight's input dimension (blockwise INT4); None: not blockwise."""
        return self._block_size

    @property
    def enabled_by_descriptor(self) -> bool:
        """False when the descriptor itself leaves this tensor in float (INT4 weight-only's activations)."""
        return self._enabled_by_desc

    @property
    def fake_quant(self) -> bool:
        return self._fake_quant

    @property
    def learn_amax(self) -> bool:
        return self._learn_amax

    @property
    def scale_amax(self):
        return self._scale_amax

    @property
    def rounding(self) -> Rounding:
        """Rounding convention: ``"pytorch_quantization"`` or ``"onnx"`` (see
        :mod:`workbench.quant.kernels.fake_quant`)."""
        return self._rounding

    @rounding.setter
    def rounding(self, value: Rounding) -> None:
        if value not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {value!r}.")
        self._rounding = value

    @property
    def scale(self):
        """The scale of the last real (not fake) quantization; None before the first call."""
        if self._fake_quant:
            logger.warning("Fake quantize mode doesn't use scale explicitly.")
        return self._scale

    @property
    def amax(self) -> torch.Tensor | None:
        """The fixed range (the ``_amax`` buffer), or None while the quantizer uses each input's own range."""
        return self._buffers.get("_amax")

    @amax.setter
    def amax(self, value) -> None:
        self.set_amax(value)

    @property
    def has_amax(self) -> bool:
        """Whether a fixed amax is set (by calibration, :meth:`set_amax` or a loaded state_dict)."""
        return self._buffers.get("_amax") is not None

    def set_amax(self, value: torch.Tensor | np.ndarray | float | list) -> None:
        """Set the fixed range amax, creating the buffer if the quantizer has none yet.

        Args:
            value: a scalar (per tensor) or a tensor/array of the shape of the current amax (per channel
                or per block); values must be finite and non-negative.

        Raises:
            ValueError: ``value`` is None, not numeric, negative, NaN or infinite.
            RuntimeError: the quantizer has an amax of another shape (reshaping would silently change the
                quantizer's granularity; use :meth:`reset_amax` first to change it on purpose).
        """
        if value is None:
            raise ValueError("amax cannot be set to None; use reset_amax() to return to dynamic range.")
        try:
            tensor = torch.as_tensor(np.asarray(value, dtype=np.float32) if not isinstance(value, torch.Tensor)
                                     else value.detach().float())
        except (TypeError, ValueError) as error:
            raise ValueError(f"amax must be a number or an array of numbers, got {type(value).__name__} "
                             f"({error}).") from None
        if not bool(torch.isfinite(tensor).all()) or bool((tensor < 0).any()):
            raise ValueError(f"amax must be finite and non-negative, got {value!r}.")
        current = self._buffers.get("_amax")
        if current is None:
            self.register_buffer("_amax", tensor.clone())
        else:
            if current.shape != tensor.shape:
                raise RuntimeError(f"Changing shape when setting amax is not allowed: the quantizer has amax of "
                                   f"shape {tuple(current.shape)}, got {tuple(tensor.shape)}.")
            current.data.copy_(tensor.to(current.device))

    def replace_amax(self, value: torch.Tensor) -> None:
        """Install ``value`` as the amax buffer as it is (any shape, dtype and device), e.g. a stored calibration.

        Unlike :meth:`set_amax`, the shape may change and a NaN is kept: it marks a quantizer the
        calibration never reached (``load_calib_amax(strict=False)``).

        Args:
            value: the new amax tensor; it becomes the buffer itself (not a copy).

        Raises:
            TypeError: ``value`` is not a tensor.
        """
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"amax must be a tensor, got {type(value).__name__}.")
        self.reset_amax()
        self.register_buffer("_amax", value)

    def move_amax_to(self, device: torch.device | str) -> None:
        """Move the amax buffer to ``device`` (no-op without amax), e.g. after calibrating on another device."""
        current = self._buffers.get("_amax")
        if current is not None:
            self._buffers["_amax"] = current.to(device)

    def reset_amax(self) -> None:
        """Forget amax: the quantizer goes back to the input's dynamic range until calibrated again."""
        if hasattr(self, "_amax"):
            delattr(self, "_amax")

    @property
    def calibrator(self) -> calib.Calibrator | None:
        """The calibrator that collects statistics while calibration is on (read-only; None if not created)."""
        return self._calibrator

    @property
    def step_size(self):
        """amax / max_bound; None without amax. ValueError for FP8 E4M3 (its grid has no single step)."""
        if not hasattr(self, "_amax"):
            logger.error("step_size is undefined under dynamic amax mode.")
            return None
        return self._amax / max_bound_of(self._num_bits, self._unsigned)

    @property
    def pre_quant_scale(self) -> torch.Tensor | None:
        """Optional per-tensor or per-channel factor applied to inputs before quantization (SmoothQuant)."""
        if not hasattr(self, "_pre_quant_scale"):
            return None
        return self._pre_quant_scale

    @pre_quant_scale.setter
    def pre_quant_scale(self, value) -> None:
        if value is None:
            raise ValueError("pre_quant_scale cannot be set to None.")
        tensor = value.detach().clone() if isinstance(value, torch.Tensor) else torch.tensor(value)
        if not hasattr(self, "_pre_quant_scale"):
            self.register_buffer("_pre_quant_scale", tensor)
        else:
            if self._pre_quant_scale.shape != tensor.shape:
                raise RuntimeError("Changing shape when setting pre_quant_scale is not allowed.")
            self._pre_quant_scale.data.copy_(tensor.to(self._pre_quant_scale.device))

    @property
    def is_enabled(self) -> bool:
        return not self._disabled

    @property
    def is_quant_enabled(self) -> bool:
        return self._if_quant

    @property
    def is_calib_enabled(self) -> bool:
        return self._if_calib

    @property
    def is_clip_enabled(self) -> bool:
        """Whether the (learned-range) clip stage runs."""
        return self._if_clip

    @property
    def is_onnx_export_enabled(self) -> bool:
        """Whether the quantizer checks it is ready for ONNX export on each call (see quant_modules)."""
        return self._enable_onnx_export

    def config_key(self) -> tuple:
        """Every switch and setting that :meth:`forward` reads, except the amax / pre_quant_scale tensors.

        Returns:
            A hashable tuple: equal keys (and equal amax / pre_quant_scale tensors) give equal outputs for
            the same input. Used to memoise a quantized weight.
        """
        return (self._disabled, self._if_quant, self._if_clip, self._if_calib, self._fake_quant, self._num_bits,
                self._unsigned, self._narrow_range, self._axis, self._block_size, self._scale_amax, self._rounding,
                self._enable_onnx_export, TensorQuantizer.use_fb_fake_quant)

    # ----- switches ---------------------------------------------------------------------------

    def disable(self) -> None:
        """Bypass the module: inputs pass through unchanged."""
        self._disabled = True

    def enable(self) -> None:
        """Stop bypassing the module: it quantizes and/or calibrates as its other switches say."""
        self._disabled = False

    def set_enabled(self, enabled: bool) -> None:
        """:meth:`enable` when ``enabled`` is true, else :meth:`disable`.

        Args:
            enabled: whether the quantizer runs (False: inputs pass through unchanged).
        """
        self._disabled = not enabled

    def disable_clip(self) -> None:
        """Disable the clip stage."""
        self._if_clip = False
        if hasattr(self, "clip"):
            self.clip.clip_value_min.requires_grad = False
            self.clip.clip_value_max.requires_grad = False

    def enable_clip(self) -> None:
        """Enable the clip stage, which learns amax."""
        if not self._learn_amax:
            raise ValueError("learn_amax is False. Cannot enable clip.")
        self.clip.clip_value_min.requires_grad = True
        self.clip.clip_value_max.requires_grad = True
        self._if_clip = True

    def disable_calib(self) -> None:
        """Stop feeding inputs to the calibrator."""
        self._if_calib = False

    def enable_calib(self) -> None:
        """Feed every input to the calibrator (ValueError without one)."""
        if self._calibrator is None:
            raise ValueError("Calibrator was not created, cannot enable calibration.")
        self._if_calib = True

    def disable_quant(self) -> None:
        """Skip the quantization step (inputs still reach the calibrator if calibration is on)."""
        self._if_quant = False

    def enable_quant(self) -> None:
        """Run the quantization step."""
        self._if_quant = True

    def start_learning_amax(self, init_amax: float) -> None:
        """Give a fixed-range quantizer a learnable range (a :class:`Clip` stage started at ``+-init_amax``).

        Args:
            init_amax: the starting range, usually the calibrated per-tensor amax.

        Raises:
            ValueError: the quantizer learns its range already.
        """
        if self._learn_amax:
            raise ValueError("The quantizer learns its amax already.")
        clip = Clip(-init_amax, init_amax, learn_min=True, learn_max=True)
        amax = self._buffers.get("_amax")
        self._learn_amax = True
        self.clip = clip.to(amax.device) if amax is not None else clip
        self.enable_clip()

    def stop_learning_amax(self) -> None:
        """Remove the learnable range added by :meth:`start_learning_amax`: the quantizer keeps its amax buffer.

        Raises:
            ValueError: the quantizer does not learn its range.
        """
        if not self._learn_amax:
            raise ValueError("The quantizer does not learn its amax.")
        self.disable_clip()
        self._learn_amax = False
        del self.clip

    # ----- calibration ------------------------------------------------------------------------

    def load_calib_amax(self, *args: Any, **kwargs: Any) -> None:
        """Compute amax with the calibrator and store it in the ``_amax`` buffer (created if needed).

        Arguments are passed to the calibrator's ``compute_amax`` (e.g. ``method="entropy"``), except
        ``strict``: with ``strict=False`` a calibrator that saw no data sets amax to NaN instead of raising.
        """
        strict = kwargs.pop("strict", True)
        if getattr(self, "_calibrator", None) is None:
            raise RuntimeError("Calibrator not created.")
        calib_amax = self._calibrator.compute_amax(*args, **kwargs)
        if calib_amax is None:
            message = "Calibrator returned None. This usually happens when calibrator hasn't seen any tensor."
            if strict:
                raise RuntimeError(message + " Passing 'strict=False' to `load_calib_amax()` will ignore the error.")
            logger.warning("%s Setting amax to NaN.", message)
            calib_amax = torch.tensor(math.nan)
        calib_amax = calib_amax.detach().float()
        kernels.refuse_negative_amax(calib_amax)  # once per calibration: the per-call path does not read it
        if hasattr(self, "_amax") and self._amax.shape == calib_amax.shape:
            self._amax.copy_(calib_amax.to(self._amax.device))
        else:
            if hasattr(self, "_amax"):
                delattr(self, "_amax")
            self.register_buffer("_amax", calib_amax.clone())

    def init_learn_amax(self) -> None:
        """Initialize the learned range from the fixed (calibrated) amax."""
        if not self._learn_amax:
            raise RuntimeError("Called init_learn_amax with learn_amax=False.")
        if not hasattr(self, "_amax"):
            raise RuntimeError("init_learn_amax needs an amax: calibrate or set amax first.")
        init_amax = torch.max(self._amax) if self._amax.numel() != 1 else self._amax
        self.clip.clip_value_min.data.copy_(-init_amax.data)
        self.clip.clip_value_max.data.copy_(init_amax.data)

    # ----- forward ----------------------------------------------------------------------------

    def _reduce_axes(self, inputs: torch.Tensor) -> list[int] | None:
        if self._axis is None:
            return None
        axes = self._axis if isinstance(self._axis, (list, tuple)) else [self._axis]
        if self._block_size is not None:  # inputs are the blocked view here
            axes = list(block_kept_axes(self._axis))
        keep = {a % inputs.dim() for a in axes}
        return [i for i in range(inputs.dim()) if i not in keep]

    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """amax from the buffer, or computed from the inputs (dynamic range)."""
        if hasattr(self, "_amax"):
            amax = self._amax
        else:
            amax = quant_utils.reduce_amax(inputs, axis=self._reduce_axes(inputs), keepdims=True).detach()
        if self._scale_amax is not None:
            amax = amax.detach() * self._scale_amax
        amax = amax.data
        if amax.dtype not in (torch.double, torch.float):
            amax = amax.float()
        return amax

    def _fb_fake_quant(self, inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
        """torch's native fake quantization (full range, e.g. [-128, 127]); exports to Q/DQ."""
        bound = int(max_bound_of(self._num_bits, self._unsigned))
        low = int(min_bound_of(self._num_bits, self._unsigned, narrow_range=False))  # torch's full range
        if amax.numel() == 1:
            return torch.fake_quantize_per_tensor_affine(inputs, amax.item() / bound, 0, low, bound)
        amax_squeezed = amax.squeeze().detach().to(inputs.device)
        if amax_squeezed.dim() != 1:
            raise TypeError("Pytorch's native quantization doesn't support multiple axes")
        quant_dim = list(amax.shape).index(amax_squeezed.shape[0])
        scale = (amax_squeezed / bound).float()
        zero_point = torch.zeros_like(scale, dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(inputs, scale, zero_point, quant_dim, low, bound)

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._learn_amax:
            inputs = self.clip(inputs)
            amax = torch.max(-self.clip.clip_value_min, self.clip.clip_value_max).detach()
        else:
            amax = self._get_amax(inputs)

        if self._fake_quant:
            if TensorQuantizer.use_fb_fake_quant:
                if inputs.dtype == torch.half or amax.dtype == torch.half:
                    raise TypeError("Exporting to ONNX in fp16 is not supported. Export in fp32 (disable AMP).")
                return self._fb_fake_quant(inputs, amax)
            return fake_tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range,
                                     self._rounding)
        outputs, self._scale = tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range)
        return outputs

    def _check_onnx_readiness(self, inputs: torch.Tensor) -> None:
        if not hasattr(self, "_amax"):
            raise RuntimeError("Quantizer has not been calibrated. ONNX export requires the quantizer to be "
                               "calibrated: calibrate and load amax before exporting to ONNX.")
        if self._if_calib:
            logger.warning("Quantizer is in calibration mode; finish calibration before exporting to ONNX.")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._num_bits == E2M1:  # NVFP4 blocks its input itself (the calibrator sees the tensor whole)
            return self._forward(inputs)
        if self._block_size is not None and not self._disabled:
            # blockwise: calibrate and quantize the [out, blocks, block] view, then give the weight its shape back
            blocked = block_view(inputs, self._axis, self._block_size)
            return unblock(self._forward(blocked), inputs.shape, self._axis)
        return self._forward(inputs)

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._enable_onnx_export:
            self._check_onnx_readiness(inputs)
        # the buffer itself, not the property: its hasattr() raises and catches an AttributeError per call
        pre_quant_scale = self._buffers.get("_pre_quant_scale")
        if pre_quant_scale is None:
            return self._quantize(inputs)
        # x / s in float32 (the scale's type), quantized there, and handed on in the network's own dtype: a bf16
        # layer gets bf16 back (its GEMM takes no float32 input), as the exported Cast -> Mul -> Q/DQ -> Cast does
        outputs = self._quantize(inputs * pre_quant_scale)
        return outputs if outputs.dtype == inputs.dtype else outputs.to(inputs.dtype)

    def _quantize(self, inputs: torch.Tensor) -> torch.Tensor:
        """Collect and fake-quantize ``inputs`` as the switches say (the pre-quantization scale already applied)."""
        if self._disabled:
            return inputs
        if inputs.is_meta:  # a run on shapes only (a lazily opened model's placement): a new tensor, no values
            return torch.empty_like(inputs)

        outputs = inputs
        if self._if_calib:
            if self._calibrator is None:
                raise RuntimeError("Calibrator was not created.")
            self._calibrator.collect(inputs)
        if self._if_clip:
            if not self._learn_amax:
                raise RuntimeError("Clip without learning amax is not implemented.")
            outputs = self.clip(inputs)
        if self._if_quant:
            if self._num_bits == E2M1:
                outputs = self._nvfp4_forward(inputs)
            elif isinstance(self._num_bits, tuple):
                exponent, mantissa = self._num_bits
                outputs = scaled_e4m3(inputs, self._get_amax(inputs), exponent, mantissa, self._rounding)
            else:
                outputs = self._quant_forward(inputs)
        return outputs

    def _nvfp4_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """NVFP4: the calibrated amax is the global one (the tensor's own max without one); blocks along the
        input features, scaled per block at run time (see :mod:`workbench.quant.nvfp4`)."""
        amax = self._amax if hasattr(self, "_amax") else inputs.detach().abs().amax()
        if self._scale_amax is not None:
            amax = amax * self._scale_amax
        axis = block_axis_of(inputs.dim(), self._axis if isinstance(self._axis, int) else None)
        return nvfp4_fake_quant(inputs, amax.detach().float().reshape(()), self._block_size, axis)

    # ----- description ------------------------------------------------------------------------

    def amax_summary(self, fmt: str = ".4f") -> str:
        """The amax in a few characters, for tables and ``repr``.

        Args:
            fmt: format spec of each number.

        Returns:
            ``"dynamic"`` without amax, the value per tensor, ``"[min, max](count)"`` per channel or block.
        """
        if not hasattr(self, "_amax"):
            return "dynamic"
        if self._amax is None:
            return "None"
        if self._amax.numel() == 1:
            return f"{self._amax.item():{fmt}}"
        return f"[{self._amax.min().item():{fmt}}, {self._amax.max().item():{fmt}}]({self._amax.numel()})"

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        s = f"{'unsigned ' if self._unsigned else ''}{self._num_bits}bit"
        s += " narrow" if self._narrow_range else ""
        s += " fake" if self._fake_quant else ""
        s += f" axis={self._axis}" if self._axis is not None else " per-tensor"
        s += f" amax={self.amax_summary()}"
        s += f" *{self._scale_amax}" if self._scale_amax else ""
        s += f" block={self._block_size}" if self._block_size is not None else ""
        s += " pre_quant_scale" if self.pre_quant_scale is not None else ""
        s += " learned" if self._learn_amax else ""
        s += f" calibrator={type(self._calibrator).__name__}" if self._calibrator is not None else ""
        s += f" scale={self._scale}" if self._scale is not None and not self._fake_quant else ""
        s += " quant" if self._if_quant else ""
        s += " clip" if self._if_clip else ""
        s += " calib" if self._if_calib else ""
        return s

    # ----- state_dict -------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Create or reshape the ``_amax`` / ``_pre_quant_scale`` buffers to what the state_dict holds.

        A quantizer's amax only exists after calibration, so loading a calibrated checkpoint into a
        fresh model must create the buffer. A per-channel amax from pytorch-quantization along another
        axis (its ConvTranspose default was axis 0) is kept as saved, and the quantizer's axis follows it.
        """
        refused: set[str] = set()
        for name in ("_amax", "_pre_quant_scale"):
            key = prefix + name
            if key not in state_dict:
                if name in self._buffers and name == "_amax":
                    logger.debug("%s: no amax in state_dict; keeping the current one.", prefix[:-1])
                continue
            saved = state_dict[key]
            if not isinstance(saved, torch.Tensor):
                error_msgs.append(f"{key}: expected a tensor, got {type(saved).__name__}.")
                continue
            if name == "_amax":
                try:  # refused at load, once: the per-call path does not read a CUDA amax back
                    kernels.refuse_negative_amax(saved)
                except ValueError as error:
                    error_msgs.append(f"{key}: {error}")
                    refused.add(key)
                    continue
            current = self._buffers.get(name)
            if current is None or current.shape != saved.shape:
                device = current.device if current is not None else self._module_device(saved.device)
                self._buffers[name] = torch.empty(saved.shape, dtype=saved.dtype, device=device)
                if name == "_amax":
                    self._follow_amax_axis(saved)
        if refused:  # not copied into the buffer: the quantizer keeps the amax it had
            state_dict = {key: value for key, value in state_dict.items() if key not in refused}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        missing_keys[:] = [key for key in missing_keys if key not in refused]  # refused, not missing

    def _module_device(self, fallback: torch.device) -> torch.device:
        for tensor in list(self.parameters(recurse=True)) + list(self.buffers(recurse=True)):
            return tensor.device
        return fallback

    def _follow_amax_axis(self, amax: torch.Tensor) -> None:
        if amax.numel() <= 1 or self._block_size is not None:  # a block amax keeps the descriptor's axis
            return
        axes = tuple(i for i, size in enumerate(amax.shape) if size != 1)
        if len(axes) == 1:
            axes_value: int | tuple[int, ...] = axes[0]
        else:
            axes_value = axes
        if self._axis != axes_value and not (isinstance(self._axis, tuple) and self._axis == axes):
            logger.info("Quantizer axis set to %s to match the loaded amax of shape %s.", axes_value,
                        tuple(amax.shape))
            self._axis = axes_value
            if self._calibrator is not None:
                self._calibrator.axis = axes_value
