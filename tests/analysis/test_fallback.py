"""fallback_search(): leaves the sensitive layer in float to reach the goal, and changes the model only
when asked."""
import pytest
from analysis_models import SENSITIVE, assert_same_state, model_state

from workbench.analysis import (
    AnalysisCancelled,
    apply_fallback,
    fallback_search,
    sensitivity,
)
from workbench.analysis.units import is_quantizing


def _quantizing(model, layer):
    return [is_quantizing(model.get_submodule(f"{layer}.{q}")) for q in ("_input_quantizer", "_weight_quantizer")]


def test_reaches_the_tolerance_by_leaving_the_sensitive_layer_in_float(sensitive_model, batches):
    profile = sensitivity(sensitive_model, batches, "mse")
    without_sensitive = profile.unit(SENSITIVE).value
    tolerance = 2 * without_sensitive
    assert profile.quantized > tolerance  # the all-quantized model misses it
    saved = model_state(sensitive_model)

    result = fallback_search(sensitive_model, batches, "mse", tolerance=tolerance)
    assert result.reached and result.chosen_names == [SENSITIVE]
    assert [(p.num_float, p.unit) for p in result.curve] == [(0, None), (1, SENSITIVE)]
    assert result.curve[0].value == profile.quantized
    assert result.curve[1].value == without_sensitive
    assert result.sensitivity is not None and result.ranking[0] == SENSITIVE
    assert result.plot_data() == ([0, 1], [profile.quantized, without_sensitive])
    assert not result.applied
    assert_same_state(sensitive_model, saved)  # not applied: the model is untouched

    applied = fallback_search(sensitive_model, batches, "mse", tolerance=tolerance, ranking=profile, apply=True)
    assert applied.applied and applied.sensitivity is None and applied.chosen == result.chosen
    assert _quantizing(sensitive_model, SENSITIVE) == [False, False]
    assert _quantizing(sensitive_model, "7") == [True, True]


def test_stops_at_max_units_and_says_the_goal_was_missed(sensitive_model, batches):
    result = fallback_search(sensitive_model, batches, "mse", tolerance=0.0, max_units=2)
    assert not result.reached and len(result.chosen) == 2 and len(result.curve) == 3
    assert result.chosen_names[0] == SENSITIVE
    assert "without reaching" in result.notes[0]
    nothing = fallback_search(sensitive_model, batches, "mse", tolerance=0.0, max_units=0)
    assert nothing.chosen == [] and [p.num_float for p in nothing.curve] == [0]


def test_already_within_tolerance_needs_no_fallback(sensitive_model, batches):
    result = fallback_search(sensitive_model, batches, "cosine", tolerance=0.5)
    assert result.reached and result.chosen == [] and len(result.curve) == 1


def test_sqnr_takes_a_target_in_db(sensitive_model, batches):
    # FP32 SQNR is infinite: a tolerance counts from the all-quantized value (workbench.analysis.goals)
    gain = fallback_search(sensitive_model, batches, "sqnr", tolerance=1.0, scheme="one-on")
    assert gain.tolerance is None and gain.target == pytest.approx(gain.quantized + 1.0)
    assert any("counts from the all-INT8 value" in note for note in gain.notes)
    result = fallback_search(sensitive_model, batches, "sqnr", target=50.0, scheme="one-on")
    assert result.reached and result.chosen_names == [SENSITIVE] and result.curve[-1].value >= 50.0


def test_a_ranking_given_by_names_is_followed(sensitive_model, batches):
    result = fallback_search(sensitive_model, batches, "mse", tolerance=0.0, ranking=["0", SENSITIVE, "7"])
    assert result.ranking == ["0", SENSITIVE, "7"]
    assert result.chosen_names == ["0", SENSITIVE, "7"][:len(result.chosen)]
    assert result.curve[1].unit == "0"


def test_arguments_are_checked(sensitive_model, batches):
    with pytest.raises(ValueError, match="either tolerance"):
        fallback_search(sensitive_model, batches, "mse")
    with pytest.raises(ValueError, match="either tolerance"):
        fallback_search(sensitive_model, batches, "mse", tolerance=0.1, target=0.1)
    with pytest.raises(ValueError, match=">= 0"):
        fallback_search(sensitive_model, batches, "mse", tolerance=-1.0)
    with pytest.raises(ValueError, match="max_units"):
        fallback_search(sensitive_model, batches, "mse", tolerance=0.1, max_units=-1)
    with pytest.raises(ValueError, match="no module"):
        fallback_search(sensitive_model, batches, "mse", tolerance=0.1, ranking=["nope"])


def test_cancel_restores_the_model_and_keeps_the_curve_so_far(sensitive_model, batches):
    saved = model_state(sensitive_model)
    reports = []

    class Token:
        def is_set(self):
            # FP32, quantized, 6 units, one fallback step measured (the reports before a pass say "measuring")
            return len([r for r in reports if not r[2].startswith("measuring")]) >= 9

    with pytest.raises(AnalysisCancelled) as info:
        fallback_search(sensitive_model, batches, "mse", tolerance=0.0, apply=True, cancel=Token(),
                        progress=lambda *a: reports.append(a))
    assert_same_state(sensitive_model, saved)  # nothing applied either
    partial = info.value.partial
    assert not partial.complete and partial.sensitivity is not None and len(partial.curve) == 2


def test_apply_fallback_by_name(sensitive_model):
    disabled = apply_fallback(sensitive_model, [SENSITIVE])
    assert disabled == [f"{SENSITIVE}._input_quantizer", f"{SENSITIVE}._weight_quantizer"]
    assert _quantizing(sensitive_model, SENSITIVE) == [False, False]
