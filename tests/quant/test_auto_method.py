"""The "auto" amax method, the warnings that name a quantizer, and the output SQNR over every calibration batch."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from workbench.quant import QuantDescriptor, replace_to_quantization_module
from workbench.quant.algorithms.auto_method import MethodChoice
from workbench.quant.algorithms.calibrate import AmaxError, calibrate
from workbench.quant.calib import HistogramCalibrator
from workbench.quant.calib.checks import histogram_warnings

SINGLES = ("entropy", "mse", "percentile", "max")


def _half_zeros(generator):
    """A padded ReLU signal: half of every row exact zeros (the padding), the rest a ReLU output whose own zeros
    sit on a small bias (CREPE's padded conv input, where entropy clips most of the range)."""
    x = torch.zeros(32, 64)
    signal = torch.relu(torch.randn(32, 32, generator=generator) * 3)
    x[:, 16:48] = signal + 0.05 * (signal == 0)
    return x


def _heavy_tail(generator):
    """Mostly N(0, 1) with rare outliers a thousand times larger."""
    x = torch.randn(32, 64, generator=generator)
    x[0, :2] = torch.tensor([900.0, -1000.0])
    return x


def _relu(generator):
    return torch.relu(torch.randn(32, 64, generator=generator) * 2 + 0.3)


def _layer():
    """One Linear whose input is quantized with a histogram calibrator; the weight stays float (the input's
    method is what is compared)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32))
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    model[0].weight_quantizer.disable()
    return model


def _layer_sqnr(model, batches):
    """The Linear's output SQNR, quantized input vs FP32, pooled over the batches: measured here, independently
    of how auto measures."""
    quantizer = model[0].input_quantizer
    signal = noise = 0.0
    with torch.no_grad():
        for x in batches:
            quantized = model(x)
            quantizer.disable()
            reference = model(x)
            quantizer.enable()
            signal += float(reference.double().pow(2).sum())
            noise += float((reference.double() - quantized.double()).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


@pytest.mark.parametrize("make", [_half_zeros, _heavy_tail, _relu], ids=["half-zeros", "heavy-tail", "relu"])
def test_auto_is_no_worse_than_the_best_single_method(make):
    generator = torch.Generator().manual_seed(1)
    batches = [make(generator) for _ in range(12)]  # 12 x 2048 values: enough for every search's 2048 bins
    model = _layer()
    result = calibrate(model, batches, num_batches=None, method="auto")
    item = result.quantizers["0._input_quantizer"]
    assert item.method in SINGLES and item.choice is not None and item.choice.method == item.method
    assert item.choice.owner == "0" and item.choice.criterion == "layer output" and item.choice.batches == 4
    # the amax in use is the picked method's own
    assert float(model[0].input_quantizer.amax) == pytest.approx(item.choice.amax[item.method])
    auto = _layer_sqnr(model, batches[:4])
    best = {m: _layer_sqnr(_calibrated(model, batches, m), batches[:4]) for m in SINGLES}
    assert auto >= max(best.values()) - 1e-6, (item.choice.reason, best)
    assert item.choice.reason.startswith(f"{item.method}: SQNR of 0's output")
    assert result.picked_methods() == {item.method: 1} and "auto picked" in result.summary()
    if make is _half_zeros:  # entropy ignores the zeros and clips most of the range: auto must not take it
        assert item.method != "entropy" and best["entropy"] < best[item.method] - 3


def _calibrated(model, batches, method):
    calibrate(model, batches, num_batches=None, method=method, report_sqnr=False)
    return model


def test_warnings_name_the_quantizer_and_say_what_is_wrong():
    generator = torch.Generator().manual_seed(1)
    model = _layer()
    padded = [_half_zeros(generator) for _ in range(12)]
    result = calibrate(model, padded, num_batches=None, method="entropy")
    clipped = [w for w in result.quantizers["0._input_quantizer"].warnings if w.kind == "clipped"]
    assert clipped and clipped[0].quantizer == "0._input_quantizer"
    assert clipped[0].message.startswith("0._input_quantizer: entropy amax") and "are 0" in clipped[0].message
    assert clipped[0].message in result.warnings

    heavy = [_heavy_tail(generator) for _ in range(12)]
    result = calibrate(model, heavy, num_batches=None, method="max")
    kinds = {w.kind for w in result.quantizers["0._input_quantizer"].warnings}
    assert "zeroed" in kinds  # amax 1000 makes a step of ~8: the N(0, 1) body rounds to 0

    sparse = [torch.where(torch.rand(8, 64, generator=generator) < 0.95, 0.0, 1.0) for _ in range(12)]
    result = calibrate(model, sparse, num_batches=None, method="mse")
    assert "zeros" in {w.kind for w in result.quantizers["0._input_quantizer"].warnings}

    # a well-behaved tensor with a sensible method: no warning
    plain = [torch.randn(8, 64, generator=generator) for _ in range(12)]
    result = calibrate(model, plain, num_batches=None, method="mse")
    assert result.quantizers["0._input_quantizer"].warnings == []


def test_collapsed_amax_warns():
    hist = np.zeros(2048)
    hist[:100] = 10
    warnings = histogram_warnings("conv._input_quantizer", hist, 0.01, 0.0, 1.0, num_bits=8, unsigned=False,
                                  method="entropy")
    assert [w.kind for w in warnings] == ["collapsed"] and "quantizes every input to 0" in warnings[0].message


def test_output_sqnr_is_pooled_over_every_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    batches = [torch.randn(32, 16) * (1 + 4 * i) for i in range(4)]  # later batches are wider: first != all
    result = calibrate(model, batches, num_batches=None, method="percentile")
    signal = noise = 0.0
    with torch.no_grad():
        first = None
        for x in batches:
            quantized = model(x)
            for q in (model[0].input_quantizer, model[2].input_quantizer, model[0].weight_quantizer,
                      model[2].weight_quantizer):
                q.disable()
            reference = model(x)
            for q in (model[0].input_quantizer, model[2].input_quantizer, model[0].weight_quantizer,
                      model[2].weight_quantizer):
                q.enable()
            s, n = float(reference.double().pow(2).sum()), float((reference.double() - quantized.double()).pow(2).sum())
            first = first or 10 * math.log10(s / n)
            signal, noise = signal + s, noise + n
    assert result.sqnr_batches == 4 and "over all 4 batches" in result.summary()
    assert result.output_sqnr_db == pytest.approx(10 * math.log10(signal / noise), abs=1e-6)
    assert abs(result.output_sqnr_db - first) > 0.01  # not the first batch's figure


def test_a_method_that_cannot_run_names_the_quantizer_and_changes_nothing():
    model = _layer()
    quantizer = model[0].input_quantizer
    quantizer._calibrator = HistogramCalibrator(8, None, False, num_bins=64)  # 64-128 bins: under entropy's start
    before = quantizer.amax
    with pytest.raises(AmaxError, match=r"^0\._input_quantizer: the entropy amax cannot be computed: .*start_bin"):
        calibrate(model, [torch.randn(8, 64) for _ in range(4)], num_batches=None, method="entropy")
    assert quantizer.amax is before or (before is None and quantizer.amax is None)


def test_method_choice_round_trips_and_refuses_garbage():
    choice = MethodChoice("mse", {"entropy": 0.9, "mse": 2.0, "percentile": 2.5, "max": 10.0},
                          {"entropy": 12.0, "mse": 38.0, "percentile": 35.0, "max": math.inf}, "layer output", 4,
                          "conv")
    again = MethodChoice.from_dict(choice.to_dict())
    assert again == choice and "vs entropy 12.0, percentile 35.0, max inf dB" in again.reason
    with pytest.raises(ValueError, match="not a method choice"):
        MethodChoice.from_dict({"method": "mse"})
    with pytest.raises(ValueError, match="Unknown calibration method"):
        MethodChoice.from_dict({**choice.to_dict(), "method": "kl"})
