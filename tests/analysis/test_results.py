"""Results: sortable, and unchanged by a trip through JSON (the project file's form)."""
import json
import math

import pytest
from analysis_models import SENSITIVE

from workbench.analysis import FallbackResult, SensitivityResult, fallback_search, sensitivity


def _through_json(data):
    return json.loads(json.dumps(data, allow_nan=False))  # strict JSON: no NaN/Infinity literals


@pytest.mark.parametrize("scheme", ["one-off", "one-on"])
def test_sensitivity_result_round_trips_through_json(sensitive_model, batches, scheme):
    result = sensitivity(sensitive_model, batches, "sqnr", scheme=scheme)
    assert result.fp32 == math.inf  # the awkward case: a non-finite number
    again = SensitivityResult.from_dict(_through_json(result.to_dict()))
    assert again == result
    assert again.ranked()[0].name == SENSITIVE


def test_fallback_result_round_trips_through_json(sensitive_model, batches):
    result = fallback_search(sensitive_model, batches, "sqnr", target=50.0)
    again = FallbackResult.from_dict(_through_json(result.to_dict()))
    assert again == result
    assert again.chosen[0].quantizers == (f"{SENSITIVE}._input_quantizer", f"{SENSITIVE}._weight_quantizer")


def test_reading_another_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        SensitivityResult.from_dict({"format": "something/9"})
    with pytest.raises(ValueError, match="format"):
        FallbackResult.from_dict({"format": "workbench.sensitivity/1"})


def test_sorting_and_worst_n(sensitive_model, batches):
    result = sensitivity(sensitive_model, batches, "mse", scheme="one-on")
    ranked = result.ranked()
    assert [u.rank for u in ranked] == list(range(1, len(ranked) + 1))
    # one-on with a lower-is-better metric: the most sensitive unit has the largest error
    assert [u.value for u in ranked] == sorted((u.value for u in ranked), reverse=True)
    assert [u.name for u in result.sorted_by("name")] == sorted(u.name for u in result.units)
    assert result.sorted_by("delta_vs_fp32", descending=True)[0].name == SENSITIVE
    assert result.most_sensitive(2) == [ranked[0].name, ranked[1].name]
    with pytest.raises(ValueError, match="key"):
        result.sorted_by("colour")
    with pytest.raises(KeyError):
        result.unit("nope")
    assert SENSITIVE in result.summary()
