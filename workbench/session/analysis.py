"""Measuring the quantized model as session jobs: the metric, sensitivity ranking, fallback search and
evaluation on the evaluation data; rankings and searches are kept in the project.

Functions of the models, batches, metric and project they are given; they return results and the records
the :class:`~workbench.session.Session` keeps (its methods call them, append the records and tell the
front ends). :mod:`workbench.analysis` is imported when a job runs.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from workbench.project import FallbackRecord, Project, SensitivityRecord
from workbench.project.model import now_iso
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.distributed import DistContext
from workbench.session.build import layer_of
from workbench.session.errors import SessionError
from workbench.sources.data_source import DataSource

T = TypeVar("T")

__all__ = ["resolve_metric", "analysis_batches", "sensitivity", "block_sensitivity", "latest_sensitivity", "fallback",
           "block_fallback", "walk_options", "refuse_for_blocks", "blocks_refused",
           "fallback_layers", "is_latest_fallback", "layers_of", "latest_fallback", "latest_ladder", "evaluate"]


def resolve_metric(metric: Any, direction: str | None = None, *, trust_code: bool, base_dir: Path):
    """A metric by name, entry point or object; a metric file next to the project (in ``base_dir``) is found
    from any working directory, and user code runs only with ``trust_code``."""
    from workbench.analysis import get_metric

    return get_metric(metric, direction, trust_code=trust_code, base_dir=base_dir)


def analysis_batches(source: DataSource) -> list:
    """Every batch of the evaluation data ``source`` (the analyses pass over them more than once)."""
    return list(source.batches())


def sensitivity(model: nn.Module, batches: list, metric: Any, project: Project, *, scheme: str = "one-off",
                units: Any = None, num_batches: int | None = None, output: Any = None,
                progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                context: DistContext | None = None) -> tuple[Any, SensitivityRecord]:
    """Rank ``model``'s layers by what quantizing them costs on ``batches``; returns the ranking and the record
    to append to ``project``'s sensitivity runs."""
    from workbench.analysis import sensitivity as run_sensitivity

    result = run_sensitivity(model, batches, metric, scheme=scheme, units=units, num_batches=num_batches,
                             progress=progress, cancel=cancel, output=output, context=context)
    return result, SensitivityRecord(project.next_id(project.sensitivity), now_iso(), result.to_dict())


def block_sensitivity(model: nn.Module, batches: list, project: Project, *, units: Any = None,
                      num_batches: int | None = None, residency: Any = None, device: torch.device | None = None,
                      progress: ProgressCallback | None = None,
                      cancel: CancelToken | None = None) -> tuple[Any, SensitivityRecord]:
    """Rank ``model``'s units one block at a time by their block's output SQNR (see
    :func:`workbench.analysis.block_sensitivity.block_sensitivity`); returns the ranking and its record."""
    from workbench.analysis.block_sensitivity import block_sensitivity as run_block_sensitivity

    result = run_block_sensitivity(model, batches, units=units, num_batches=num_batches, residency=residency,
                                   device=device, progress=progress, cancel=cancel)
    return result, SensitivityRecord(project.next_id(project.sensitivity), now_iso(), result.to_dict())


def latest_sensitivity(project: Project):
    """The last ranking stored in the project (None if there was none)."""
    from workbench.analysis import SensitivityResult

    if not project.sensitivity:
        return None
    return SensitivityResult.from_dict(project.sensitivity[-1].data)


def _device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def fallback(model: nn.Module, batches: list, metric: Any, project: Project, *, tolerance: float | None = None,
             target: float | None = None, max_units: int | None = None, ranking: Any = None, output: Any = None,
             progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
             context: DistContext | None = None, on_partial: Any = None) -> tuple[Any, FallbackRecord]:
    """Search the layers to leave in float; returns the search and the record to append to ``project``'s
    fallback searches (the caller applies it when asked). ``on_partial(result)``: the search so far, after each
    measurement."""
    from workbench.analysis import fallback_search
    from workbench.session.decisions import precisions

    # fusion-aware: no INT8 layer left alone between float ones (the lint would flag it)
    mix = {name: precision.value if precision is not None else "custom"
           for name, precision in precisions(project, model).items()}
    from workbench.session.ladder import data_flow, gemm_layers

    # producers and consumers from one recorded forward (module order is not the data flow)
    flow = data_flow(model, project.layers, batches[0] if batches else None, _device_of(model))
    result = fallback_search(model, batches, metric, tolerance=tolerance, target=target, max_units=max_units,
                             ranking=ranking, apply=False, progress=progress, cancel=cancel, output=output,
                             context=context, layer_order=list(project.layers), precisions=mix, neighbours=flow,
                             gemms=gemm_layers(model, project.layers), on_partial=on_partial)
    return result, FallbackRecord(project.next_id(project.fallbacks), now_iso(), result.to_dict())


def refuse_for_blocks(what: str, metric: Any, context: DistContext | None) -> None:
    """Refuse what a search one block at a time cannot take: a metric (it measures the output SQNR), ranks."""
    if metric is not None:
        raise SessionError(f"{what} one block at a time measures the model output's SQNR, block by block; it takes "
                           "no metric: search without --sequential to use one.")
    if context is not None and context.distributed:
        raise SessionError(f"{what} one block at a time runs in one process (it walks the blocks in order): search "
                           "without --workers, or without --sequential.")


