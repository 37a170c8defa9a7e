"""The ONNX opset bounds and defaults: the one home the project's settings, the exporter, the export dialog and
``--help`` read.

A leaf at the package root (like :mod:`workbench.strict_json`), below every layer, so that the settings can
check an opset without loading the exporter or onnx: only :func:`newest_opset` needs onnx, and imports it when
asked (validating a value inside the bounds never does).
"""
from __future__ import annotations

from typing import Any

__all__ = ["MIN_OPSET", "DEFAULT_OPSET", "TENSORRT_8_MAX_OPSET", "FORMAT_OPSET", "newest_opset", "opset_bounds_text",
           "check_opset"]

MIN_OPSET = 13             # per-channel QuantizeLinear (its axis attribute) needs 13: nothing older carries INT8 Q/DQ
TENSORRT_8_MAX_OPSET = 17  # TensorRT 8.6's ONNX parser stops at 17 (TensorRT 10 reads newer)
DEFAULT_OPSET = TENSORRT_8_MAX_OPSET  # new projects export what every TensorRT since 8.6 reads
# the lowest opset that carries each format's Q/DQ: FP8 needs float8e4m3fn (19), INT4 weights DequantizeLinear's
# block_size (21); an export is raised to what its formats need
FORMAT_OPSET = {"int8": MIN_OPSET, "fp8": 19, "int4": 21, "nvfp4": 23}  # NVFP4: float4e2m1 (23)


def newest_opset() -> int:
    """The newest default-domain opset the installed onnx defines (what the exporter can convert to)."""
    import onnx  # lazily: `workbench calibrate --help` and the settings' checks must not load onnx

    return int(onnx.defs.onnx_opset_version())


def opset_bounds_text() -> str:
    """The valid opsets as a user reads them, e.g. ``an integer from 13 (...) to 23 (...)``."""
    return (f"an integer from {MIN_OPSET} (per-channel QuantizeLinear needs it) to {newest_opset()} (the newest the "
            f"installed onnx writes)")


def check_opset(value: Any) -> int:
    """``value`` when the exporter can write it; ValueError naming the bounds otherwise (booleans are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_OPSET <= value <= newest_opset():
        raise ValueError(f"The ONNX opset must be {opset_bounds_text()}, got {value!r}.")
    return value
