"""NVFP4 in the fake-quant core: E2M1 values in blocks of 16, FP8 E4M3 block scales, an FP32 global scale; the
descriptor, the TensorQuantizer, the precision registry and the TensorRT rules that name it."""
import ml_dtypes
import numpy as np
import pytest
import torch

from workbench.quant.algorithms.format_rules import FORMAT_NEEDS, gpu_requirement, supports
from workbench.quant.algorithms.precision import (
    Precision,
    applies_to,
    descriptors_for,
    grid_levels,
    layer_weight_bytes,
    parse_precision,
    precision_of,
)
from workbench.quant.algorithms.tensorrt_rules import tensorrt_check
from workbench.quant.nn import QuantLinear, TensorQuantizer
from workbench.quant.nvfp4 import nvfp4_blocks, nvfp4_fake_quant, round_to_e2m1
from workbench.quant.tensor_quant import QuantDescriptor


def test_e2m1_rounds_to_nearest_with_ties_to_even_and_saturates():
    x = torch.tensor([0.0, 0.2, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, 6.0, 100.0, -0.75, -5.0])
    expected = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0, 6.0, -1.0, -4.0]
    assert round_to_e2m1(x).tolist() == expected
    # the same as ml_dtypes' float4_e2m1fn conversion on a dense sweep
    sweep = torch.linspace(-8, 8, 6401)
    theirs = sweep.numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(round_to_e2m1(sweep).numpy(), theirs)


def test_two_level_scales_by_hand():
    # global amax 2688 = 6 * 448: global scale 1. Block 0's max is 12: FP8 scale 2 (exact in E4M3), values / 2
    # rounded on the E2M1 grid; block 1's max is 0.9: scale 0.15 -> E4M3 0.15625 (nearest), values / 0.15625
    block0 = torch.tensor([12.0, -12.0, 1.0, 1.4, 2.6, 5.0, 7.0, 9.0] + [0.0] * 8)
    block1 = torch.tensor([0.9, 0.1, -0.3, 0.5] + [0.0] * 12)
    x = torch.cat([block0, block1]).reshape(1, 32)
    values, scales = nvfp4_blocks(x, torch.tensor(1.0), 16, 1)
    assert scales.dtype == torch.float8_e4m3fn and scales.float().tolist() == [[2.0, 0.15625]]
    assert values[0, :8].tolist() == [6.0, -6.0, 0.5, 0.5, 1.5, 2.0, 4.0, 4.0]  # 0.7 -> 0.5, 1.3 -> 1.5, 3.5 -> 4
    assert values[0, 16:20].tolist() == [6.0, 0.5, -2.0, 3.0]  # 5.76 -> 6, 0.64 -> 0.5, -1.92 -> -2, 3.2 -> 3
    out = nvfp4_fake_quant(x, torch.tensor(2688.0), 16, 1)
    assert out[0, :8].tolist() == [12.0, -12.0, 1.0, 1.0, 3.0, 4.0, 8.0, 8.0]
    assert torch.allclose(out[0, 16:20], torch.tensor([0.9375, 0.078125, -0.3125, 0.46875]))


def test_the_global_amax_sets_the_block_scale_resolution_and_a_tiny_amax_gives_zeros():
    x = torch.randn(4, 64)
    fine = nvfp4_fake_quant(x, x.abs().max(), 16, 1)
    # an amax 10**5 x too large puts the block scales among E4M3's subnormals: the blocks lose precision
    coarse = nvfp4_fake_quant(x, x.abs().max() * 1e5, 16, 1)
    assert (coarse - x).norm() > 1.3 * (fine - x).norm()
    assert (fine - x).norm() / x.norm() < 0.15  # about 20 dB on a Gaussian
    assert torch.count_nonzero(nvfp4_fake_quant(x, torch.tensor(2.0 ** -30), 16, 1)) == 0


