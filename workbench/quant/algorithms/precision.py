"""Precision per layer: what each format of the registry (:mod:`~workbench.quant.algorithms.precision_registry`:
``int8``, ``fp8``, ``int4w``, ``nvfp4``, ``float``) means in descriptors, and what each costs in weight bytes.

A precision is not stored on its own: it *is* the layer's descriptors (pytorch-quantization's vocabulary:
``num_bits=(4, 3)`` is FP8 E4M3) and its quantize flag, so the descriptor editor, ``workbench show``, the
project file and undo all see the same thing. :func:`descriptors_for` writes a precision as descriptor
fields; :func:`precision_of` reads them back (a hand edit to E4M3 descriptors reads as ``fp8``); anything
that matches no precision (say 4-bit per-channel weights with 8-bit inputs) reads as None, "custom".

Every menu, ``--help`` text and the ladder search read :class:`Precision` and :data:`PRECISIONS`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.quant.algorithms.precision_registry import (
    DEFAULT_BLOCK_SIZE,
    E2M1_BITS,
    E4M3_BITS,
    FP8_OPS,
    FP8_SCALE_BYTES,
    GEMM_TYPES,
    NVFP4_BLOCK_SIZE,
    PRECISIONS,
    SCALE_BYTES,
    Precision,
    PrecisionInfo,
    parse_precision,
    precision_choices_text,
)
from workbench.quant.algorithms.tensorrt_rules import output_channel_axis
from workbench.quant.kernels.blocks import blocks_of
from workbench.quant.nvfp4 import E2M1_LEVELS, E2M1_MAX
from workbench.quant.tensor_quant import E4M3_MAX

__all__ = ["Precision", "PrecisionInfo", "PRECISIONS", "DEFAULT_BLOCK_SIZE", "E4M3_BITS", "E2M1_BITS",
           "NVFP4_BLOCK_SIZE", "parse_precision", "precision_choices_text", "applies_to", "descriptors_for",
           "precision_of", "precision_label", "layer_weight_bytes", "weight_bytes", "GEMM_TYPES", "FP8_OPS",
           "grid_levels", "mix_label"]

def _kind(module_type: str) -> str:
    return module_type.removeprefix("Quant")


def applies_to(precision: Precision, module_type: str, *, has_weight: bool,
               weight_ndim: int | None = None) -> str | None:
    """None when a ``module_type`` layer can run in ``precision``, else why not (a sentence).

    int4w needs a weight GEMM: a weight quantizer on a 2-D weight (``weight_ndim``; when not given, the
    layer types of :data:`GEMM_TYPES`), so any Linear-like module qualifies.
    """
    if precision is Precision.INT4W:
        gemm = weight_ndim == 2 if weight_ndim is not None else _kind(module_type) in GEMM_TYPES
        if not has_weight or not gemm:
            return (f"int4w is INT4 weight-only for weight GEMMs (2-D weights: {', '.join(GEMM_TYPES)}): a "
                    f"{_kind(module_type)} layer {'has no weight quantizer' if not has_weight else 'is not a GEMM'}"
                    "; TensorRT builds INT4 only as weight-only GEMMs.")
    if precision is Precision.NVFP4:
        gemm = weight_ndim == 2 if weight_ndim is not None else _kind(module_type) in GEMM_TYPES
        if not has_weight or not gemm:
            return (f"nvfp4 is for weight GEMMs (2-D weights: {', '.join(GEMM_TYPES)}): a {_kind(module_type)} layer "
                    f"{'has no weight quantizer' if not has_weight else 'is not a GEMM'}; TensorRT's FP4 kernels "
                    "are GEMMs (Model Optimizer's NVFP4 recipes quantize Linear layers only).")
    return None


def descriptors_for(precision: Precision | str, module_type: str, *, has_weight: bool = True,
                    weight_ndim: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                    fp8_weight_per_channel: bool = True,
                    base_input: Mapping[str, Any] | None = None,
                    base_weight: Mapping[str, Any] | None = None,
                    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The input and weight descriptor fields (:meth:`QuantDescriptor.dict` form) of a ``module_type`` layer
    in ``precision``; None for a role the layer has no quantizer for (``has_weight``) or for ``float``.

    ``base_input``/``base_weight`` (the layer's current fields) keep what the precision does not decide,
    such as the calibration method; the fields a precision decides (bits, axis, block, on/off, and the
    integer-only unsigned/narrow range for FP8) are replaced.

    Raises:
        ValueError: the precision does not apply to this layer type (int4w on a Conv2d), or a bad block size.
    """
    precision = parse_precision(precision)
    why_not = applies_to(precision, module_type, has_weight=has_weight, weight_ndim=weight_ndim)
    if why_not:
        raise ValueError(why_not)
    if precision is Precision.FLOAT:
        return None, None
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
    channel_axis = output_channel_axis(module_type)
    # Hugging Face's Conv1D keeps its weight [in, out]: its output channels are axis 1
    if _kind(module_type) == "Conv1D":
        channel_axis = 1
    decided = ("num_bits", "axis", "block_size", "enabled", "unsigned", "narrow_range", "name", "amax")

    def start(base: Mapping[str, Any] | None) -> dict[str, Any]:
        return {key: value for key, value in (base or {}).items() if key not in decided}

    inputs = start(base_input)
    weight = start(base_weight) if has_weight else None
    if precision is Precision.INT8:
        inputs.update(num_bits=8)
        if weight is not None:
            weight.update(num_bits=8, axis=channel_axis)
    elif precision is Precision.FP8:
        # FP8 amax is max by default (as Model Optimizer's FP8 recipe): E4M3's exponent keeps small values
        # precise, so clipping outliers buys little; histogram methods stay available as a hand edit
        inputs.update(num_bits=list(E4M3_BITS))
        inputs.pop("calib_method", None)
        if weight is not None:
            weight.update(num_bits=list(E4M3_BITS))
            if fp8_weight_per_channel:
                weight["axis"] = channel_axis
    elif precision is Precision.NVFP4:
        # the amax calibrated is the global (per-tensor) one; block scales come from each block's max, of the
        # weight at export and of the activation at run time: max calibration, as Model Optimizer's recipe
        inputs.update(num_bits=list(E2M1_BITS), block_size=NVFP4_BLOCK_SIZE)
        inputs.pop("calib_method", None)
        if weight is not None:
            weight.update(num_bits=list(E2M1_BITS), axis=channel_axis, block_size=NVFP4_BLOCK_SIZE)
            weight.pop("calib_method", None)
    else:  # INT4W: weights blockwise by max (calibrated), inputs left in float by the descriptor itself
        inputs.update(num_bits=8, enabled=False)
        inputs.pop("calib_method", None)
        assert weight is not None
        weight.update(num_bits=4, axis=channel_axis, block_size=block_size)
        if weight.get("calib_method") == "histogram":  # no per-block histograms: max (or the mse search)
            weight.pop("calib_method")
    return inputs, weight


