"""Sensitivity analysis and automatic layer fallback: which quantized layers cost the metric, and which
few to leave in float so the INT8 model stays within tolerance of FP32. No Qt here.

    from workbench.analysis import sensitivity, fallback_search
    profile = sensitivity(model, batches, "sqnr", scheme="one-off")
    for unit in profile.ranked()[:5]:
        print(unit.rank, unit.name, unit.value)
    search = fallback_search(model, batches, "top1", tolerance=0.01, ranking=profile)
"""
from workbench.analysis.entry_point import EntryPointError, load_entry_point
from workbench.analysis.errors import AnalysisCancelled, AnalysisError, MetricError
from workbench.analysis.evaluation import Evaluation, evaluate_models
from workbench.analysis.fallback import apply_fallback, fallback_search, units_from_names
from workbench.analysis.metrics import (
    BUILTIN_METRICS,
    DEFAULT_METRIC,
    CosineMetric,
    Direction,
    EntryPointMetric,
    Metric,
    ModelMetric,
    MseMetric,
    OutputMetric,
    SqnrMetric,
    Top1Metric,
    builtin_metric_labels,
    get_metric,
    metric_choices_text,
    metric_from_dict,
)
from workbench.analysis.results import (
    SCHEMES,
    FallbackPoint,
    FallbackResult,
    SensitivityResult,
    UnitResult,
)
from workbench.analysis.sensitivity import sensitivity
from workbench.analysis.units import Unit, find_units, resolve_units
from workbench.quant.snapshot import ModelSnapshot

__all__ = [
    "sensitivity", "fallback_search", "evaluate_models", "Evaluation", "apply_fallback", "units_from_names",
    "Unit", "find_units", "resolve_units",
    "Metric", "OutputMetric", "ModelMetric", "EntryPointMetric", "SqnrMetric", "CosineMetric", "MseMetric",
    "Top1Metric", "Direction", "BUILTIN_METRICS", "DEFAULT_METRIC", "builtin_metric_labels", "metric_choices_text",
    "get_metric", "metric_from_dict", "load_entry_point",
    "SensitivityResult", "UnitResult", "FallbackResult", "FallbackPoint", "SCHEMES",
    "AnalysisError", "MetricError", "AnalysisCancelled", "EntryPointError", "ModelSnapshot",
]