def test_partial_last_block_and_activation_blocks_along_the_last_axis():
    x = torch.randn(2, 3, 40)  # 40 = 2 blocks of 16 and one of 8
    out = nvfp4_fake_quant(x, x.abs().max())
    assert out.shape == x.shape
    _, scales = nvfp4_blocks(x, x.abs().max() / 2688, 16, -1)
    assert scales.shape == (2, 3, 3)
    # each block is quantized on its own: scaling one block leaves the others unchanged
    y = x.clone()
    y[..., :16] *= 8
    assert torch.equal(nvfp4_fake_quant(y, x.abs().max() * 8)[..., 16:],
                       nvfp4_fake_quant(x, x.abs().max() * 8)[..., 16:])


def test_descriptor_and_quantizer():
    with pytest.raises(ValueError, match=r"\(2, 1\).*needs block_size"):
        QuantDescriptor(num_bits=(2, 1))
    desc = QuantDescriptor(num_bits=[2, 1], block_size=16)  # an activation: blocks along the last axis
    assert desc.num_bits == (2, 1) and desc.axis is None
    assert QuantDescriptor.from_dict(desc.dict()) == desc
    layer = QuantLinear(32, 8, quant_desc_input=desc,
                        quant_desc_weight=QuantDescriptor(num_bits=(2, 1), axis=0, block_size=16))
    x = torch.randn(5, 32)
    for q in (layer.input_quantizer, layer.weight_quantizer):
        q.disable_quant()
        q.enable_calib()
    layer(x)
    for q in (layer.input_quantizer, layer.weight_quantizer):
        q.load_calib_amax()
        q.enable_quant()
        q.disable_calib()
    # the calibrated amax is the global one, one value per tensor
    assert layer.input_quantizer.amax.numel() == 1 and layer.weight_quantizer.amax.numel() == 1
    assert float(layer.weight_quantizer.amax) == pytest.approx(float(layer.weight.abs().max()))
    with torch.no_grad():
        expected = torch.nn.functional.linear(nvfp4_fake_quant(x, layer.input_quantizer.amax),
                                              nvfp4_fake_quant(layer.weight, layer.weight_quantizer.amax, 16, 1),
                                              layer.bias)
        assert torch.equal(layer(x), expected)
    # straight-through gradient
    q = TensorQuantizer(desc)
    x.requires_grad_(True)
    q(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_precision_registry_reads_and_writes_nvfp4():
    assert parse_precision("NVFP4") is Precision.NVFP4
    inputs, weight = descriptors_for("nvfp4", "Linear", base_input={"calib_method": "histogram"})
    assert inputs == {"num_bits": [2, 1], "block_size": 16}
    assert weight == {"num_bits": [2, 1], "axis": 0, "block_size": 16}
    assert precision_of(inputs, weight) is Precision.NVFP4
    _, conv1d_weight = descriptors_for("nvfp4", "Conv1D")
    assert conv1d_weight["axis"] == 1  # Hugging Face's Conv1D keeps its weight [in, out]
    with pytest.raises(ValueError, match="nvfp4 is for weight GEMMs .* a Conv2d layer is not a GEMM"):
        descriptors_for("nvfp4", "Conv2d")
    assert applies_to(Precision.NVFP4, "MaxPool2d", has_weight=False) is not None
    # [4096, 4096]: half a byte a weight, one FP8 scale per 16 and one float32 global scale
    assert layer_weight_bytes(Precision.NVFP4, (4096, 4096)) == 4096 * 4096 // 2 + 4096 * 256 + 4
    assert grid_levels((2, 1), 6.0).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_tensorrt_rules_and_format_needs():
    assert tensorrt_check("input", (2, 1), None, "QuantLinear", block_size=16).ok
    assert tensorrt_check("weight", (2, 1), 1, "Conv1D", block_size=16).ok
    assert "GEMMs" in tensorrt_check("weight", (2, 1), 0, "QuantConv2d", block_size=16).error
    assert "blocks of 16" in tensorrt_check("weight", (2, 1), 0, "Linear", block_size=32).sim_only
    assert "axis=none" in tensorrt_check("input", (2, 1), 0, "Linear", block_size=16).error
    needs = FORMAT_NEEDS["nvfp4"]
    assert needs.min_compute_capability == (10, 0) and needs.min_tensorrt == "10.8"
    assert "Blackwell" in gpu_requirement("nvfp4")
    assert supports("nvfp4", (9, 0)) is False and supports("nvfp4", (10, 0)) is True
