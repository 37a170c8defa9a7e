"""What an engine report says about the precisions the project asked for: a layer the project runs in FP8
or INT4 weight-only that TensorRT ran in another precision, with what that format needs from the GPU.

A separate pass over an :class:`~workbench.engine.report.EngineReport` (the report itself maps engine
layers to modules); :mod:`workbench.quant.algorithms.format_rules` holds the formats' needs.
"""
from __future__ import annotations

from collections.abc import Mapping

from workbench.engine.report import EngineHazard, EngineReport
from workbench.quant.algorithms.format_rules import gpu_requirement

__all__ = ["format_hazards", "EXPECTED_ENGINE_PRECISION"]

# the engine precision (trtexec's format words, workbench.engine.layers.PRECISIONS) each project precision
# should show; INT4 weight-only GEMMs read float activations, so their layer reports the activations' type
EXPECTED_ENGINE_PRECISION = {"int8": ("INT8",), "fp8": ("FP8",), "int4w": ("INT4", "FP16", "BF16", "FP32")}


def format_hazards(report: EngineReport, precisions: Mapping[str, str]) -> list[EngineHazard]:
    """Hazards for the layers asked to run in FP8 (or INT8) that the engine ran in another precision, each with
    what the format needs; ``precisions`` is every layer's precision in the project (``int8``, ``fp8`` ...)."""
    found = []
    for outcome in report.layers:
        asked = precisions.get(outcome.module)
        ran = outcome.engine_precision
        if asked not in ("fp8",) or ran is None or ran in EXPECTED_ENGINE_PRECISION[asked]:
            continue
        found.append(EngineHazard(
            "format_not_built", [outcome.module], outcome.engine_layer or "",
            f"the project runs {outcome.module} in {asked}, TensorRT ran it in {ran}: {gpu_requirement(asked)}. "
            "Build on such a GPU with --stronglyTyped (or --fp8), or choose int8 for this layer."))
    return found
