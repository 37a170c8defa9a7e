"""Sensitivity analysis and automatic layer fallback: which quantized layers cost the metric, and which
few to leave in float so the INT8 model stays within tolerance of FP32. No Qt here.

    from workbench.analysis import sensitivity, fallback_search
    profile = sensitivity(model, batches, "sqnr", scheme="one-off")
    for unit in profile.ranked()[:5]:
        print(unit.rank, unit.name, unit.value)
    search = fallback_search(model, batches, "top1", tolerance=0.01, ranking=profile)

The face imports its modules on first use (scientific-python's ``lazy_loader``, SPEC 1): catching an analysis
error or reading the metric registry does not load the sensitivity and fallback searches.
"""
from typing import TYPE_CHECKING

import lazy_loader

from workbench.analysis.errors import AnalysisCancelled, AnalysisError, MetricError  # light: front ends catch them

__getattr__, _, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "fallback": ("fallback_search", "apply_fallback", "units_from_names"),
    "sensitivity": ("sensitivity",),
    "evaluation": ("evaluate_models", "Evaluation"),
    "units": ("Unit", "find_units", "resolve_units"),
    "metrics": ("Metric", "OutputMetric", "ModelMetric", "EntryPointMetric", "SqnrMetric", "CosineMetric",
                "MseMetric", "Top1Metric", "Direction", "BUILTIN_METRICS", "DEFAULT_METRIC", "builtin_metric_labels",
                "metric_choices_text", "get_metric", "metric_from_dict"),
    "entry_point": ("load_entry_point", "EntryPointError"),
    "results": ("SensitivityResult", "UnitResult", "FallbackResult", "FallbackPoint", "SCHEMES"),
})
__all__ = ["AnalysisError", "MetricError", "AnalysisCancelled", *_lazy]


def __dir__() -> list[str]:  # the light names imported above, and the lazy ones
    return sorted(__all__)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
    from workbench.analysis.entry_point import EntryPointError, load_entry_point  # noqa: F401
    from workbench.analysis.evaluation import Evaluation, evaluate_models  # noqa: F401
    from workbench.analysis.fallback import apply_fallback, fallback_search, units_from_names  # noqa: F401
    from workbench.analysis.metrics import (  # noqa: F401 - the public names of __all__
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
    from workbench.analysis.results import SCHEMES, FallbackPoint, FallbackResult, SensitivityResult, UnitResult  # noqa: F401
    from workbench.analysis.sensitivity import sensitivity  # noqa: F401
    from workbench.analysis.units import Unit, find_units, resolve_units  # noqa: F401
