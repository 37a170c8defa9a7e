"""sensitivity(): both schemes find the sensitive layer, metrics match direct computation, cached passes
give the plain loop's numbers, and the model always comes back as it went in."""
import math
import threading

import pytest
import torch
from analysis_models import SENSITIVE, assert_same_state, make_batches, model_state, quantized, sensitive_net
from torch import nn

from workbench.analysis import (
    AnalysisCancelled,
    AnalysisError,
    MetricError,
    find_units,
    sensitivity,
)
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.sources.demo import load_digits_cnn, load_digits_split


@pytest.mark.parametrize("scheme", ["one-off", "one-on"])
@pytest.mark.parametrize("metric", ["sqnr", "cosine", "mse"])
def test_both_schemes_rank_the_outlier_layer_first(sensitive_model, batches, scheme, metric):
    result = sensitivity(sensitive_model, batches, metric, scheme=scheme)
    assert result.ranked()[0].name == SENSITIVE
    assert [u.name for u in result.units] == ["0", "2", "5", "7", "9", "11"]  # model order kept
    assert sorted(u.rank for u in result.units) == list(range(1, 7))
    assert result.scheme == scheme and result.complete


def test_one_off_and_one_on_deltas_point_the_right_way(sensitive_model, batches):
    off = sensitivity(sensitive_model, batches, "sqnr", scheme="one-off")
    on = sensitivity(sensitive_model, batches, "sqnr", scheme="one-on")
    assert off.fp32 == on.fp32 == math.inf
    assert off.quantized == on.quantized < 40
    top_off = off.unit(SENSITIVE)
    assert top_off.delta_vs_quantized > 20  # leaving it in float regains most of the signal
    assert top_off.delta_vs_quantized == top_off.value - off.quantized
    top_on = on.unit(SENSITIVE)
    assert top_on.value < min(u.value for u in on.units if u.name != SENSITIVE)
    assert top_on.delta_vs_fp32 == -math.inf


def _set_unit(model, names, disabled):
    for name in names:
        model.get_submodule(name)._disabled = disabled


def _direct(model, batches, reference):
    """SQNR (dB), cosine and MSE of the model's outputs against ``reference``, written out plainly."""
    with torch.no_grad():
        out = torch.cat([model(b) for b in batches]).double()
    ref = torch.cat(reference).double()
    noise = (ref - out).pow(2).sum()
    sqnr = (10 * torch.log10(ref.pow(2).sum() / noise)).item()
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
    return {"sqnr": sqnr, "cosine": cosine, "mse": (noise / ref.numel()).item()}


@pytest.mark.parametrize("metric", ["sqnr", "cosine", "mse"])
def test_builtin_metrics_agree_with_direct_computation(sensitive_model, batches, metric):
    quantizers = [m for m in sensitive_model.modules() if isinstance(m, TensorQuantizer)]
    with torch.no_grad():
        for q in quantizers:
            q.disable()
        reference = [sensitive_model(b) for b in batches]
        for q in quantizers:
            q.enable()
    off = sensitivity(sensitive_model, batches, metric, scheme="one-off")
    on = sensitivity(sensitive_model, batches, metric, scheme="one-on")
    assert off.quantized == pytest.approx(_direct(sensitive_model, batches, reference)[metric], rel=1e-9)
    assert off.fp32 == {"sqnr": math.inf, "cosine": pytest.approx(1.0), "mse": 0.0}[metric]
    for unit in find_units(sensitive_model):
        _set_unit(sensitive_model, unit.quantizers, True)  # one-off: this unit in float
        expected = _direct(sensitive_model, batches, reference)[metric]
        _set_unit(sensitive_model, unit.quantizers, False)
        assert off.unit(unit.name).value == pytest.approx(expected, rel=1e-9)

        for q in quantizers:  # one-on: only this unit quantized
            q.disable()
        _set_unit(sensitive_model, unit.quantizers, False)
        expected = _direct(sensitive_model, batches, reference)[metric]
        for q in quantizers:
            q.enable()
        assert on.unit(unit.name).value == pytest.approx(expected, rel=1e-9)


