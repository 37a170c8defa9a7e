"""The precision registry: the formats a layer can run in, their labels and one-line descriptions, and the few
constants every menu, ``--help`` and check reads (how FP8 Q/DQ is written, INT4 blocks and their amax method).

Light on purpose (no torch): ``workbench set --help`` and ``calibrate --help`` read it without loading the core.
What a precision means for a layer's descriptors and sizes is in :mod:`workbench.quant.algorithms.precision`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from workbench.quant.descriptor import E2M1, NVFP4_BLOCK_SIZE

__all__ = ["Precision", "PrecisionInfo", "PRECISIONS", "DEFAULT_BLOCK_SIZE", "E4M3_BITS", "SCALE_BYTES", "GEMM_TYPES",
           "FP8_OPS", "BLOCK_METHODS", "DEFAULT_BLOCK_METHOD", "parse_precision", "precision_choices_text", "E2M1_BITS",
           "FP8_SCALE_BYTES", "NVFP4_BLOCK_SIZE"]

# how FP8 Q/DQ is written: standard QuantizeLinear to float8e4m3fn (opset 19; TensorRT 10+), or TensorRT's
# custom ops TRT_FP8QuantizeLinear/TRT_FP8DequantizeLinear (pytorch-quantization's form; TensorRT 8.6 and 9)
FP8_OPS = ("standard", "trt")
DEFAULT_BLOCK_SIZE = 128  # INT4 weight-only: elements per scale along the input dimension
BLOCK_METHODS = ("max", "mse")  # how a block's amax is chosen: its max, or the max shrunk to the least squared error
DEFAULT_BLOCK_METHOD = "max"    # the one pytorch-quantization and Model Optimizer use; mse costs a search per block
E4M3_BITS = (4, 3)  # pytorch-quantization's num_bits for FP8 E4M3
E2M1_BITS = E2M1  # FP4 E2M1 values of NVFP4 (Model Optimizer's num_bits for it)
FP8_SCALE_BYTES = 1  # NVFP4's block scales are FP8 E4M3
SCALE_BYTES = 4  # a float32 scale per channel or block, as the exported ONNX initializers hold them

# Layer types (without the Quant prefix) whose weight is a 2-D GEMM operand: INT4 weight-only applies to them.
# Hugging Face's Conv1D (GPT-2) is a Linear with its weight stored [in, out].
GEMM_TYPES = ("Linear", "Conv1D")


class Precision(str, Enum):
    """The format a layer runs in. Cost order, cheapest first, is the order of the members' use in a
    ladder only when the user gives no order of their own."""

    INT8 = "int8"
    FP8 = "fp8"
    INT4W = "int4w"
    NVFP4 = "nvfp4"
    FLOAT = "float"

    def __str__(self) -> str:
        return self.value

    @property
    def info(self) -> PrecisionInfo:
        return PRECISIONS[self]


@dataclass(frozen=True)
class PrecisionInfo:
    """What one precision is, for menus, ``--help`` and sizes."""

    precision: Precision
    label: str  # short, for a table cell or a menu entry
    description: str  # one line
    weight_bits: int  # bits per weight element (scales counted apart, see layer_weight_bytes)
    quantizes_inputs: bool
    needs_weight_gemm: bool  # only layers whose weight is a 2-D GEMM operand (Linear, Conv1D)


PRECISIONS: dict[Precision, PrecisionInfo] = {
    Precision.INT8: PrecisionInfo(Precision.INT8, "INT8", "INT8 inputs (per-tensor) and weights (per output "
                                  "channel): every TensorRT GPU", 8, True, False),
    Precision.FP8: PrecisionInfo(Precision.FP8, "FP8", "FP8 E4M3 inputs (per-tensor) and weights (per output "
                                 "channel or per-tensor): Ada/Hopper or newer, TensorRT 8.6+", 8, True, False),
    Precision.INT4W: PrecisionInfo(Precision.INT4W, "INT4 W", f"INT4 weights only, blockwise along the input "
                                   f"(block {DEFAULT_BLOCK_SIZE}), inputs in float: GEMMs, TensorRT 10+", 4, False,
                                   True),
    Precision.NVFP4: PrecisionInfo(Precision.NVFP4, "NVFP4", f"FP4 E2M1 inputs (scaled per block at run time) and "
                                   f"weights, blocks of {NVFP4_BLOCK_SIZE} with FP8 scales and an FP32 global scale: "
                                   "GEMMs, Blackwell, TensorRT 10.8+", 4, True, True),
    Precision.FLOAT: PrecisionInfo(Precision.FLOAT, "float", "not quantized: runs in the engine's float "
                                   "precision", 32, False, False),
}


def parse_precision(text: str | Precision) -> Precision:
    """``"fp8"`` (any case) -> Precision.FP8; ValueError naming the choices otherwise."""
    if isinstance(text, Precision):
        return text
    try:
        return Precision(str(text).strip().lower())
    except ValueError:
        raise ValueError(f"unknown precision {text!r}; the precisions are "
                         f"{', '.join(p.value for p in Precision)}.") from None


def precision_choices_text() -> str:
    """``int8: ...; fp8: ...`` for ``--help`` texts."""
    return "; ".join(f"{p.value}: {info.description}" for p, info in PRECISIONS.items())
