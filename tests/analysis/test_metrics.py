"""Metrics: names and directions, and user metrics from entry points with their errors reported per unit."""
import math
import textwrap

import pytest
import torch
from analysis_models import SENSITIVE, assert_same_state, model_state

from workbench.analysis import (
    EntryPointError,
    EntryPointMetric,
    MetricError,
    ModelMetric,
    get_metric,
    load_entry_point,
    metric_from_dict,
    sensitivity,
)

USER_METRICS = textwrap.dedent('''
    """A user's metrics file: batches are (inputs, fp32_outputs) pairs."""
    import math

    import torch


    def mse_to_targets(model, batches):
        total = sum(float((model(x).double() - y.double()).pow(2).sum()) for x, y in batches)
        return total / sum(y.numel() for _, y in batches)


    def fails_without_layer_5(model, batches):
        if model[5]._input_quantizer._disabled and not model[0]._input_quantizer._disabled:
            raise ZeroDivisionError("layer 5 is missing")
        return mse_to_targets(model, batches)


    def nan_with_only_layer_7(model, batches):
        if not model[7]._input_quantizer._disabled and model[0]._input_quantizer._disabled:
            return math.nan
        return mse_to_targets(model, batches)


    def tensor_value(model, batches):
        return torch.tensor(0.5)


    def not_a_number(model, batches):
        return "good"


    class Scores:
        @staticmethod
        def constant(model, batches):
            return 1.0


    NOT_CALLABLE = 3
''')


@pytest.fixture
def metrics_file(tmp_path):
    path = tmp_path / "qwb_user_metrics.py"
    path.write_text(USER_METRICS)
    return path


@pytest.fixture
def labelled(sensitive_model, batches):
    """(inputs, FP32 outputs) pairs, so a user MSE against the labels is the built-in MSE."""
    quantizers = [m for m in sensitive_model.modules() if hasattr(m, "_disabled")]
    with torch.no_grad():
        for q in quantizers:
            q.disable()
        pairs = [(x, sensitive_model(x)) for x in batches]
        for q in quantizers:
            q.enable()
    return pairs


def test_builtin_names_and_directions():
    assert get_metric("sqnr").direction == "higher"
    assert get_metric("cosine").higher_is_better
    assert get_metric("mse").direction == "lower"
    assert get_metric("accuracy").kind == "top1"
    with pytest.raises(ValueError, match="direction"):
        get_metric("some.module:fn")
    with pytest.raises(ValueError, match="higher' or 'lower"):
        get_metric("some.module:fn", direction="up")
    assert get_metric(lambda model, batches: 1.0, direction="lower").direction == "lower"


def test_gap_and_tolerance_follow_the_direction():
    top1, mse = get_metric("top1"), get_metric("mse")
    assert top1.gap(0.90, 0.95) == pytest.approx(0.05) and top1.gap(0.96, 0.95) < 0
    assert mse.gap(0.3, 0.1) == pytest.approx(0.2) and mse.gap(0.0, 0.1) < 0
    assert top1.within_tolerance(0.94, 0.95, 0.01)  # 0.95 - 0.94 is 0.010000000000000009 in floats
    assert not top1.within_tolerance(0.93, 0.95, 0.01)
    assert get_metric("sqnr").gap(float("inf"), float("inf")) == 0.0


@pytest.mark.parametrize("form", ["file", "module"])
def test_user_entry_point_metric_matches_the_builtin(sensitive_model, labelled, metrics_file, monkeypatch, form):
    if form == "file":
        spec = f"{metrics_file}:mse_to_targets"
    else:
        monkeypatch.syspath_prepend(str(metrics_file.parent))
        spec = "qwb_user_metrics:mse_to_targets"
    for scheme in ("one-off", "one-on"):
        user = sensitivity(sensitive_model, labelled, spec, direction="lower", scheme=scheme)
        builtin = sensitivity(sensitive_model, labelled, "mse", scheme=scheme)
        assert user.cache == "off" and "runs the model itself" in user.cache_note
        assert user.metric == {"kind": "entry_point", "name": spec, "direction": "lower", "spec": spec}
        assert user.ranked()[0].name == SENSITIVE
        assert [u.name for u in user.ranked()] == [u.name for u in builtin.ranked()]
        for mine, theirs in zip(user.units, builtin.units):
            assert mine.value == pytest.approx(theirs.value, rel=1e-9, abs=1e-15)
        assert user.fp32 == pytest.approx(0.0, abs=1e-15)