def test_top1_accuracy_with_labels_matches_a_hand_count():
    model = load_digits_cnn()
    split = load_digits_split("test")
    data = split.batches(64)[:4]
    quantized(model, [images for images, _ in load_digits_split("train").batches(64)[:4]])
    result = sensitivity(model, data, "top1", scheme="one-off")
    quantizers = [m for m in model.modules() if isinstance(m, TensorQuantizer)]

    def accuracy():
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in data)
        return correct / sum(len(y) for _, y in data)

    assert result.quantized == accuracy()
    for q in quantizers:
        q.disable()
    assert result.fp32 == accuracy() > 0.9
    for q in quantizers:
        q.enable()
    unit = result.units[0]
    _set_unit(model, unit.quantizers, True)
    assert unit.value == accuracy()
    assert result.metric == {"kind": "top1", "name": "top-1 accuracy", "direction": "higher"}


def test_top1_without_labels_is_reported_as_a_metric_error(sensitive_model, batches):
    with pytest.raises(MetricError, match="labelled batches") as info:
        sensitivity(sensitive_model, batches, "top1")
    assert info.value.stage == "fp32" and info.value.unit is None


@pytest.mark.parametrize("scheme", ["one-off", "one-on"])
@pytest.mark.parametrize("metric", ["sqnr", "mse"])
def test_cached_passes_give_exactly_the_plain_loop_results(residual_model, batches, scheme, metric):
    plain = sensitivity(residual_model, batches, metric, scheme=scheme, cache=False)
    cached = sensitivity(residual_model, batches, metric, scheme=scheme, cache=True)
    assert plain.cache == "off" and cached.cache == "fx"
    assert [(u.name, u.value, u.rank) for u in cached.units] == [(u.name, u.value, u.rank) for u in plain.units]
    assert (cached.fp32, cached.quantized) == (plain.fp32, plain.quantized)


def test_cached_passes_on_the_digits_cnn_with_labels():
    model = load_digits_cnn()
    data = load_digits_split("test").batches(50)[:3]
    quantized(model, [x for x, _ in data])
    for scheme in ("one-off", "one-on"):
        plain = sensitivity(model, data, "top1", scheme=scheme, cache=False)
        cached = sensitivity(model, data, "top1", scheme=scheme)
        assert cached.cache == "fx"
        assert [u.value for u in cached.units] == [u.value for u in plain.units]