def _bits(fields: Mapping[str, Any] | None) -> Any:
    if fields is None:
        return None
    bits = fields.get("num_bits", 8)
    return tuple(bits) if isinstance(bits, (list, tuple)) else bits


def precision_of(input_desc: Mapping[str, Any] | None, weight_desc: Mapping[str, Any] | None,
                 quantize: bool = True) -> Precision | None:
    """The precision that a layer's descriptors and quantize flag amount to; None for a combination that
    is none of them ("custom", e.g. 4-bit per-channel weights or 8-bit inputs with FP8 weights).

    ``input_desc``/``weight_desc`` are the fields in use (override or the type's default); None for a
    role the layer has no quantizer for.
    """
    if not quantize:
        return Precision.FLOAT
    input_on = input_desc is not None and input_desc.get("enabled", True)
    weight_on = weight_desc is not None and weight_desc.get("enabled", True)
    if not input_on and not weight_on:
        return Precision.FLOAT
    in_bits, w_bits = _bits(input_desc) if input_on else None, _bits(weight_desc) if weight_on else None
    if not input_on:
        if w_bits == 4 and weight_desc.get("block_size") is not None:  # type: ignore[union-attr]
            return Precision.INT4W
        return None
    no_weight = weight_desc is None  # a layer without a weight quantizer (pooling, an add) reads from its input
    if in_bits == E2M1_BITS and not no_weight and w_bits == E2M1_BITS:
        return Precision.NVFP4
    if in_bits == E4M3_BITS and (no_weight or w_bits == E4M3_BITS):
        return Precision.FP8
    if in_bits == 8 and (no_weight or (w_bits == 8 and weight_desc.get("block_size") is None)):  # type: ignore[union-attr]
        return Precision.INT8
    return None


