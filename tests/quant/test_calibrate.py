"""calibrate(): the job around the calibrators, its state guarantees and its report."""
import math
import threading

import pytest
import torch
from torch import nn

from workbench.quant import QuantDescriptor, TensorQuantizer, quantizer_state, replace_to_quantization_module
from workbench.quant.algorithms.calibrate import CalibrationCancelled, CalibrationError, calibrate, sqnr_db


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(self.pool(x).flatten(1))


def quantized_cnn(histogram=True):
    torch.manual_seed(0)
    model = SmallCNN().eval()
    descriptor = QuantDescriptor(calib_method="histogram") if histogram else QuantDescriptor()
    replace_to_quantization_module(model, quant_desc_input=descriptor)
    return model


def batches(n=4, size=(4, 3, 8, 8)):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(size, generator=generator), torch.zeros(size[0], dtype=torch.long)) for _ in range(n)]


def full_state(model):
    """Everything calibration may touch: tensors of the state_dict, enable flags, calibrator statistics."""
    tensors = {k: v.clone() for k, v in model.state_dict().items()}
    stats = {}
    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer) and module._calibrator is not None:
            state = module._calibrator.state()
            stats[name] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in state.items()}
    return tensors, quantizer_state(model), stats


def assert_same_state(before, after):
    tensors_a, flags_a, stats_a = before
    tensors_b, flags_b, stats_b = after
    assert tensors_a.keys() == tensors_b.keys()
    for key in tensors_a:
        assert torch.equal(tensors_a[key], tensors_b[key]), key
    assert flags_a == flags_b
    assert stats_a == stats_b


def test_sets_amax_and_reports_per_quantizer():
    model = quantized_cnn()
    result = calibrate(model, batches(), num_batches=3, method="mse")
    assert result.num_batches == 3
    assert set(result.quantizers) == {name for name, m in model.named_modules() if isinstance(m, TensorQuantizer)}
    conv1_input = result.quantizers["conv1._input_quantizer"]
    assert conv1_input.method == "mse" and conv1_input.calibrator == "HistogramCalibrator"
    assert conv1_input.num_samples == 3 * 4 * 3 * 8 * 8 and conv1_input.nonfinite_count == 0
    assert result.quantizers["conv1._weight_quantizer"].method == "max"
    assert result.quantizers["conv1._weight_quantizer"].amax.shape == (8, 1, 1, 1)
    assert torch.equal(model.conv1.input_quantizer.amax, conv1_input.amax)
    assert result.wall_time_s > 0 and result.output_sqnr_db > 10
    # quantization is back on
    assert all(not disabled and quant and not calib for disabled, quant, calib in quantizer_state(model).values())


def test_other_methods_reuse_the_collected_histograms():
    model = quantized_cnn()
    calibrate(model, batches(), num_batches=2, method="entropy")
    quantizer = model.conv2.input_quantizer
    expected = quantizer._calibrator.compute_amax("percentile", percentile=99.0)
    quantizer.load_calib_amax("percentile", percentile=99.0)  # no data passes here
    assert torch.equal(quantizer.amax, expected)


def test_cancel_restores_the_exact_prior_state():
    model = quantized_cnn()
    calibrate(model, batches(2), num_batches=2, method="max")  # a previous calibration to preserve
    model.fc.input_quantizer.disable()
    model.conv2.weight_quantizer.disable_quant()
    before = full_state(model)
    cancel = threading.Event()

    def progress(done, total, message):
        if done == 2:
            cancel.set()

    with pytest.raises(CalibrationCancelled, match="after 2 of 4"):
        calibrate(model, batches(4), num_batches=4, method="mse", progress=progress, cancel=cancel)
    assert_same_state(before, full_state(model))


def test_forward_error_names_the_batch_and_restores_state():
    model = quantized_cnn()
    data = batches(4)
    data[2] = (torch.randn(4, 5, 8, 8), data[2][1])  # wrong channel count: conv1 raises
    before = full_state(model)
    with pytest.raises(CalibrationError) as info:
        calibrate(model, data, num_batches=4, method="entropy")
    assert info.value.batch_index == 2
    assert isinstance(info.value.original, RuntimeError)
    assert "batch 2" in str(info.value)
    assert_same_state(before, full_state(model))


