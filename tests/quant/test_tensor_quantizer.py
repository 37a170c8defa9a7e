"""TensorQuantizer: switches, calibration, amax handling, state_dict round trips, repr."""
import numpy as np
import pytest
import torch

from workbench.quant import TensorQuantizer, calib
from workbench.quant import tensor_quant as tq
from workbench.quant.tensor_quant import QuantDescriptor


def test_default_quantizer_is_dynamic_fake_quant():
    x = torch.randn(3, 7)
    quantizer = TensorQuantizer()
    assert torch.equal(quantizer(x), tq.fake_tensor_quant(x, x.abs().max()))


def test_real_quantization_sets_scale():
    x = torch.randn(3, 7)
    quantizer = TensorQuantizer(QuantDescriptor(fake_quant=False))
    q = quantizer(x)
    expected_q, expected_scale = tq.tensor_quant(x, x.abs().max(), 8, False, False)
    assert torch.equal(q, expected_q)
    assert torch.equal(quantizer.scale, expected_scale)


def test_fixed_amax_and_scale_amax():
    x = torch.rand(1000)
    quantizer = TensorQuantizer(QuantDescriptor(amax=0.5, scale_amax=0.9))
    expected = tq.fake_tensor_quant(x, torch.tensor(0.45), 8, False, False)
    assert torch.allclose(quantizer(x), expected, atol=0, rtol=1e-6)
    assert quantizer.amax.item() == pytest.approx(0.5)  # scale_amax does not modify the stored amax
    assert torch.allclose(quantizer(x), expected, atol=0, rtol=1e-6)


def test_disable_passes_through_and_enable_restores():
    x = torch.randn(4, 4)
    quantizer = TensorQuantizer(QuantDescriptor(amax=1.0))
    quantizer.disable()
    assert quantizer(x) is x
    quantizer.enable()
    assert not torch.equal(quantizer(x), x)


def test_disable_quant_with_calibration_returns_input_and_collects():
    x = torch.randn(5, 5) * 3
    quantizer = TensorQuantizer()
    quantizer.disable_quant()
    quantizer.enable_calib()
    assert torch.equal(quantizer(x), x)
    quantizer.load_calib_amax()
    assert quantizer.amax.item() == x.abs().max().item()


def test_per_channel_calibration_shape():
    quantizer = TensorQuantizer(QuantDescriptor(axis=0), if_calib=True, if_quant=False)
    x = torch.randn(6, 3, 4, 4)
    quantizer(x)
    quantizer(x * 2)
    quantizer.load_calib_amax()
    assert quantizer.amax.shape == (6, 1, 1, 1)
    assert torch.equal(quantizer.amax, (x * 2).abs().amax(dim=(1, 2, 3), keepdim=True))


def test_load_calib_amax_without_data():
    quantizer = TensorQuantizer()
    with pytest.raises(RuntimeError, match="Calibrator returned None"):
        quantizer.load_calib_amax()
    quantizer.load_calib_amax(strict=False)
    assert torch.isnan(quantizer.amax)


def test_histogram_quantizer_dispatches_methods():
    quantizer = TensorQuantizer(QuantDescriptor(calib_method="histogram"), if_calib=True, if_quant=False)
    x = torch.randn(20000)
    x[0] = 40.0  # an outlier the histogram methods should cut
    quantizer(x)
    quantizer.load_calib_amax("percentile", percentile=99.9)
    percentile = quantizer.amax.item()
    quantizer.load_calib_amax(method="max")
    assert quantizer.amax.item() == pytest.approx(40.0)
    assert percentile < 10.0


def test_max_calibrator_rejects_histogram_methods():
    quantizer = TensorQuantizer(if_calib=True)
    quantizer(torch.randn(10))
    with pytest.raises(ValueError, match="only computes 'max'"):
        quantizer.load_calib_amax(method="entropy")


def test_enable_calib_without_calibrator():
    quantizer = TensorQuantizer()
    quantizer._calibrator = None
    with pytest.raises(ValueError, match="Calibrator was not created"):
        quantizer.enable_calib()


def test_amax_setter():
    quantizer = TensorQuantizer(QuantDescriptor(amax=3.14))
    quantizer.amax = 0.577
    assert quantizer.amax.item() == np.float32(0.577)
    assert quantizer.step_size == pytest.approx(0.577 / 127)
    with pytest.raises(RuntimeError, match="Changing shape"):
        quantizer.amax = [1.0, 2.0]
    with pytest.raises(ValueError, match="non-negative"):
        quantizer.amax = -1.0
    fresh = TensorQuantizer()
    assert fresh.amax is None
    fresh.amax = np.array([3.142, 2.718], dtype=np.float32)
    assert fresh.amax.tolist() == pytest.approx([3.142, 2.718])


def test_state_dict_round_trip():
    source = TensorQuantizer(QuantDescriptor(axis=0), if_calib=True)
    source(torch.randn(4, 8))
    source.load_calib_amax()
    target = TensorQuantizer(QuantDescriptor(axis=0))
    assert target.amax is None
    target.load_state_dict(source.state_dict())
    assert torch.equal(target.amax, source.amax)
    assert list(source.state_dict()) == ["_amax"]


