"""Precision per layer, in the core: the registry, FP8 and INT4 fake quantization against plain references,
the E4M3 histogram searches and the INT4 block searches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from workbench.quant import TensorQuantizer
from workbench.quant.algorithms.blocks import block_mse_amax, refine_block_amax
from workbench.quant.algorithms.precision import (
    DEFAULT_BLOCK_SIZE,
    PRECISIONS,
    Precision,
    descriptors_for,
    layer_weight_bytes,
    parse_precision,
    precision_of,
    weight_bytes,
)
from workbench.quant.calib import HistogramCalibrator
from workbench.quant.calib.e4m3_search import amax_mse_e4m3, e4m3_fake_quant
from workbench.quant.kernels.blocks import block_view, unblock
from workbench.quant.tensor_quant import QuantDescriptor, scaled_e4m3

# every value E4M3 can hold, positive (from torch's own float8 type, not from our code)
E4M3_GRID = torch.arange(0, 256, dtype=torch.uint8)[:127].view(torch.float8_e4m3fn).float()


def plain_e4m3(x: torch.Tensor, amax: float) -> torch.Tensor:
    """Reference: nearest grid value (ties to the even mantissa) of |x| * 448 / amax, saturated, scaled back."""
    scaled = (x.abs() * 448.0 / amax).clamp(max=448.0)
    distance = (scaled[..., None] - E4M3_GRID).abs()
    nearest = distance.min(-1, keepdim=True).values
    ties = (distance == nearest)
    # among equidistant grid values the one with an even last mantissa bit (even index in the grid)
    index = torch.where(ties, torch.arange(E4M3_GRID.numel()) % 2 == 0, False).float().argmax(-1)
    single = ties.sum(-1) == 1
    index = torch.where(single, ties.float().argmax(-1), index)
    return torch.sign(x) * E4M3_GRID[index] * amax / 448.0


def test_registry_lists_every_precision_with_its_bits_and_description():
    assert [p.value for p in Precision] == ["int8", "fp8", "int4w", "nvfp4", "float"]
    assert {p: info.weight_bits for p, info in PRECISIONS.items()} == {
        Precision.INT8: 8, Precision.FP8: 8, Precision.INT4W: 4, Precision.NVFP4: 4, Precision.FLOAT: 32}
    assert all(info.description for info in PRECISIONS.values())
    assert parse_precision("FP8") is Precision.FP8
    with pytest.raises(ValueError, match="int8, fp8, int4w, nvfp4, float"):
        parse_precision("fp4")


def test_descriptors_for_each_precision_and_read_back():
    for precision in (Precision.INT8, Precision.FP8, Precision.INT4W, Precision.FLOAT):
        inputs, weight = descriptors_for(precision, "Linear")
        assert precision_of(inputs, weight, precision is not Precision.FLOAT) is precision
    inputs, weight = descriptors_for(Precision.FP8, "Conv2d")
    assert inputs["num_bits"] == [4, 3] and weight == {"num_bits": [4, 3], "axis": 0}
    _, weight = descriptors_for(Precision.FP8, "Linear", fp8_weight_per_channel=False)
    assert "axis" not in weight
    inputs, weight = descriptors_for(Precision.INT4W, "Linear", block_size=32,
                                     base_input={"calib_method": "histogram"})
    assert inputs == {"num_bits": 8, "enabled": False}
    assert weight == {"num_bits": 4, "axis": 0, "block_size": 32}
    # Hugging Face Conv1D keeps its weight [in, out]: output channels are axis 1
    assert descriptors_for(Precision.INT4W, "Conv1D")[1]["axis"] == 1
    # a layer without a weight quantizer reads from its input
    assert precision_of({"num_bits": [4, 3]}, None) is Precision.FP8
    # kept: what a precision does not decide
    assert descriptors_for(Precision.INT8, "Linear", base_input={"calib_method": "histogram", "num_bits": 4})[0] == {
        "calib_method": "histogram", "num_bits": 8}


def test_hand_edited_descriptors_read_as_their_precision_or_custom():
    assert precision_of({"num_bits": (4, 3)}, {"num_bits": [4, 3], "axis": 0}) is Precision.FP8
    assert precision_of({"num_bits": 8, "calib_method": "histogram"}, {"num_bits": 8, "axis": 0}) is Precision.INT8
    assert precision_of({"num_bits": 8}, {"num_bits": 4, "axis": 0}) is None  # 4-bit per channel: custom
    assert precision_of({"num_bits": 8}, {"num_bits": [4, 3]}) is None  # INT8 inputs, FP8 weights: custom
    assert precision_of({"num_bits": 8}, {"num_bits": 8}, quantize=False) is Precision.FLOAT


def test_int4w_refuses_layers_without_a_weight_gemm():
    with pytest.raises(ValueError, match="int4w is INT4 weight-only.*Conv2d layer is not a GEMM"):
        descriptors_for(Precision.INT4W, "Conv2d")
    with pytest.raises(ValueError, match="has no weight quantizer"):
        descriptors_for(Precision.INT4W, "QuantAdd", has_weight=False)
    # any Linear-like module with a 2-D weight qualifies
    assert descriptors_for(Precision.INT4W, "MyProjection", weight_ndim=2)[1]["block_size"] == DEFAULT_BLOCK_SIZE


def test_weight_bytes_count_scales_and_blocks():
    assert layer_weight_bytes(Precision.FLOAT, (64, 256)) == 4 * 64 * 256
    assert layer_weight_bytes(Precision.INT8, (64, 256)) == 64 * 256 + 4 * 64
    assert layer_weight_bytes(Precision.FP8, (64, 256)) == 64 * 256 + 4 * 64
    assert layer_weight_bytes(Precision.INT4W, (64, 256), block_size=128) == 64 * 256 // 2 + 4 * 64 * 2
    assert layer_weight_bytes(Precision.INT4W, (64, 200), block_size=128) == 64 * 200 // 2 + 4 * 64 * 2  # partial
    model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))
    float_bytes = weight_bytes(model, {})
    assert float_bytes == 4 * sum(p.numel() for p in model.parameters())
    mixed = weight_bytes(model, {"0": Precision.INT4W, "2": Precision.INT8}, block_size=64)
    assert mixed == (64 * 256 // 2 + 4 * 64 * 4) + 4 * 64 + (10 * 64 + 4 * 10) + 4 * 10


def test_fp8_fake_quant_equals_the_plain_e4m3_reference():
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4000) * 3, torch.tensor([0.0, 1e-9, 500.0, -1000.0, 6.5, -6.5])])
    amax = 4.0
    expected = plain_e4m3(x, amax)
    for rounding in ("pytorch_quantization", "onnx"):
        quantizer = TensorQuantizer(QuantDescriptor(num_bits=(4, 3), amax=amax))
        quantizer.rounding = rounding
        got = quantizer(x)
        assert torch.allclose(got, expected, rtol=0, atol=1e-6), rounding
    # saturation at 448 (= amax): both outliers land on +-amax
    assert got[-4].item() == pytest.approx(4.0) and got[-3].item() == pytest.approx(-4.0)
    assert torch.allclose(e4m3_fake_quant(x, amax), got, rtol=0, atol=1e-6)


def test_fp8_per_channel_weights_use_their_own_scale():
    torch.manual_seed(1)
    weight = torch.randn(8, 16) * torch.logspace(-2, 2, 8)[:, None]
    quantizer = TensorQuantizer(QuantDescriptor(num_bits=(4, 3), axis=0))
    quantizer.enable_calib()
    quantizer.disable_quant()
    quantizer(weight)
    quantizer.load_calib_amax()
    quantizer.disable_calib()
    quantizer.enable_quant()
    assert quantizer.amax.shape == (8, 1)
    got = quantizer(weight)
    for row in range(8):
        amax = float(weight[row].abs().max())
        assert torch.allclose(got[row], plain_e4m3(weight[row], amax), atol=1e-6 * amax)
    # relative error of E4M3 (3 mantissa bits): at most 2**-4 of each value, on every row, small or large
    relative = ((got - weight).abs() / weight.abs().clamp(min=1e-12))
    assert float(relative.max()) <= 2 ** -4 + 1e-6


def test_int4_blocks_equal_a_plain_per_block_reference():
    torch.manual_seed(2)
    weight = torch.randn(6, 40)
    weight[2, 5] = 30.0  # an outlier spoils only its own block
    quantizer = TensorQuantizer(QuantDescriptor(num_bits=4, axis=0, block_size=16))
    quantizer.enable_calib()
    quantizer.disable_quant()
    quantizer(weight)
    quantizer.load_calib_amax()
    quantizer.disable_calib()
    quantizer.enable_quant()
    quantizer.rounding = "onnx"
    assert quantizer.amax.shape == (6, 3, 1)  # 40 = 16 + 16 + 8: the last block is partial
    got = quantizer(weight)
    expected = torch.empty_like(weight)
    for row in range(6):
        for start in range(0, 40, 16):
            block = weight[row, start:start + 16]
            step = block.abs().max() / 7
            expected[row, start:start + 16] = torch.clamp(torch.round(block / step), -8, 7) * step
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.equal(got[2, 16:32], weight[2, 16:32])  # still quantized
    # the outlier's block is coarse, the others keep a fine step
    assert float((got[2, :16] - weight[2, :16]).abs().max()) > 1.0
    assert float((got[2, 16:] - weight[2, 16:]).abs().max()) < 0.5


def test_block_view_round_trips_both_layouts():
    weight = torch.arange(5 * 37, dtype=torch.float32).reshape(5, 37)
    for axis, source in ((0, weight), (1, weight.t().contiguous())):
        blocked = block_view(source, axis, 8)
        assert blocked.shape == ((5, 5, 8) if axis == 0 else (5, 8, 5))
        assert torch.equal(unblock(blocked, source.shape, axis), source)


def test_block_mse_search_beats_max_on_heavy_tailed_blocks():
    torch.manual_seed(3)
    weight = torch.distributions.StudentT(2.0).sample((32, 256))
    layer = nn.Linear(256, 32, bias=False)
    layer.weight.data.copy_(weight)
    quantizer = TensorQuantizer(QuantDescriptor(num_bits=4, axis=0, block_size=64))
    quantizer.rounding = "onnx"
    blocked = block_view(weight, 0, 64)
    block_max = blocked.abs().amax(-1, keepdim=True)
    searched = block_mse_amax(blocked, block_max, 4)
    assert searched.shape == block_max.shape and bool((searched <= block_max).all())
    assert bool((searched < block_max).any())  # it shrinks some

    def error(amax):
        quantizer.amax = amax
        return float(((quantizer(weight) - weight) ** 2).sum())

    assert error(searched) < 0.9 * error(block_max)
    # refine_block_amax finds the weight of every blockwise quantizer of a model
    layer._weight_quantizer = quantizer
    quantizer.amax = block_max
    updated = refine_block_amax(layer, "mse")
    assert list(updated) == ["_weight_quantizer"] and torch.equal(quantizer.amax, searched)
    with pytest.raises(ValueError, match="max, mse"):
        refine_block_amax(layer, "entropy")


def test_histogram_searches_run_on_the_e4m3_grid():
    torch.manual_seed(4)
    data = torch.cat([torch.randn(200_000), torch.randn(20) * 40])  # a few far outliers
    calibrator = HistogramCalibrator(num_bits=(4, 3), axis=None, unsigned=False)
    calibrator.collect(data)
    amaxes = {method: float(calibrator.compute_amax(method)) for method in ("mse", "entropy", "percentile", "max")}
    assert amaxes["max"] == pytest.approx(float(data.abs().max()))
    assert all(0 < value <= amaxes["max"] * 1.001 for value in amaxes.values())

    def sq_error(amax):
        return float(((e4m3_fake_quant(data, amax) - data) ** 2).sum())

    # the E4M3 mse choice is at least as good as max on the E4M3 grid, and better than an integer-grid choice
    assert sq_error(amaxes["mse"]) <= sq_error(amaxes["max"]) * 1.0001
    integer_choice = HistogramCalibrator(num_bits=8, axis=None, unsigned=False)
    integer_choice.collect(data)
    assert sq_error(amaxes["mse"]) <= sq_error(float(integer_choice.compute_amax("mse"))) * 1.0001
    # the search itself against brute force: on E4M3 an amax above the data can win (the grid is coarsest
    # near its top, so data that ends at 100 is finer with amax ~170 than with 100)
    hist = np.zeros(256)
    hist[:100] = 1.0
    edges = np.linspace(0, 256, 257)
    centers = torch.tensor((edges[1:] + edges[:-1]) / 2, dtype=torch.float32)
    brute = min(centers[10:-1].tolist(), key=lambda amax: float(
        ((e4m3_fake_quant(centers, amax) - centers) ** 2 * torch.tensor(hist)).sum()))
    assert amax_mse_e4m3(hist, edges, start_bin=10) == pytest.approx(brute)


def test_scaled_e4m3_keeps_its_pytorch_quantization_signature():
    x = torch.tensor([0.3, -2.0, 1000.0])
    assert torch.equal(scaled_e4m3(x, torch.tensor(4.0), 4, 3), plain_e4m3(x, 4.0))


def test_descriptor_block_size_and_enabled_are_validated_and_round_trip():
    descriptor = QuantDescriptor(num_bits=4, axis=0, block_size=64)
    assert QuantDescriptor(**descriptor.dict()) == descriptor and descriptor.dict()["block_size"] == 64
    off = QuantDescriptor(enabled=False)
    assert off.dict()["enabled"] is False and not TensorQuantizer(off).is_enabled
    with pytest.raises(ValueError, match="block_size needs axis"):
        QuantDescriptor(num_bits=4, block_size=64)
    with pytest.raises(ValueError, match="positive integer"):
        QuantDescriptor(num_bits=4, axis=0, block_size=0)
    with pytest.raises(TypeError, match="enabled must be True or False"):
        QuantDescriptor(enabled="no")