def mix_label(precisions: Any) -> str:
    """What a model's mix of precisions is called in "output SQNR <label> vs FP32": the quantized precisions' labels
    in the registry's order, joined ("INT8", "FP8", "FP8+INT4 W", "INT8+custom"); "float" when nothing is
    quantized. ``precisions``: the layers' precisions (None: custom descriptors)."""
    present = set(precisions)
    labels = [info.label for p, info in PRECISIONS.items() if p in present and p is not Precision.FLOAT]
    if None in present:
        labels.append("custom")
    return "+".join(labels) or "float"


def grid_levels(num_bits: Any, amax: float, *, unsigned: bool = False) -> np.ndarray:
    """The non-negative values a quantizer of ``num_bits`` (8, 4, or ``(4, 3)`` for E4M3) can output with
    ``amax``: ``k * amax / max_bound`` on an integer grid, the E4M3 values scaled by ``amax / 448`` on FP8
    (dense near 0, coarse near amax). For drawing a format's grid under a histogram."""
    if isinstance(num_bits, (list, tuple)) and tuple(num_bits) == E2M1_BITS:  # a block whose max is amax
        return np.array(E2M1_LEVELS, dtype=np.float64) * (amax / E2M1_MAX)
    if isinstance(num_bits, (list, tuple)):
        if tuple(num_bits) != E4M3_BITS:
            raise ValueError(f"no grid for num_bits={num_bits!r}")
        values = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
        return values * (amax / E4M3_MAX)
    max_bound = 2 ** (int(num_bits) - 1 + int(unsigned)) - 1
    return np.arange(max_bound + 1, dtype=np.float64) * (amax / max_bound)


def precision_label(precision: Precision | None) -> str:
    """The text a table shows: ``int8``, ``fp8``, ``int4w``, ``float`` or ``custom``."""
    return "custom" if precision is None else precision.value


def layer_weight_bytes(precision: Precision | None, weight_shape: tuple[int, ...] | None, *,
                       channel_axis: int = 0, block_size: int = DEFAULT_BLOCK_SIZE,
                       per_channel: bool = True) -> int:
    """Bytes a layer's weight takes in ``precision``, scales included (float32 each): INT8/FP8 one byte per
    element plus a scale per output channel (or one), INT4 half a byte per element plus a scale per block, NVFP4
    half a byte per element plus an FP8 scale per block of 16 and one float32 global scale,
    float four bytes per element. None (custom) counts as float. 0 without a weight."""
    if not weight_shape:
        return 0
    numel = 1
    for size in weight_shape:
        numel *= int(size)
    if precision in (None, Precision.FLOAT):
        return 4 * numel
    channels = int(weight_shape[channel_axis]) if per_channel else 1
    if precision in (Precision.INT8, Precision.FP8):
        return numel + SCALE_BYTES * channels
    if precision is Precision.NVFP4:  # FP4 values, an FP8 scale per block of 16 inputs, one FP32 global scale
        inner = numel // int(weight_shape[channel_axis])
        blocks = int(weight_shape[channel_axis]) * blocks_of(inner, NVFP4_BLOCK_SIZE)
        return (numel + 1) // 2 + FP8_SCALE_BYTES * blocks + SCALE_BYTES
    # INT4W: two elements per byte (TensorRT and ONNX pack int4 so), a scale per (channel, block)
    inner = numel // int(weight_shape[channel_axis])
    scales = int(weight_shape[channel_axis]) * blocks_of(inner, block_size)
    return (numel + 1) // 2 + SCALE_BYTES * scales


def weight_bytes(model: nn.Module, mix: Mapping[str, Precision | None], *,
                 block_size: int | Mapping[str, int] = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes of every parameter of ``model`` when the layers named in ``mix`` hold their ``weight`` in the
    given precision; everything else (biases, norms, layers not in ``mix``) counts as float32.

    ``block_size`` is one size for every int4w layer or a size per layer name. Tied parameters count once.
    """
    modules = dict(model.named_modules())
    counted: set[int] = set()
    total = 0
    for name, precision in mix.items():
        module = modules.get(name)
        weight = getattr(module, "weight", None) if module is not None else None
        if not isinstance(weight, nn.Parameter) or id(weight) in counted:
            continue
        counted.add(id(weight))
        kind = type(module).__name__
        axis = 1 if _kind(kind) == "Conv1D" else output_channel_axis(kind)
        size = block_size.get(name, DEFAULT_BLOCK_SIZE) if isinstance(block_size, Mapping) else block_size
        total += layer_weight_bytes(precision, tuple(weight.shape), channel_axis=axis, block_size=size)
    for parameter in model.parameters():
        if id(parameter) not in counted:
            counted.add(id(parameter))
            total += 4 * parameter.numel()
    return total
