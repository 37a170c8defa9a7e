"""Item 3 and 6 (calibration side): NaN/Inf or all-zero data is never a silent success."""
import pytest
import torch
from torch import nn

from workbench.quant import QuantDescriptor, replace_to_quantization_module
from workbench.quant.algorithms.calibrate import NonFiniteCalibrationError, calibrate


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def quantized(histogram: bool):
    torch.manual_seed(0)
    model = Net().eval()
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(
        calib_method="histogram" if histogram else "max"))
    return model


def batches(fill=None, n=3, nan_share=None):
    """Batches of 3 samples; ``nan_share`` of each batch's values NaN (whole samples first)."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn((3, 3, 6, 6), generator=generator)
        if fill is not None:
            x = torch.full_like(x, fill)
        if nan_share is not None:
            x.view(-1)[: int(x.numel() * nan_share)] = float("nan")
        out.append((x, torch.zeros(3, dtype=torch.long)))
    return out


@pytest.mark.parametrize("histogram", [True, False])
@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_all_nonfinite_data_is_an_error_naming_the_quantizer(histogram, fill):
    model = quantized(histogram)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(NonFiniteCalibrationError) as caught:
        calibrate(model, batches(fill), num_batches=None, method="max" if not histogram else "entropy")
    assert "conv._input_quantizer" in str(caught.value) and "NaN or Inf" in str(caught.value)
    assert "conv._input_quantizer" in caught.value.names
    assert isinstance(caught.value, ValueError)  # the CLI reports it as bad input (exit 2)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for key in before:  # nothing changed (amax of a never-calibrated quantizer may be absent or NaN-free)
        assert torch.equal(before[key], after[key]), key


def test_mostly_nonfinite_batches_are_a_warning():
    model = quantized(histogram=False)
    result = calibrate(model, batches(nan_share=2 / 3), num_batches=None, method="max", report_sqnr=False)
    text = " ".join(result.warnings)
    assert "mostly NaN/Inf" in text and "(3 of 3)" in text
    assert "conv._input_quantizer" in text  # the quantizer that saw most of them


def test_a_few_nonfinite_values_still_warn():
    model = quantized(histogram=False)
    result = calibrate(model, batches(nan_share=0.01), num_batches=None, method="max", report_sqnr=False)
    assert any("saw NaN/Inf values" in w for w in result.warnings)
    assert not any("mostly" in w for w in result.warnings)


def test_clean_data_gives_no_nonfinite_or_zero_warning():
    model = quantized(histogram=False)
    result = calibrate(model, batches(), num_batches=None, method="max", report_sqnr=False)
    assert not any("NaN" in w or "only zeros" in w for w in result.warnings)


def test_a_quantizer_that_saw_only_zeros_is_warned_about():
    model = quantized(histogram=False)
    result = calibrate(model, batches(fill=0.0), num_batches=None, method="max", report_sqnr=False)
    zero = [w for w in result.warnings if "only zeros" in w]
    assert any(w.startswith("conv._input_quantizer") for w in zero), result.warnings


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kernel", [True, False])
def test_mostly_nonfinite_is_decided_on_the_count_of_every_input(dtype, kernel, monkeypatch):
    """A batch is mostly NaN/Inf when over half of its floating-point input values are, counted over all its
    tensors (a channels-last input read in place, a second input of another dtype; the labels are no input),
    whether the C kernel or torch's reductions count them."""
    from workbench.quant.calib import memory

    if not kernel:
        monkeypatch.setattr(memory, "cpu_extension", None)

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def forward(self, x, extra):
            return self.net(x.float() + extra.float().mean())

    model = TwoInputs().eval()
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="max"))
    generator = torch.Generator().manual_seed(3)

    def batch(nonfinite: int):
        x = torch.randn(3, 3, 6, 6, generator=generator).to(dtype).contiguous(memory_format=torch.channels_last)
        extra = torch.randn(4, dtype=torch.float64, generator=generator)
        flat = x.permute(0, 2, 3, 1).reshape(-1)  # x's memory, in order
        flat[:nonfinite] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype).repeat(nonfinite)[
            :nonfinite]
        return {"x": x, "extra": extra, "labels": torch.zeros(3, dtype=torch.long)}

    total = 3 * 3 * 6 * 6 + 4  # 328 floating-point values: 164 is half, not more
    result = calibrate(model, [batch(164), batch(165), batch(0)], num_batches=None, method="max", report_sqnr=False)
    mostly = [w for w in result.warnings if "mostly NaN/Inf" in w]
    assert total == 328 and len(mostly) == 1 and "batches 1 (1 of 3)" in mostly[0], result.warnings