def blocks_refused(job: Callable[[], T]) -> T:
    """``job()``, with a model without repeated blocks (a ValueError naming why) refused as a SessionError."""
    try:
        return job()
    except ValueError as error:
        raise SessionError(str(error)) from None


def walk_options(*, residency: Any, device: torch.device | None, output: Any,
                 progress: ProgressCallback | None, cancel: CancelToken | None):
    """What a search one block at a time walks with (:class:`~workbench.analysis.block_search.WalkOptions`)."""
    from workbench.analysis.block_search import WalkOptions

    return WalkOptions(residency=residency, device=device, output=output, progress=progress, cancel=cancel)


def block_fallback(model: nn.Module, batches: list, project: Project, *, tolerance: float | None = None,
                   target: float | None = None, max_units: int | None = None, ranking: Any = None,
                   walk: Any = None) -> tuple[Any, FallbackRecord]:
    """The fallback search one block at a time (:func:`workbench.analysis.block_fallback.block_fallback_search`:
    the model output's SQNR, each unit's cost at its block's output, ``walk`` its residency and device); over the
    units of ``ranking`` when given. Returns the search and its record."""
    from workbench.analysis.block_fallback import block_fallback_search
    from workbench.analysis.fallback import units_from_names
    from workbench.analysis.units import Unit

    candidates = None if ranking is None else units_from_names(
        model, [Unit(u.name, tuple(u.quantizers)) for u in ranking.units])
    result = block_fallback_search(model, batches, tolerance=tolerance, target=target, max_units=max_units,
                                   candidates=candidates, options=walk)
    return result, FallbackRecord(project.next_id(project.fallbacks), now_iso(), result.to_dict())


def fallback_layers(project: Project, result: Any) -> list[str]:
    """The project's layers ``result`` (a FallbackResult, or units / layer names) leaves in float."""
    names: list[str] = []
    for unit in getattr(result, "chosen", result):
        names += layers_of(project, unit)
    return list(dict.fromkeys(names))


def is_latest_fallback(project: Project, result: Any) -> bool:
    """Whether ``result`` is the project's latest stored fallback search (so applying it marks that applied)."""
    latest = project.fallbacks[-1] if project.fallbacks else None
    chosen = getattr(result, "chosen", None)
    return latest is not None and chosen is not None and [getattr(u, "name", u) for u in chosen] == \
        [unit.get("name") if isinstance(unit, dict) else unit for unit in latest.data.get("chosen") or []]


def layers_of(project: Project, unit: Any) -> list[str]:
    """The project's quantizable layers a unit (a Unit, a UnitResult or a name) switches."""
    quantizers = getattr(unit, "quantizers", None)
    layers = [layer_of(q)[0] for q in quantizers] if quantizers else [getattr(unit, "name", unit)]
    return [layer for layer in dict.fromkeys(layers) if layer in project.layers]


def latest_fallback(project: Project):
    """The last fallback search stored in the project (None if there was none)."""
    from workbench.analysis import FallbackResult
    from workbench.analysis.results import FALLBACK_FORMAT

    # ladder searches are stored beside fallback searches: the latest of this kind
    record = next((r for r in reversed(project.fallbacks) if r.data.get("format") == FALLBACK_FORMAT), None)
    if record is None:
        return None
    result = FallbackResult.from_dict(record.data)
    # applied, and still so: every layer it chose is in float now (a later edit may have quantized one again)
    layers = [name for unit in result.chosen for name in layers_of(project, unit)]
    result.applied = record.applied and all(not project.layers[name].quantize for name in layers)
    return result


def latest_ladder(project: Project):
    """The last ladder search stored in the project (None if there was none)."""
    from workbench.analysis.ladder import LADDER_FORMAT, LadderResult

    record = next((r for r in reversed(project.fallbacks) if r.data.get("format") == LADDER_FORMAT), None)
    return None if record is None else LadderResult.from_dict(record.data)


def evaluate(float_model: nn.Module, model: nn.Module, batches: list, metric: Any, *,
             num_batches: int | None = None, output: Any = None, progress: ProgressCallback | None = None,
             cancel: CancelToken | None = None, rounding: str | None = None,
             known: Callable[[list], dict[int, Any]] | None = None):
    """FP32 (``float_model``) and INT8 (``model``) values of ``metric`` on the first ``num_batches`` of
    ``batches``; nothing is changed. ``rounding`` ("onnx" or "pytorch_quantization"; default: each quantizer's
    own) is how ``model``'s quantizers round meanwhile; ``known(batches)`` gives ``model``'s outputs on some of
    those batches by index, computed already in that rounding (an export's parity check), which are not run
    again."""
    from workbench.analysis import evaluate_models
    from workbench.export.reference import rounding as rounding_as
    from workbench.quant.algorithms.snapshot import all_quantizers
    from workbench.quant.kernels.fake_quant import ROUNDINGS

    if rounding is not None and rounding not in ROUNDINGS:
        raise SessionError(f"rounding is one of {', '.join(ROUNDINGS)}, got {rounding!r}.")
    if num_batches:
        batches = batches[:num_batches]
    quantizers = all_quantizers(model) if rounding is not None else []
    with rounding_as(quantizers, rounding):
        return evaluate_models(float_model, model, batches, metric, progress=progress, cancel=cancel, output=output,
                               quantized_outputs=known(batches) if known is not None else None)
