"""What TensorRT's explicit (Q/DQ) quantization can build, as rules on a quantizer's descriptor.

One place for these rules: the session checks a descriptor against them when it is set (CLI ``set``
and the GUI's descriptor editor), and the QDQ export checks every quantizer against them again.

* Weights: per-tensor, or per output channel: axis 0 for Conv/Linear (and other weighted layers),
  axis 1 for ConvTranspose (its weight is ``[in, out / groups, *kernel]``) and Hugging Face's Conv1D
  (``[in, out]``).
* Activations (inputs of layers and functional operations): per-tensor.
* Formats: INT8, FP8 E4M3 (``num_bits=(4, 3)``), and INT4 weights in blocks along the input dimension
  (``block_size``; weight-only GEMMs). Other widths (say 4-bit per-channel weights) still simulate,
  calibrate and fine-tune: they are accepted, marked "sim only", and refused only by the export.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TensorRTCheck", "SIM_ONLY", "INT8_CHANNEL_ALIGNMENT", "INT4_BLOCK_SIZES", "output_channel_axis",
           "tensorrt_check", "misaligned_channels", "int4_block_problem", "int4_block_for", "gemm_input_features"]

SIM_ONLY = "sim only"  # the mark a model tree and ``workbench show`` put on a non-8-bit quantizer

# INT8 tensor-core convolutions work on channel vectors of this many; other counts are padded (wasted work)
INT8_CHANNEL_ALIGNMENT = 16
# INT4 weight-only block quantization: the block sizes NVIDIA's TensorRT documentation lists ("block size 64 or
# 128" for INT4 weight-only quantization, the blocks along the GEMM's input dimension, K), largest first; a block
# must divide the layer's input features
INT4_BLOCK_SIZES = (128, 64)
# an image's channels (grey, RGB, RGBA): TensorRT runs such a first layer with kernels made for a few input
# channels (padded to 4), so its input side costs little and is no hazard to report
_IMAGE_CHANNELS = 4


@dataclass(frozen=True)
class TensorRTCheck:
    """The verdict on one quantizer: ``error`` (TensorRT cannot build it: refuse it) or ``sim_only`` (it
    simulates, but INT8 QDQ export will refuse it); both None when TensorRT takes it as it is."""

    error: str | None = None
    sim_only: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# layer types whose weight is stored [in, out, ...]: ConvTranspose, and Hugging Face's Conv1D (a transposed Linear;
# not torch's Conv1d, whose weight is [out, in, k])
_OUT_ON_AXIS_1 = {"Conv1D": "[in, out]"}


def output_channel_axis(module_type: str) -> int:
    """The weight axis that holds a layer's output channels: 1 for ConvTranspose and Hugging Face's Conv1D,
    0 for every other."""
    kind = module_type.removeprefix("Quant")
    return 1 if kind.startswith("ConvTranspose") or kind in _OUT_ON_AXIS_1 else 0


def _weight_layout(kind: str) -> str:
    return _OUT_ON_AXIS_1.get(kind, "[in, out, *kernel]")


def gemm_input_features(weight_shape: tuple[int, ...] | None, module_type: str) -> int | None:
    """The input features (K) of a 2-D GEMM weight: ``[out, in]`` for Linear, ``[in, out]`` for Hugging Face's
    Conv1D; None for any other weight."""
    if weight_shape is None or len(weight_shape) != 2:
        return None
    return int(weight_shape[0] if output_channel_axis(module_type) == 1 else weight_shape[1])


def int4_block_problem(block_size: int, in_features: int | None = None) -> str | None:
    """Why TensorRT cannot build INT4 weight-only blocks of ``block_size`` on a GEMM of ``in_features`` inputs
    (a sentence naming the sizes it takes), or None."""
    allowed = " or ".join(str(size) for size in sorted(INT4_BLOCK_SIZES))
    if block_size not in INT4_BLOCK_SIZES:
        return (f"TensorRT builds INT4 weight-only blocks of {allowed} elements, not {block_size}.")
    if in_features is not None and in_features % block_size:
        fits = [str(size) for size in sorted(INT4_BLOCK_SIZES) if in_features % size == 0]
        fix = (f"use a block of {' or '.join(fits)}" if fits else
               f"no block size it takes ({allowed}) divides them: run the layer in int8, fp8 or float")
        return (f"a block of {block_size} does not divide the layer's {in_features} input features, and TensorRT "
                f"needs whole blocks: {fix}.")
    return None


def int4_block_for(in_features: int | None) -> int | None:
    """The largest INT4 block TensorRT takes (:data:`INT4_BLOCK_SIZES`) that divides ``in_features`` (unknown:
    the largest); None when none does."""
    if in_features is None:
        return INT4_BLOCK_SIZES[0]
    return next((size for size in INT4_BLOCK_SIZES if in_features % size == 0), None)


def tensorrt_check(role: str, num_bits: Any, axis: Any, module_type: str, *,
                   block_size: int | None = None, in_features: int | None = None,
                   block_sizes: bool = True) -> TensorRTCheck:
    """Check one quantizer of a ``module_type`` layer (``Conv2d`` or ``QuantConv2d``) in ``role`` ("input"
    or "weight") with ``num_bits``, ``axis`` (None: per-tensor) and ``block_size`` against what TensorRT
    builds: INT8 and FP8 E4M3 (``(4, 3)``) activations per-tensor and weights per-tensor or per output
    channel; INT4 weights blockwise (weight-only GEMMs) in blocks of :data:`INT4_BLOCK_SIZES` that divide the
    layer's ``in_features`` (when given; ``block_sizes=False`` leaves the block size to the lint, for an export of
    a project that has one already).

    The error and the sim-only note are whole sentences that say why, for the user.
    """
    if isinstance(axis, (list, tuple)) and len(axis) == 1:
        axis = axis[0]
    if isinstance(num_bits, list):
        num_bits = tuple(num_bits)
    kind = module_type.removeprefix("Quant")
    if num_bits == (2, 1):  # NVFP4 (see workbench.quant.nvfp4)
        return _nvfp4_check(role, axis, kind, block_size)
    if block_size is not None:
        if role != "weight":
            return TensorRTCheck(error=f"TensorRT takes blockwise scales for weights only, not for the {kind} input.")
        if num_bits != 4:
            return TensorRTCheck(sim_only=(
                f"blockwise {num_bits}-bit weights are for simulation only ({SIM_ONLY}): TensorRT builds "
                "blockwise scales for INT4 weights (weight-only GEMMs)."))
        problem = int4_block_problem(int(block_size), in_features) if block_sizes else None
        return TensorRTCheck(error=problem) if problem else TensorRTCheck()
    if role == "weight":
        wanted = 1 if kind == "Conv1D" else output_channel_axis(module_type)
        if axis is not None and axis != wanted:
            return TensorRTCheck(error=(
                f"TensorRT takes {kind} weights per-tensor (axis=none) or per output channel (axis={wanted}), "
                f"not axis={axis!r}: "
                f"{f'its weight is {_weight_layout(kind)}' if wanted else 'the output channels are axis 0'}."))
    elif axis is not None:
        return TensorRTCheck(error=(
            f"TensorRT takes activations (the {kind} input) per-tensor only (axis=none), not axis={axis!r}: "
            "a per-channel activation scale cannot be built into an INT8 engine."))
    if num_bits not in (8, (4, 3)):
        what = f"{num_bits}-bit" if isinstance(num_bits, int) else f"num_bits={tuple(num_bits)!r}"
        return TensorRTCheck(sim_only=(
            f"{what} {role}s are for simulation and fine-tuning only ({SIM_ONLY}): QDQ export for TensorRT "
            "needs INT8, FP8 E4M3 (4, 3), or INT4 weights in blocks (block_size), and will refuse this layer."))
    return TensorRTCheck()


NVFP4_GEMM_KINDS = ("Linear", "Conv1D")  # TensorRT's FP4 kernels are GEMMs


def _nvfp4_check(role: str, axis: Any, kind: str, block_size: int | None) -> TensorRTCheck:
    """NVFP4: FP4 E2M1 in blocks of 16 along the input features of a GEMM (TensorRT 10.8+, Blackwell)."""
    if kind not in NVFP4_GEMM_KINDS:
        return TensorRTCheck(error=(
            f"NVFP4 (FP4 E2M1) is built by TensorRT for GEMMs ({', '.join(NVFP4_GEMM_KINDS)}), not for a {kind} "
            "layer: run it in int8 or fp8."))
    if block_size != 16:
        return TensorRTCheck(sim_only=(
            f"FP4 E2M1 in blocks of {block_size} is for simulation only ({SIM_ONLY}): TensorRT's NVFP4 takes "
            "blocks of 16 (an FP8 scale per 16 values)."))
    if role == "weight":
        wanted = 1 if kind == "Conv1D" else 0
        if axis != wanted:
            return TensorRTCheck(error=(
                f"NVFP4 {kind} weights keep their output channels on axis {wanted} (blocks run along the input "
                f"features), not axis={axis!r}."))
    elif axis is not None:
        return TensorRTCheck(error=(
            f"NVFP4 activations (the {kind} input) are scaled per block of their last dimension at run time "
            f"with one global scale (axis=none), not axis={axis!r}."))
    return TensorRTCheck()


def misaligned_channels(in_channels: int, out_channels: int, *, output_is_result: bool = False) -> str | None:
    """Why an INT8 convolution from ``in_channels`` to ``out_channels`` wastes tensor-core work, or None.

    The one rule for ``workbench lint`` (before building) and the engine report (after): counts that are
    not multiples of :data:`INT8_CHANNEL_ALIGNMENT` are padded. The input side of a layer reading an image
    (at most 4 channels) is not counted: TensorRT has first-layer kernels for it; nor is the output side of a
    layer that writes the network's result (``output_is_result``: a 1000-class head), which the task fixes.
    """
    sides = [count for count, exempt in ((in_channels, in_channels <= _IMAGE_CHANNELS),
                                         (out_channels, output_is_result))
             if not exempt and count % INT8_CHANNEL_ALIGNMENT]
    if not sides:
        return None
    return (f"{in_channels} -> {out_channels} channels are not multiples of {INT8_CHANNEL_ALIGNMENT}: INT8 "
            "tensor-core kernels pad them (wasted work)")