def test_negative_amax_is_refused_when_loaded():
    """A per-call CUDA path does not read amax back, so a negative one is refused when it arrives."""
    target = TensorQuantizer(QuantDescriptor(axis=0))
    with pytest.raises(RuntimeError, match=r"_amax: Negative values in amax: the smallest is -2"):
        target.load_state_dict({"_amax": torch.tensor([[1.0], [-2.0]])})
    # a calibrated quantizer keeps its amax when a bad checkpoint of the same shape is refused
    target.amax = torch.tensor([[1.0], [3.0]])
    with pytest.raises(RuntimeError, match="Negative values in amax") as refused:
        target.load_state_dict({"_amax": torch.tensor([[1.0], [-2.0]])}, strict=True)
    assert "Missing key" not in str(refused.value)
    assert torch.equal(target.amax, torch.tensor([[1.0], [3.0]]))


def test_negative_amax_from_a_calibrator_is_refused():
    quantizer = TensorQuantizer(QuantDescriptor(axis=0))
    quantizer._calibrator.compute_amax = lambda: torch.tensor([[1.0], [-2.0]])
    with pytest.raises(ValueError, match="Negative values in amax"):
        quantizer.load_calib_amax()
    assert quantizer.amax is None


def test_loading_amax_along_another_axis_follows_it():
    """pytorch-quantization calibrated ConvTranspose weights on axis 0; such checkpoints still load."""
    target = TensorQuantizer(QuantDescriptor(axis=1))
    target.load_state_dict({"_amax": torch.rand(5, 1, 1, 1)})
    assert target.axis == 0
    assert target.amax.shape == (5, 1, 1, 1)


def test_learn_amax_clip_stage():
    x = torch.rand(1000)
    quantizer = TensorQuantizer(QuantDescriptor(amax=0.5, learn_amax=True))
    assert hasattr(quantizer, "clip")
    out = quantizer(x)
    expected = tq.fake_tensor_quant(torch.clamp(x, -0.5, 0.5), torch.tensor(0.5), 8, False, False)
    assert torch.equal(out, expected)
    out.sum().backward()
    assert quantizer.clip.clip_value_max.grad is not None


def test_pre_quant_scale():
    quantizer = TensorQuantizer(QuantDescriptor(axis=1, amax=127.0))
    inputs = torch.tensor([[0, 0.4, 1.1, 2.0]])
    assert torch.equal(quantizer(inputs), torch.tensor([[0.0, 0.0, 1.0, 2.0]]))
    quantizer.pre_quant_scale = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert torch.equal(quantizer(inputs), torch.tensor([[0.0, 1.0, 3.0, 8.0]]))


def test_e4m3_quantizer():
    quantizer = TensorQuantizer(QuantDescriptor(num_bits=(4, 3)))
    x = torch.rand(3, 5, 7)
    out = quantizer(x)
    assert torch.equal(out, tq.scaled_e4m3(x, quantizer._get_amax(x), 4, 3))
    assert quantizer.maxbound == 448.0
    quantizer.amax = 2.0
    with pytest.raises(ValueError, match=r"num_bits=\(4, 3\) has no integer grid"):
        _ = quantizer.step_size


def test_bounds_and_step_size_of_integer_quantizers():
    quantizer = TensorQuantizer(QuantDescriptor(num_bits=4, unsigned=True, amax=3.0))
    assert quantizer.maxbound == 15 and isinstance(quantizer.maxbound, int)
    assert quantizer.step_size.item() == pytest.approx(0.2)


def test_one_line_repr():
    quantizer = TensorQuantizer(QuantDescriptor(amax=2.64))
    assert repr(quantizer) == "TensorQuantizer(8bit fake per-tensor amax=2.6400 calibrator=MaxCalibrator quant)"
    quantizer.disable()
    assert repr(quantizer) == "TensorQuantizer(disabled)"
    per_channel = TensorQuantizer(QuantDescriptor(axis=0, calib_method="max"))
    per_channel.amax = np.array([1.0, 3.0], dtype=np.float32)
    assert "amax=[1.0000, 3.0000](2)" in repr(per_channel)


def test_rounding_setting():
    quantizer = TensorQuantizer(QuantDescriptor(amax=2.0))
    quantizer.rounding = "onnx"
    x = torch.randn(10000)
    step = torch.tensor(2.0) / 127
    assert torch.equal(quantizer(x), torch.clamp(torch.round(x / step), -128, 127) * step)
    with pytest.raises(ValueError, match="rounding"):
        quantizer.rounding = "up"


def test_histogram_calibrator_is_per_tensor_only():
    with pytest.raises(NotImplementedError, match="per tensor"):
        TensorQuantizer(QuantDescriptor(axis=0, calib_method="histogram"))


def test_calibrator_types():
    assert isinstance(TensorQuantizer()._calibrator, calib.MaxCalibrator)
    assert isinstance(TensorQuantizer(QuantDescriptor(calib_method="histogram"))._calibrator,
                      calib.HistogramCalibrator)


def test_fb_fake_quant_matches_full_range():
    x = torch.randn(100)
    quantizer = TensorQuantizer(QuantDescriptor(amax=1.0))
    TensorQuantizer.use_fb_fake_quant = True
    try:
        out = quantizer(x)
    finally:
        TensorQuantizer.use_fb_fake_quant = False
    assert torch.allclose(out, torch.fake_quantize_per_tensor_affine(x, 1.0 / 127, 0, -128, 127))