class Gate(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace through it."""

    def forward(self, x):
        return x if x.sum() > 0 else -x


def test_untraceable_blocks_inside_a_sequential_use_the_coarse_graph(batches):
    model = quantized(nn.Sequential(nn.Conv2d(3, 4, 3), Gate(), nn.Conv2d(4, 4, 3), nn.Flatten(),
                                    nn.Linear(4 * 4 * 4, 3)), batches)
    plain = sensitivity(model, batches, "sqnr", scheme="one-on", cache=False)
    cached = sensitivity(model, batches, "sqnr", scheme="one-on")
    assert cached.cache == "fx-coarse"
    assert [u.value for u in cached.units] == [u.value for u in plain.units]


def test_an_untraceable_model_falls_back_to_the_plain_loop_and_says_so(batches):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3)
            self.b = nn.Conv2d(4, 4, 3)

        def forward(self, x):
            x = self.a(x)
            if x.mean() > 100:  # data-dependent: no graph
                x = x * 2
            return self.b(x)

    model = quantized(Net(), batches)
    result = sensitivity(model, batches, "mse", scheme="one-on")
    assert result.cache == "off"
    assert "could not be traced" in result.cache_note
    assert {u.name for u in result.units} == {"a", "b"}


def test_tracing_leaves_no_attribute_on_the_model(residual_model, batches):
    before = {name: set(vars(m)) for name, m in residual_model.named_modules()}

    class Net(nn.Module):  # a constant tensor that fx would stow on the root module
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) * torch.tensor(2.0)

    wrapped = Net(residual_model)
    sensitivity(wrapped, batches, "sqnr", scheme="one-on")
    assert not any(k.startswith("_tensor_constant") for k in vars(wrapped))
    assert {name: set(vars(m)) for name, m in residual_model.named_modules()} == before


def test_progress_is_reported_per_unit(sensitive_model, batches):
    calls = []
    result = sensitivity(sensitive_model, batches, "sqnr", progress=lambda d, t, m: calls.append((d, t, m)))
    total = len(result.units) + 2
    assert calls[0] == (0, total, "measuring the FP32 reference")  # the count is known before the first pass
    done = [call for call in calls if not call[2].startswith("measuring")]  # a step measured (not: about to be)
    assert [d for d, _, _ in done] == list(range(1, total + 1))
    assert all(t == total for _, t, _ in calls)
    assert done[0][2] == "FP32 reference" and SENSITIVE in done[4][2]


def test_the_model_is_left_exactly_as_it_was(sensitive_model, batches):
    sensitive_model.train()
    sensitive_model[0].eval()
    sensitive_model[2]._input_quantizer.disable()  # a user's choice that must survive
    sensitive_model[7]._weight_quantizer.enable_calib()
    saved = model_state(sensitive_model)
    amax = sensitive_model[5]._input_quantizer._amax
    for scheme in ("one-off", "one-on"):
        result = sensitivity(sensitive_model, batches, "sqnr", scheme=scheme)
        assert_same_state(sensitive_model, saved)
    assert sensitive_model[5]._input_quantizer._amax is amax
    assert result.unit("2").quantizers == ["2._weight_quantizer"]  # the disabled one is not analysed


class CancelAfter:
    """A cancel token set from the progress callback after ``count`` reports (as a GUI's Cancel would be)."""

    def __init__(self, count):
        self.count = count
        self.event = threading.Event()

    def progress(self, done, total, message):
        if done >= self.count:
            self.event.set()

    def is_set(self):
        return self.event.is_set()


@pytest.mark.parametrize("scheme", ["one-off", "one-on"])
@pytest.mark.parametrize("cache", [True, False])
def test_cancel_between_units_restores_the_model_exactly(sensitive_model, batches, scheme, cache):
    sensitive_model[9]._input_quantizer.disable()
    saved = model_state(sensitive_model)
    token = CancelAfter(4)  # FP32, all quantized, then two units
    with pytest.raises(AnalysisCancelled) as info:
        sensitivity(sensitive_model, batches, "mse", scheme=scheme, progress=token.progress, cancel=token,
                    cache=cache)
    assert_same_state(sensitive_model, saved)
    partial = info.value.partial
    assert partial is not None and not partial.complete and len(partial.units) == 2


def test_cancel_before_starting_leaves_nothing_measured(sensitive_model, batches):
    token = threading.Event()
    token.set()
    saved = model_state(sensitive_model)
    with pytest.raises(AnalysisCancelled):
        sensitivity(sensitive_model, batches, "sqnr", cancel=token)
    assert_same_state(sensitive_model, saved)


def test_a_model_error_names_the_unit_and_the_model_is_restored(batches):
    class Fragile(nn.Module):
        """Raises when its input is quantized coarsely enough to contain exact zeros everywhere."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            y = self.conv(x)
            if not self.conv._input_quantizer._disabled and self.fc._input_quantizer._disabled:
                raise RuntimeError("boom")
            return self.fc(y.mean((2, 3)))

    model = quantized(Fragile(), batches)
    saved = model_state(model)
    with pytest.raises(AnalysisError, match="boom") as info:
        sensitivity(model, batches, "sqnr", scheme="one-off", cache=False)
    assert info.value.unit == "fc" and info.value.stage == "one-off" and info.value.batch_index == 0
    assert "left in float" in str(info.value)
    assert_same_state(model, saved)


def test_a_generator_of_batches_is_read_once_and_num_batches_applies(sensitive_model):
    data = make_batches(5)
    result = sensitivity(sensitive_model, (b for b in data), "sqnr", num_batches=2)
    assert result.num_batches == 2
    again = sensitivity(sensitive_model, data[:2], "sqnr")
    assert [u.value for u in result.units] == [u.value for u in again.units]


def test_bad_arguments_are_refused(sensitive_model, batches):
    with pytest.raises(ValueError, match="scheme"):
        sensitivity(sensitive_model, batches, "sqnr", scheme="both")
    with pytest.raises(ValueError, match="Unknown metric"):
        sensitivity(sensitive_model, batches, "psnr")
    with pytest.raises(ValueError, match="No batches"):
        sensitivity(sensitive_model, [], "sqnr")
    with pytest.raises(TypeError, match="single tensor"):
        sensitivity(sensitive_model, batches[0], "sqnr")


class InPlace(nn.Module):
    """In-place operations on values that cross cut points, one of them through a view."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
        self.c = nn.Conv2d(2, 4, 3, padding=1)

    def forward(self, x):
        x = self.a(x)
        v = x[:, :2]  # a view of x: the cached copy must keep the two sharing memory
        y = self.b(x)
        x.add_(1.0)  # in place, after b's cut point: must not leak into the cache
        return y + self.c(v)


class Keywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)
        self.b = nn.Conv2d(4, 2, 3)

    def forward(self, image, scale: float = 1.0):
        return self.b(self.a(image) * scale)


class OptionalShift(Keywords):
    def forward(self, image, scale: float = 1.0, shift=None):
        out = super().forward(image, scale)
        return out if shift is None else out + shift  # fx traces the "given" branch only


@pytest.mark.parametrize("scheme", ["one-off", "one-on"])
def test_in_place_operations_and_views_do_not_spoil_the_cache(batches, scheme):
    model = quantized(InPlace(), batches)
    plain = sensitivity(model, batches, "mse", scheme=scheme, cache=False)
    cached = sensitivity(model, batches, "mse", scheme=scheme)
    assert cached.cache == "fx"
    assert [u.value for u in cached.units] == [u.value for u in plain.units]


def test_dict_batches_are_keyword_arguments(batches):
    model = quantized(Keywords(), batches)
    data = [{"image": x, "scale": 0.5} for x in batches]
    plain = sensitivity(model, data, "sqnr", scheme="one-on", cache=False)
    cached = sensitivity(model, data, "sqnr", scheme="one-on")
    assert cached.cache == "fx"
    assert [u.value for u in cached.units] == [u.value for u in plain.units]


def test_a_graph_that_does_not_run_like_the_model_is_not_used(batches):
    model = quantized(OptionalShift(), batches)
    data = [{"image": x} for x in batches]
    plain = sensitivity(model, data, "sqnr", scheme="one-on", cache=False)
    result = sensitivity(model, data, "sqnr", scheme="one-on")
    assert result.cache == "off" and "traced graph failed" in result.cache_note
    assert [u.value for u in result.units] == [u.value for u in plain.units]


class _Cache:
    """Stands for a transformers DynamicCache: part of the output, not a tensor."""


class StructuredOutput(nn.Module):
    """Returns what a Hugging Face model returns: a dict of a main tensor, a cache and an extra tensor."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        logits = self.net(x)
        return {"logits": logits, "past_key_values": _Cache(), "input_mean": x.mean((1, 2, 3))}


def test_structured_outputs_compare_the_first_tensor_or_the_named_one(batches):
    from analysis_models import quantized as calibrated

    model = calibrated(StructuredOutput(sensitive_net()), batches)
    plain = sensitivity(model, batches, "sqnr")
    named = sensitivity(model, batches, "sqnr", output="input_mean")
    assert plain.ranked()[0].name == "net." + SENSITIVE and math.isfinite(plain.quantized)
    assert named.quantized == math.inf  # the input's mean is computed before any quantizer
    with pytest.raises(AnalysisError, match="no tensor under 'loss'; it has: logits, past_key_values, input_mean"):
        sensitivity(model, batches, "sqnr", output="loss")
