"""Measuring the quantized model as session jobs: the metric, sensitivity ranking, fallback search and
evaluation on the evaluation data; rankings and searches are kept in the project.

Functions of a :class:`~workbench.session.Session` (its methods call them), like
:mod:`workbench.session.tensorrt`. :mod:`workbench.analysis` is imported when a job runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.project import FallbackRecord, SensitivityRecord
from workbench.project.model import now_iso
from workbench.quant.calibrate import CancelToken, ProgressCallback
from workbench.quant.distributed import DistContext
from workbench.session.build import layer_of
from workbench.session.events import SessionEvent

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["project_metric", "resolve_metric", "analysis_batches", "sensitivity", "latest_sensitivity", "fallback",
           "apply_fallback", "layers_of", "latest_fallback", "evaluate"]


def project_metric(session: Session):
    """The project's metric setting as a workbench.analysis Metric."""
    setting = session.settings.metric
    return resolve_metric(session, setting.name, setting.direction)


def resolve_metric(session: Session, metric: Any, direction: str | None = None):
    """A metric by name, entry point or object; a metric file next to the project is found from any
    working directory, and user code runs only with the session's trust."""
    from workbench.analysis import get_metric

    return get_metric(metric, direction, trust_code=session.trust_code, base_dir=session.base_dir)


def analysis_batches(session: Session) -> list:
    """Every batch of the evaluation data (the analyses pass over them more than once)."""
    return list(session.data("evaluation").batches())


def sensitivity(session: Session, *, scheme: str = "one-off", metric: Any = None, units: Any = None,
                num_batches: int | None = None, progress: ProgressCallback | None = None,
                cancel: CancelToken | None = None, context: DistContext | None = None):
    """Rank layers by what quantizing them costs; the ranking is appended to the project."""
    from workbench.analysis import sensitivity as run_sensitivity

    context = session._join(context)
    model = session._require_calibrated()
    result = run_sensitivity(model, analysis_batches(session), metric if metric is not None else session.metric(),
                             scheme=scheme, units=units, num_batches=num_batches, progress=progress,
                             cancel=cancel, output=session.settings.output, context=context)
    records = session.project.sensitivity
    records.append(SensitivityRecord(session.project.next_id(records), now_iso(), result.to_dict()))
    session._changed(SessionEvent.SENSITIVITY)
    return result


def latest_sensitivity(session: Session):
    """The last ranking stored in the project (None if there was none)."""
    from workbench.analysis import SensitivityResult

    if not session.project.sensitivity:
        return None
    return SensitivityResult.from_dict(session.project.sensitivity[-1].data)


def fallback(session: Session, *, tolerance: float | None = None, target: float | None = None,
             max_units: int | None = None, metric: Any = None, apply: bool = False, use_ranking: bool = True,
             progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
             context: DistContext | None = None):
    """Search the layers to leave in float; the search is appended to the project (and applied with ``apply``)."""
    from workbench.analysis import fallback_search

    context = session._join(context)
    model = session._require_calibrated()
    ranking = session.latest_sensitivity() if use_ranking else None
    result = fallback_search(model, analysis_batches(session), metric if metric is not None else session.metric(),
                             tolerance=tolerance, target=target, max_units=max_units, ranking=ranking,
                             apply=False, progress=progress, cancel=cancel,
                             output=session.settings.output, context=context,
                             # fusion-aware: no INT8 layer left alone between float ones (lint would flag it)
                             layer_order=list(session.project.layers),
                             precisions={name: precision.value if precision is not None else "custom"
                                         for name, precision in session.precisions().items()})
    record = FallbackRecord(session.project.next_id(session.project.fallbacks), now_iso(), result.to_dict())
    session.project.fallbacks.append(record)
    if apply:
        session.apply_fallback(result)
        record.applied = True
    session._changed(SessionEvent.FALLBACK, applied=apply)
    return result


def apply_fallback(session: Session, result: Any) -> list[str]:
    """Leave the layers of ``result`` (a FallbackResult, or units / layer names) in float."""
    names: list[str] = []
    for unit in getattr(result, "chosen", result):
        names += session.layers_of(unit)
    names = list(dict.fromkeys(names))
    session.set_quantize(names, False)
    latest = session.project.fallbacks[-1] if session.project.fallbacks else None
    chosen = getattr(result, "chosen", None)
    if latest is not None and chosen is not None and [getattr(u, "name", u) for u in chosen] == \
            [unit.get("name") if isinstance(unit, dict) else unit for unit in latest.data.get("chosen") or []]:
        latest.applied = True  # reopened, the search shows as applied (its Apply is done)
        session._changed(SessionEvent.FALLBACK, applied=True)
    return names


def layers_of(session: Session, unit: Any) -> list[str]:
    """The project's quantizable layers a unit (a Unit, a UnitResult or a name) switches."""
    quantizers = getattr(unit, "quantizers", None)
    layers = [layer_of(q)[0] for q in quantizers] if quantizers else [getattr(unit, "name", unit)]
    return [layer for layer in dict.fromkeys(layers) if layer in session.project.layers]


def latest_fallback(session: Session):
    """The last fallback search stored in the project (None if there was none)."""
    from workbench.analysis import FallbackResult
    from workbench.analysis.results import FALLBACK_FORMAT

    # ladder searches are stored beside fallback searches: the latest of this kind
    record = next((r for r in reversed(session.project.fallbacks) if r.data.get("format") == FALLBACK_FORMAT), None)
    if record is None:
        return None
    result = FallbackResult.from_dict(record.data)
    # applied, and still so: every layer it chose is in float now (a later edit may have quantized one again)
    layers = [name for unit in result.chosen for name in layers_of(session, unit)]
    result.applied = record.applied and all(not session.project.layers[name].quantize for name in layers)
    return result


def latest_ladder(session: Session):
    """The last ladder search stored in the project (None if there was none)."""
    from workbench.analysis.ladder import LADDER_FORMAT, LadderResult

    record = next((r for r in reversed(session.project.fallbacks) if r.data.get("format") == LADDER_FORMAT), None)
    return None if record is None else LadderResult.from_dict(record.data)


def evaluate(session: Session, metric: Any = None, num_batches: int | None = None, *,
             progress: ProgressCallback | None = None, cancel: CancelToken | None = None):
    """FP32 and INT8 values of the metric on the evaluation data; the project is not changed."""
    from workbench.analysis import evaluate_models

    model = session._require_calibrated()
    chosen = session.metric() if metric is None else resolve_metric(session, metric)
    batches = analysis_batches(session)
    if num_batches:
        batches = batches[:num_batches]
    return evaluate_models(session.float_model, model, batches, chosen, progress=progress, cancel=cancel,
                           output=session.settings.output)