def test_progress_is_reported_per_batch():
    calls = []
    calibrate(quantized_cnn(), batches(3), num_batches=None, method="max",
              progress=lambda done, total, message: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_quantizers_without_calibrator_are_bypassed_then_restored():
    model = quantized_cnn()
    model.fc.weight_quantizer._calibrator = None
    model.fc.weight_quantizer.amax = 0.5
    seen = []
    handle = model.fc.register_forward_pre_hook(lambda m, a: seen.append(m.weight_quantizer._disabled))
    calibrate(model, batches(2), num_batches=2, method="max", report_sqnr=False)
    handle.remove()
    assert seen == [True, True]
    assert not model.fc.weight_quantizer._disabled
    assert model.fc.weight_quantizer.amax.item() == 0.5


def test_disabled_quantizers_are_left_alone():
    model = quantized_cnn()
    model.conv1.input_quantizer.disable()
    result = calibrate(model, batches(2), num_batches=2, method="max")
    assert "conv1._input_quantizer" not in result.quantizers
    assert model.conv1.input_quantizer.amax is None and model.conv1.input_quantizer._disabled


def test_unreached_quantizers_are_reported_and_unchanged():
    model = quantized_cnn()
    model.extra = nn.Linear(2, 2)  # never called by forward
    replace_to_quantization_module(model)
    result = calibrate(model, batches(2), num_batches=2, method="max")
    assert "extra._input_quantizer" in result.unused
    assert model.extra.input_quantizer.amax is None
    assert "never reached" in result.summary()


def test_nan_inputs_are_counted_and_reported():
    model = quantized_cnn()
    data = batches(2)
    data[0][0][0, 0, 0, 0] = float("nan")
    result = calibrate(model, data, num_batches=2, method="percentile")
    assert result.quantizers["conv1._input_quantizer"].nonfinite_count == 1
    assert torch.isfinite(model.conv1.input_quantizer.amax)
    assert "NaN/Inf" in result.summary()


def test_argument_errors():
    model = quantized_cnn()
    with pytest.raises(ValueError, match="method"):
        calibrate(model, batches(), num_batches=1, method="kl")
    with pytest.raises(ValueError, match="num_batches"):
        calibrate(model, batches(), num_batches=0, method="max")
    with pytest.raises(ValueError, match="no TensorQuantizer"):
        calibrate(SmallCNN(), batches(), num_batches=1, method="max")
    with pytest.raises(ValueError, match="yielded nothing"):
        calibrate(model, [], num_batches=None, method="max")
    with pytest.raises(CalibrationError, match="batch 0"):
        calibrate(model, ["not a batch"], num_batches=None, method="max")


def test_histogram_methods_beat_max_on_data_with_outliers():
    """The trained digits CNN calibrated on images with two corrupted pixels per batch (value 8 where
    images lie in [0, 1]): max spends the int8 range on the outliers, the histogram methods clip them."""
    import copy

    from workbench.sources import demo

    model = demo.load_digits_cnn()
    test = demo.load_digits_split("test")
    generator = torch.Generator().manual_seed(0)
    calib_data = []
    for images, _ in demo.load_digits_split("train").batches(64)[:8]:
        images = images.clone()
        images.view(-1)[torch.randint(0, images.numel(), (2,), generator=generator)] = 8.0
        calib_data.append(images)
    with torch.no_grad():
        expected = model(test.images)
    sqnr, accuracy = {}, {}
    for method in ("max", "mse", "entropy", "percentile"):
        quantized = copy.deepcopy(model)
        replace_to_quantization_module(quantized, quant_desc_input=QuantDescriptor(calib_method="histogram"))
        result = calibrate(quantized, calib_data, num_batches=8, method=method)
        assert result.output_sqnr_db is not None
        with torch.no_grad():
            sqnr[method] = sqnr_db(expected, quantized(test.images))
        accuracy[method] = demo.accuracy(quantized, test)
    for method in ("mse", "entropy", "percentile"):
        assert sqnr[method] > sqnr["max"] + 1.0, sqnr
        assert accuracy[method] >= accuracy["max"], accuracy


def test_a_collapsed_amax_is_flagged():
    """Entropy on a thin histogram can pick a tiny amax; the result says so instead of staying silent."""
    model = quantized_cnn()
    result = calibrate(model, batches(2, size=(2, 3, 8, 8)), num_batches=2, method="entropy")
    fc = [w for w in result.warnings if w.startswith("fc._input_quantizer")]
    assert any("values for a 2048-bin histogram" in w for w in fc), result.warnings
    assert result.quantizers["fc._input_quantizer"].max_value > 0
    assert "warnings" in result.summary()


def test_sqnr_db():
    x = torch.tensor([3.0, 4.0])
    assert sqnr_db(x, x) == float("inf")
    assert sqnr_db(x, x + torch.tensor([0.3, 0.4])) == pytest.approx(20.0)
    # a plain tuple of tensors is compared whole; a nested output on its first tensor (select_output)
    assert sqnr_db((x, x), (x, x * 1.1)) == pytest.approx(10 * torch.log10(torch.tensor(200.0)).item())
    assert sqnr_db((x * 1.1, {"a": x}), (x, {"a": x * 1.1})) == pytest.approx(20 * math.log10(1 / 0.1 * 1.1))


@pytest.mark.cuda
def test_calibrates_on_cuda_and_moves_amax_there():
    model = quantized_cnn()
    result = calibrate(model, batches(2), num_batches=2, method="entropy", device="cuda")
    assert model.conv1.input_quantizer.amax.device.type == "cuda"
    assert result.device.startswith("cuda")


class _SqueezeExcite(nn.Module):
    """A squeeze-excite gate: its Linear sees one value per channel and image, far fewer than 2048 bins."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        x = self.conv(x)
        return x * torch.sigmoid(self.fc(x.mean((2, 3))))[:, :, None, None]


def test_a_histogram_thinner_than_its_bins_takes_max_with_a_note():
    torch.manual_seed(0)
    model = _SqueezeExcite().eval()
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    data = batches(4, size=(8, 3, 16, 16))  # the conv sees 6,144 values a batch, the fc 64
    result = calibrate(model, data, num_batches=4, method="entropy")
    fc, conv = result.quantizers["fc._input_quantizer"], result.quantizers["conv._input_quantizer"]
    assert conv.method == "entropy" and fc.method == "max"
    # max keeps the whole range: amax is the largest value seen (to the histogram's bin width)
    assert float(fc.amax) == pytest.approx(fc.max_value, rel=1e-2)
    note = [w for w in result.warnings if w.startswith("fc._input_quantizer")]
    assert note and "only 256 values for a 2048-bin histogram, too few for entropy" in note[0] and "max" in note[0]