def test_a_metric_that_raises_is_reported_with_its_unit(sensitive_model, labelled, metrics_file):
    saved = model_state(sensitive_model)
    with pytest.raises(MetricError, match="layer 5 is missing") as info:
        sensitivity(sensitive_model, labelled, f"{metrics_file}:fails_without_layer_5", direction="lower")
    error = info.value
    assert error.unit == SENSITIVE and error.stage == "one-off"
    assert isinstance(error.original, ZeroDivisionError)
    assert f"with unit '{SENSITIVE}' left in float" in str(error)
    assert_same_state(sensitive_model, saved)


def test_a_non_finite_value_is_reported_with_its_unit(sensitive_model, labelled, metrics_file):
    saved = model_state(sensitive_model)
    with pytest.raises(MetricError, match="returned nan") as info:
        sensitivity(sensitive_model, labelled, f"{metrics_file}:nan_with_only_layer_7", direction="lower",
                    scheme="one-on")
    assert info.value.unit == "7" and info.value.stage == "one-on" and math.isnan(info.value.value)
    assert "with only unit '7' quantized" in str(info.value)
    assert_same_state(sensitive_model, saved)


def test_values_are_numbers(sensitive_model, labelled, metrics_file):
    result = sensitivity(sensitive_model, labelled, f"{metrics_file}:tensor_value", direction="higher")
    assert result.fp32 == 0.5 and isinstance(result.units[0].value, float)
    with pytest.raises(MetricError, match="'good'") as info:
        sensitivity(sensitive_model, labelled, f"{metrics_file}:not_a_number", direction="higher")
    assert info.value.stage == "fp32" and info.value.unit is None


def test_entry_point_loading_errors_are_clear(metrics_file, tmp_path):
    assert load_entry_point(f"{metrics_file}:Scores.constant")(None, []) == 1.0
    with pytest.raises(EntryPointError, match="no attribute 'missing'"):
        load_entry_point(f"{metrics_file}:missing")
    with pytest.raises(EntryPointError, match="not a function"):
        load_entry_point(f"{metrics_file}:NOT_CALLABLE")
    with pytest.raises(EntryPointError, match="no such Python file"):
        load_entry_point(f"{tmp_path / 'absent.py'}:fn")
    with pytest.raises(EntryPointError, match="qwb_no_such_module_anywhere' cannot be imported"):
        load_entry_point("qwb_no_such_module_anywhere:fn")
    with pytest.raises(EntryPointError, match="must look like"):
        load_entry_point("no_colon_here")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('bad file')\n")
    with pytest.raises(EntryPointError, match="bad file"):
        load_entry_point(f"{broken}:fn")


def test_a_bad_entry_point_fails_before_any_pass(sensitive_model, batches, tmp_path):
    with pytest.raises(EntryPointError):
        sensitivity(sensitive_model, batches, f"{tmp_path / 'absent.py'}:fn", direction="higher")


def test_metric_descriptions_round_trip_without_running_code():
    for name in ("sqnr", "cosine", "mse", "top1"):
        metric = get_metric(name)
        again = metric_from_dict(metric.to_dict())
        assert type(again) is type(metric) and again.to_dict() == metric.to_dict()
    # the module does not exist: re-creating the description must not import it
    entry = metric_from_dict({"kind": "entry_point", "spec": "qwb_not_imported:fn", "direction": "lower",
                              "name": "mAP"})
    assert isinstance(entry, EntryPointMetric) and entry.name == "mAP" and entry.direction == "lower"
    with pytest.raises(ValueError, match="module:function"):
        metric_from_dict(ModelMetric(lambda m, b: 0.0, direction="higher", name="f").to_dict())
