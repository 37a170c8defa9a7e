"""Smoothing as a session job: which layers SmoothQuant or AWQ applies to, the scales computed on the
calibration data, and the project's records of them (:class:`~workbench.project.model.SmoothingRecord`).

Pure functions: the Session passes in the float model, the batches and the layer decisions, and stores
what they return (no reach into the Session).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from torch import nn

from workbench.project import Project
from workbench.project.model import SmoothingRecord
from workbench.quant.algorithms.calibration_results import CancelToken, ProgressCallback
from workbench.quant.algorithms.precision import DEFAULT_BLOCK_SIZE, Precision
from workbench.quant.algorithms.residency import BlockResidency
from workbench.quant.algorithms.sequential_smoothing import plan_smoothing_sequential
from workbench.quant.algorithms.smoothing import SMOOTHING_METHODS, SmoothingError, is_linear_like, plan_smoothing

__all__ = ["smoothing_layers", "layers_to_smooth", "compute_smoothing", "parse_alpha", "OFF"]

OFF = "off"


def parse_alpha(value: str | float | None) -> float | None:
    """``"off"`` (or None) -> None; a number in [0, 1] -> that number; anything else: SmoothingError."""
    if value is None or (isinstance(value, str) and value.strip().lower() == OFF):
        return None
    try:
        alpha = float(value)
    except (TypeError, ValueError):
        raise SmoothingError(f"SmoothQuant's alpha must be a number in [0, 1] or 'off', got {value!r}.") from None
    if not 0.0 <= alpha <= 1.0:
        raise SmoothingError(f"SmoothQuant's alpha must be in [0, 1] (0.5 is the paper's default), got {alpha:g}.")
    return alpha


def smoothing_layers(quantized: nn.Module, precisions: Mapping[str, Precision | None], method: str) -> list[str]:
    """The layers ``method`` applies to, in model order: Linear layers (Hugging Face's Conv1D too) whose inputs are
    quantized (int8 or fp8: SmoothQuant) or that run INT4 weight-only (int4w: AWQ). ``precisions`` are the layers'
    precisions."""
    if method not in SMOOTHING_METHODS:
        raise SmoothingError(f"Unknown smoothing method {method!r}; choose one of {', '.join(SMOOTHING_METHODS)}.")
    wanted = {Precision.INT4W} if method == "awq" else {Precision.INT8, Precision.FP8}
    return [name for name, module in quantized.named_modules()
            if is_linear_like(module) and precisions.get(name) in wanted]


def layers_to_smooth(project: Project, quantized: nn.Module, precisions: Mapping[str, Precision | None],
                     method: str) -> tuple[list[str], dict[str, int]]:
    """The layers ``method`` smooths now (:func:`smoothing_layers`, less those another method smooths already:
    one smoothing per layer) and each one's INT4 block size."""
    layers = [name for name in smoothing_layers(quantized, precisions, method) if name not in project.smoothing]
    blocks = {name: (project.layers[name].weight_desc or {}).get("block_size", DEFAULT_BLOCK_SIZE) for name in layers}
    return layers, blocks


def compute_smoothing(base: nn.Module, layers: list[str], batches: Iterable, *, method: str, alpha: float,
                      device, block_sizes: Mapping[str, int] | None = None, sequential: bool = False,
                      residency: BlockResidency | None = None, progress: ProgressCallback | None = None,
                      cancel: CancelToken | None = None) -> dict[str, SmoothingRecord]:
    """Smoothing records for ``layers`` of the float model ``base`` (see :func:`plan_smoothing`); AWQ quantizes
    each layer's weight in its own INT4 block size (``block_sizes``, default 128).

    ``sequential`` plans one block at a time (:func:`~workbench.quant.algorithms.sequential_smoothing.
    plan_smoothing_sequential`: the same records, each block's weights loaded and released by ``residency``)."""
    sizes = dict(block_sizes or {})
    batches = list(batches)
    planned = []
    # layers sharing one INT4 block size are planned together (those reading one tensor must share scales)
    for size in sorted(set(sizes.get(name, DEFAULT_BLOCK_SIZE) for name in layers)):
        group = [name for name in layers if sizes.get(name, DEFAULT_BLOCK_SIZE) == size]
        if sequential:
            planned += plan_smoothing_sequential(base, group, batches, method=method, alpha=alpha, device=device,
                                                 block_size=size, residency=residency, progress=progress,
                                                 cancel=cancel)
        else:
            planned += plan_smoothing(base, group, batches, method=method, alpha=alpha, device=device,
                                      block_size=size)
    return {item.layer: SmoothingRecord(item.layer, item.method, float(item.alpha),
                                        item.scales.detach().cpu().numpy().astype(np.float32), item.folded_into,
                                        item.error_before, item.error_after) for item in planned}
