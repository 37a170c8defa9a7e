"""tensor_quant: the worked numbers, formulas, per-channel, dtypes, gradients and every error path."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.quant import tensor_quant as tq
from workbench.quant.kernels import fake_quant as kernels
from workbench.quant.tensor_quant import QuantDescriptor


def multi_op_fake_quant(x, amax, num_bits=8, unsigned=False, narrow_range=True):
    """pytorch-quantization's formula written out with separate torch operations, in float32."""
    max_bound = 2.0 ** (num_bits - 1 + int(unsigned)) - 1
    min_bound = 0.0 if unsigned else (-max_bound if narrow_range else -max_bound - 1)
    amax = amax.float()
    scale = torch.tensor(max_bound) / amax  # tensor / tensor: a true division (scalar / tensor is not)
    scale = torch.where(amax <= 2.0 ** -24, torch.zeros_like(scale), scale)
    q = torch.clamp(torch.round(x.float() * scale), min_bound, max_bound)
    scale = torch.where(amax <= 2.0 ** -24, torch.ones_like(scale), scale)
    return (q / scale).to(x.dtype), q


class TestWorkedNumbers:
    """The numbers in ../shared/reference/README.md (from the pytorch-quantization user guide)."""

    def test_fake_tensor_quant(self):
        torch.manual_seed(12345)
        x = torch.rand(10)
        out = tq.fake_tensor_quant(x, x.abs().max())
        expected = [0.9843, 0.8828, 0.9921, 0.4609, 0.0859, 0.1797, 0.3672, 0.5703, 0.3359, 0.2109]
        assert np.round(out.numpy().astype(np.float64), 4).tolist() == expected

    def test_tensor_quant(self):
        torch.manual_seed(12345)
        x = torch.rand(10)
        q, scale = tq.tensor_quant(x, x.abs().max())
        assert q.tolist() == [126, 113, 127, 59, 11, 23, 47, 73, 43, 27]
        assert round(scale.item(), 4) == 128.0057
        assert q.dtype == torch.float32


class TestFormula:
    @pytest.mark.parametrize("num_bits", [2, 4, 7, 8, 11, 16])
    @pytest.mark.parametrize("unsigned", [False, True])
    @pytest.mark.parametrize("narrow_range", [False, True])
    def test_matches_multi_op_formula(self, num_bits, unsigned, narrow_range):
        x = torch.randn(4097) * 3
        if unsigned:
            x = x.abs()
        amax = torch.tensor(2.5)  # smaller than max |x|: clipping is exercised
        expected, expected_q = multi_op_fake_quant(x, amax, num_bits, unsigned, narrow_range)
        assert torch.equal(tq.fake_tensor_quant(x, amax, num_bits, unsigned, narrow_range), expected)
        q, _ = tq.tensor_quant(x, amax, num_bits, unsigned, narrow_range)
        assert torch.equal(q, expected_q)

    def test_narrow_range_bounds(self):
        x = torch.tensor([-10.0, -1.0, 0.0, 1.0, 10.0])
        q_narrow, _ = tq.tensor_quant(x, torch.tensor(1.0), 8, False, True)
        q_full, _ = tq.tensor_quant(x, torch.tensor(1.0), 8, False, False)
        q_unsigned, _ = tq.tensor_quant(x.abs(), torch.tensor(1.0), 8, True)
        assert q_narrow.tolist() == [-127, -127, 0, 127, 127]
        assert q_full.tolist() == [-128, -127, 0, 127, 127]
        assert q_unsigned.tolist() == [255, 255, 0, 255, 255]

    def test_rounds_half_to_even_like_torch_round(self):
        amax = torch.tensor(127.0)  # scale 1: x is its own grid coordinate
        x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 126.5])
        q, _ = tq.tensor_quant(x, amax)
        assert q.tolist() == [0, 2, 2, -0, -2, 126]

    def test_nan_stays_nan(self):
        x = torch.tensor([float("nan"), 1.0, -1.0])
        out = tq.fake_tensor_quant(x, torch.tensor(1.0))
        assert torch.isnan(out[0]) and out[1] == 1.0 and out[2] == -1.0

    def test_onnx_rounding_matches_quantize_linear_formula(self):
        x = torch.randn(100000) * 2
        amax = torch.tensor(3.0)
        step = amax / 127
        expected = torch.clamp(torch.round(x / step), -127, 127) * step
        out = tq.fake_tensor_quant(x, amax, 8, False, True, "onnx")
        assert torch.equal(out, expected)

    def test_the_two_roundings_differ_by_at_most_one_step(self):
        x = torch.randn(200000)
        amax = torch.tensor(2.0)
        a = tq.fake_tensor_quant(x, amax, 8, False, True, "onnx")
        b = tq.fake_tensor_quant(x, amax, 8, False, True, "pytorch_quantization")
        assert (a - b).abs().max() <= amax / 127 * 1.0001

    def test_unknown_rounding_raises(self):
        with pytest.raises(ValueError, match="rounding"):
            tq.fake_tensor_quant(torch.randn(3), torch.tensor(1.0), 8, False, True, "banker")


class TestPerChannel:
    def test_axis0_weight_layout(self):
        w = torch.randn(16, 8, 3, 3)
        amax = w.abs().amax(dim=(1, 2, 3), keepdim=True) * 0.8
        expected, _ = multi_op_fake_quant(w, amax)
        out = tq.fake_tensor_quant(w, amax)
        assert out.shape == w.shape
        assert torch.equal(out, expected)

    def test_axis1_activation_layout(self):
        x = torch.randn(4, 6, 5, 5)
        amax = torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5, 3.0]).view(1, 6, 1, 1)
        expected, _ = multi_op_fake_quant(x, amax)
        assert torch.equal(tq.fake_tensor_quant(x, amax), expected)

    def test_last_axis(self):
        x = torch.randn(7, 9)
        amax = x.abs().amax(dim=0, keepdim=True)
        expected, _ = multi_op_fake_quant(x, amax)
        assert torch.equal(tq.fake_tensor_quant(x, amax), expected)

    def test_multi_axis_amax_uses_broadcasting(self):
        x = torch.randn(4, 6, 5)
        amax = x.abs().amax(dim=2, keepdim=True)  # (4, 6, 1): two axes keep their own amax
        expected, _ = multi_op_fake_quant(x, amax)
        assert torch.equal(tq.fake_tensor_quant(x, amax), expected)

    def test_zero_and_tiny_amax_channels_quantize_to_zero(self):
        x = torch.randn(3, 4, 5)
        amax = torch.tensor([1.0, 0.0, 1e-30]).view(3, 1, 1)
        out = tq.fake_tensor_quant(x, amax)
        assert torch.equal(out[1:], torch.zeros_like(out[1:]))
        assert out[0].abs().sum() > 0

    def test_zero_amax_per_tensor(self):
        out = tq.fake_tensor_quant(torch.randn(10), torch.tensor(0.0))
        assert torch.equal(out, torch.zeros(10))
        q, scale = tq.tensor_quant(torch.randn(10), torch.tensor(0.0))
        assert torch.equal(q, torch.zeros(10)) and scale.item() == 1.0


class TestDtypes:
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_low_precision_computed_in_fp32_returned_in_dtype(self, dtype):
        x = (torch.randn(3001) * 4).to(dtype)
        amax = torch.tensor(3.0)
        out = tq.fake_tensor_quant(x, amax)
        assert out.dtype == dtype
        expected, _ = multi_op_fake_quant(x.float(), amax)
        assert torch.equal(out, expected.to(dtype))

    def test_float64_inputs(self):
        x = torch.randn(100, dtype=torch.float64)
        out = tq.fake_tensor_quant(x, x.abs().max())
        assert out.dtype == torch.float64
        assert (out - x).abs().max() <= x.abs().max() / 127 / 2 + 1e-12

    def test_fp16_scale_overflow_is_reported(self):
        x = torch.randn(10).half()
        with pytest.raises(ValueError, match="scale is too large for FP16"):
            tq.tensor_quant(x, torch.tensor(1e-4).half(), 8, False)

    def test_channels_last_keeps_memory_format(self):
        x = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
        out = tq.fake_tensor_quant(x, torch.tensor(2.0))
        assert out.is_contiguous(memory_format=torch.channels_last)
        expected, _ = multi_op_fake_quant(x.contiguous(), torch.tensor(2.0))
        assert torch.equal(out.contiguous(), expected)

    def test_non_contiguous_input(self):
        x = torch.randn(6, 7, 8)[:, 2, ::2]
        assert not x.is_contiguous()
        expected, _ = multi_op_fake_quant(x, torch.tensor(1.5))
        assert torch.equal(tq.fake_tensor_quant(x, torch.tensor(1.5)), expected)

    def test_empty_tensor(self):
        out = tq.fake_tensor_quant(torch.empty(0, 3), torch.tensor(1.0))
        assert out.shape == (0, 3)


class TestBounds:
    @pytest.mark.parametrize(("num_bits", "unsigned", "narrow", "low", "high"), [
        (8, False, False, -128.0, 127.0), (8, False, True, -127.0, 127.0), (8, True, False, 0.0, 255.0),
        (4, False, False, -8.0, 7.0), (1, True, True, 0.0, 1.0)])
    def test_grid(self, num_bits, unsigned, narrow, low, high):
        assert tq.max_bound_of(num_bits, unsigned) == high
        assert tq.min_bound_of(num_bits, unsigned, narrow) == low

    def test_fp8_has_no_integer_grid(self):
        with pytest.raises(ValueError, match="has no integer grid"):
            tq.max_bound_of((4, 3), False)

    def test_affine_uses_the_full_signed_grid(self):
        x = torch.tensor([-1.0, -0.5, 0.0, 0.25, 1.0, 2.0])
        out = tq.fake_affine_tensor_quant(x, torch.tensor(-1.0), torch.tensor(1.0), 2)
        # 4 levels over [-1, 1]: step 2/3, zero point 0 after rounding -1.5 -> -2 + 2
        step = 2.0 / 3.0
        assert torch.allclose(out, torch.tensor([-2, -1, 0, 0, 1, 1]) * step)


class TestBackward:
    def test_straight_through_with_clipping(self):
        x = torch.tensor([-3.0, -1.0, -0.2, 0.0, 0.4, 1.0, 2.5], requires_grad=True)
        amax = torch.tensor(1.0)
        tq.fake_tensor_quant(x, amax).sum().backward()
        assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]

    def test_per_channel_gradient_mask(self):
        x = torch.randn(3, 10, requires_grad=True)
        amax = torch.tensor([0.1, 1.0, 10.0]).view(3, 1)
        grad = torch.randn(3, 10)
        tq.fake_tensor_quant(x, amax).backward(grad)
        expected = torch.where(x.detach().abs() <= amax, grad, torch.zeros_like(grad))
        assert torch.equal(x.grad, expected)

    def test_tensor_quant_backward_passes_gradient(self):
        x = torch.randn(4, 5, requires_grad=True)
        q, _ = tq.tensor_quant(x, x.detach().abs().max() / 2)
        q.sum().backward()
        inside = x.detach().abs() <= x.detach().abs().max() / 2
        assert torch.equal(x.grad != 0, inside)

    def test_fp16_gradient_dtype(self):
        x = torch.randn(8).half().requires_grad_()
        tq.fake_tensor_quant(x, torch.tensor(1.0)).float().sum().backward()
        assert x.grad.dtype == torch.float16


class TestErrors:
    def test_negative_amax(self):
        with pytest.raises(ValueError, match="Negative values in amax"):
            tq.fake_tensor_quant(torch.randn(4), torch.tensor(-1.0))

    def test_negative_per_channel_amax(self):
        with pytest.raises(ValueError, match="Negative values in amax"):
            tq.fake_tensor_quant(torch.randn(2, 4), torch.tensor([[1.0], [-0.5]]))

    def test_negative_input_for_unsigned(self):
        with pytest.raises(TypeError, match="Negative values encountered in unsigned quantization"):
            tq.fake_tensor_quant(torch.tensor([0.5, -0.1]), torch.tensor(1.0), 8, True)
        with pytest.raises(TypeError, match="Negative values encountered"):
            tq.tensor_quant(torch.tensor([0.5, -0.1]), torch.tensor(1.0), 8, True)

    def test_amax_that_does_not_broadcast(self):
        with pytest.raises(ValueError, match="does not broadcast"):
            tq.fake_tensor_quant(torch.randn(4, 5), torch.ones(3, 1))
        with pytest.raises(ValueError, match=r"amax of shape \(2, 4, 5\) does not broadcast"):
            tq.fake_tensor_quant(torch.randn(4, 5), torch.ones(2, 4, 5))
        with pytest.raises(ValueError, match="does not broadcast"):
            tq.tensor_quant(torch.randn(4, 5), torch.ones(4))

    def test_amax_that_broadcasts_is_accepted(self):
        x = torch.randn(4, 5)
        for amax in (torch.ones(5), torch.ones(4, 1), torch.ones(1, 5), torch.ones(1, 1)):
            assert tq.fake_tensor_quant(x, amax).shape == x.shape

    @pytest.mark.parametrize("case", ["float64", "multi_axis", "zero_bits", "legacy", "empty", "tensor_quant"])
    def test_negative_amax_on_every_cpu_path(self, case):
        """The check left the per-call argument checks; every way through the kernels still raises."""
        with pytest.raises(ValueError, match="Negative values in amax: the smallest is -0.5"):
            if case == "float64":  # torch reference path
                tq.fake_tensor_quant(torch.randn(2, 4, dtype=torch.float64), torch.tensor([[1.0], [-0.5]]))
            elif case == "multi_axis":  # amax over two axes: reference path
                tq.fake_tensor_quant(torch.randn(2, 3, 4), torch.tensor([[[1.0], [1.0], [1.0]],
                                                                         [[1.0], [-0.5], [1.0]]]))
            elif case == "zero_bits":
                tq.fake_tensor_quant(torch.randn(4), torch.tensor(-0.5), 0)
            elif case == "legacy":
                tq.legacy_fake_tensor_quant(torch.randn(4), torch.tensor(-0.5))
            elif case == "empty":
                tq.fake_tensor_quant(torch.randn(0, 4), torch.tensor(-0.5))
            else:
                tq.tensor_quant(torch.randn(4), -0.5)

    def test_negative_amax_without_the_host_check_quantizes_to_nan(self):
        """What a CUDA amax (not read back per call) gives: NaN outputs for that channel, not zeros."""
        x = torch.ones(2, 3)
        for rounding in ("pytorch_quantization", "onnx"):
            out = kernels.quantize_reference(x, torch.tensor([[1.0], [-0.5]]), 127.0, -127.0, rounding, True)
            assert torch.equal(out[0], torch.ones(3))
            assert torch.isnan(out[1]).all()

    def test_unknown_rounding(self):
        with pytest.raises(ValueError, match="rounding must be one of"):
            tq.fake_tensor_quant(torch.randn(4), torch.tensor(1.0), 8, False, True, "floor")
        with pytest.raises(ValueError, match="rounding must be one of"):
            tq.fake_tensor_quant(torch.randn(4), torch.tensor(1.0), 0, False, True, "floor")

    def test_integer_inputs(self):
        with pytest.raises(TypeError, match="floating point"):
            tq.fake_tensor_quant(torch.arange(5), torch.tensor(1.0))

    def test_bad_num_bits(self):
        with pytest.raises(ValueError, match="num_bits"):
            tq.fake_tensor_quant(torch.randn(5), torch.tensor(1.0), 99)


class TestDescriptor:
    def test_defaults_mirror_pytorch_quantization(self):
        d = QuantDescriptor()
        assert (d.num_bits, d.fake_quant, d.axis, d.amax, d.learn_amax, d.scale_amax, d.calib_method,
                d.unsigned, d.narrow_range) == (8, True, None, None, False, None, "max", False, False)

    def test_predefined(self):
        assert tq.QUANT_DESC_8BIT_PER_TENSOR.axis is None
        assert tq.QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned
        assert tq.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL.axis == 0
        assert tq.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW.axis == 0
        assert tq.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL.axis == 1

    def test_amax_stored_as_float32_array(self):
        d = QuantDescriptor(amax=[1.3, 1.4])
        assert isinstance(d.amax, np.ndarray) and d.amax.dtype == np.float32

    @pytest.mark.parametrize("kwargs, error, field", [
        ({"num_bits": "8"}, TypeError, "num_bits"),
        ({"num_bits": 8.0}, TypeError, "num_bits"),
        ({"num_bits": True}, TypeError, "num_bits"),
        ({"num_bits": (5, 2)}, TypeError, "num_bits"),
        ({"num_bits": -1}, ValueError, "num_bits"),
        ({"num_bits": 64}, ValueError, "num_bits"),
        ({"name": 3}, TypeError, "name"),
        ({"fake_quant": "yes"}, TypeError, "fake_quant"),
        ({"axis": "0"}, TypeError, "axis"),
        ({"axis": (0, 0)}, ValueError, "axis"),
        ({"amax": "oops"}, TypeError, "amax"),
        ({"amax": -1.0}, ValueError, "amax"),
        ({"amax": float("nan")}, ValueError, "amax"),
        ({"learn_amax": 1}, TypeError, "learn_amax"),
        ({"axis": 1, "learn_amax": True}, TypeError, "axis"),
        ({"scale_amax": -2.0}, ValueError, "scale_amax"),
        ({"scale_amax": "2"}, TypeError, "scale_amax"),
        ({"calib_method": "histgoram"}, ValueError, "calib_method"),
        ({"unsigned": None}, TypeError, "unsigned"),
        ({"narrow_range": "no"}, TypeError, "narrow_range"),
        ({"colour": "red"}, TypeError, "colour"),
    ])
    def test_bad_values_name_the_field(self, kwargs, error, field):
        with pytest.raises(error, match=field):
            QuantDescriptor(**kwargs)

    def test_dict_round_trip(self):
        d = QuantDescriptor(num_bits=4, name="w", axis=(1, 2), amax=[1.0, 2.0], unsigned=True, narrow_range=True,
                            calib_method="histogram", scale_amax=0.5)
        assert QuantDescriptor(**d.dict()) == d

    def test_yaml_round_trip(self):
        d = QuantDescriptor(num_bits=2, name="a", axis=(1, 2), amax=3.1415926536)
        assert QuantDescriptor.from_yaml(d.to_yaml()) == d

    def test_replace_validates(self):
        d = QuantDescriptor().replace(num_bits=4)
        assert d.num_bits == 4
        with pytest.raises(ValueError, match="calib_method"):
            QuantDescriptor().replace(calib_method="entropy")

    def test_e4m3_descriptor(self):
        assert QuantDescriptor(num_bits=(4, 3)).num_bits == (4, 3)


class TestKernelBackends:
    """The C kernel, its portable loops and the torch reference compute identical numbers."""

    @pytest.mark.skipif(not kernels.kernel_available(), reason="C kernel not built")
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("rounding", ["pytorch_quantization", "onnx"])
    @pytest.mark.parametrize("portable", [False, True])
    def test_c_kernel_equals_reference(self, dtype, rounding, portable):
        from workbench.quant.kernels import _cpu_kernels

        x = (torch.randn(300_017) * 3).to(dtype)  # odd size: vector body and scalar tail
        x[5] = float("nan")
        x[6] = float("inf")
        x[7] = -float("inf")
        amax = torch.tensor(2.0)
        _cpu_kernels.force_portable(portable)
        try:
            out, _ = kernels.quantize(x, amax, 127.0, -127.0, rounding=rounding)
            q, _ = kernels.quantize(x, amax, 127.0, -127.0, rounding=rounding, dequantize=False)
        finally:
            _cpu_kernels.force_portable(False)
        ref = kernels.quantize_reference(x, amax, 127.0, -127.0, rounding, True)
        ref_q = kernels.quantize_reference(x, amax, 127.0, -127.0, rounding, False)
        assert torch.equal(out.float().nan_to_num(), ref.float().nan_to_num())
        assert torch.isnan(out[5])
        assert torch.equal(q.float().nan_to_num(), ref_q.float().nan_to_num())

    @pytest.mark.skipif(not kernels.kernel_available(), reason="C kernel not built")
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("inner", [1, 3, 9, 27, 31])
    def test_short_rows_per_channel(self, dtype, inner):
        """Rows shorter than a vector, or with a 1-7 value tail (3x3x3 weights), as the reference computes
        them, and a negative value only in a tail is still reported."""
        x = (torch.rand(6, inner) * 3).to(dtype)
        x[4, -1] = -0.5
        amax = torch.tensor([[1.0], [2.0], [0.0], [3.0], [1.5], [0.25]])
        for rounding in ("pytorch_quantization", "onnx"):
            out, negative = kernels.quantize(x, amax, 127.0, -127.0, rounding=rounding, check_negative=True)
            ref = kernels.quantize_reference(x, amax, 127.0, -127.0, rounding, True)
            assert torch.equal(out, ref) and negative

    @pytest.mark.skipif(not kernels.kernel_available(), reason="C kernel not built")
    def test_parallel_split_per_channel(self):
        x = torch.randn(64, 40, 9, 9)  # > 2**17 elements: several threads, rows split across them
        amax = torch.rand(64, 1, 1, 1) + 0.1
        out, _ = kernels.quantize(x, amax, 127.0, -127.0)
        ref = kernels.quantize_reference(x, amax, 127.0, -127.0, "pytorch_quantization", True)
        assert torch.equal(out, ref)

    @pytest.mark.parametrize("rounding", ["pytorch_quantization", "onnx"])
    def test_a_negative_amax_gives_nan_parameters_where_it_is_not_read_back(self, rounding):
        """The CUDA path does not sync to check amax: a negative one must show as NaN, not quantize to 0."""
        a, b = kernels.quant_params(torch.tensor([-1.0, 0.0, 2.0]), 127.0, rounding)
        assert torch.isnan(a[0]) and torch.isnan(b[0])
        assert not torch.isnan(a[1:]).any() and not torch.isnan(b[1:]).any()

    @pytest.mark.skipif(not kernels.kernel_available(), reason="C kernel not built")
    @pytest.mark.parametrize("rounding", ["pytorch_quantization", "onnx"])
    @pytest.mark.parametrize("max_bound", [1.0, 7.0, 127.0, 255.0, 32767.0, 2.0 ** 31 - 1])
    def test_host_params_equal_quant_params(self, rounding, max_bound):
        """The C kernel's host-computed parameters are bit-identical to the torch ones the other paths use."""
        generator = torch.Generator().manual_seed(0)
        amax = torch.exp(torch.randn(100_000, generator=generator) * 8)
        amax[:4] = torch.tensor([0.0, 2.0 ** -24, 2.0 ** -23, float("inf")])
        a, b = kernels.quant_params(amax, max_bound, rounding)
        params = torch.from_numpy(kernels.host_params(amax, max_bound, rounding))
        assert torch.equal(params[:, 0], a) and torch.equal(params[:, 1], b)
        for i in range(0, amax.numel(), 97):  # the per-tensor path: plain Python floats
            pair = torch.tensor(kernels.scalar_params(amax[i].item(), max_bound, rounding))
            assert torch.equal(pair, torch.stack([a[i], b[i]])), amax[i]

    def test_backend_name(self):
        """The name says what runs: "torch" exactly when the extension is missing (tests/reliability/
        test_ci_scripts.py fails that case where a compiler exists), else the C kernel with AVX2 exactly
        when this x86-64 CPU has AVX2, FMA and F16C (a build that lost its AVX2 path is caught here)."""
        import platform

        if not kernels.kernel_available():
            assert kernels.backend_name() == "torch"
            return
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        if x86 and not Path("/proc/cpuinfo").is_file():  # no way to read the CPU's flags here
            assert kernels.backend_name() in ("c-avx2", "c-portable")
            return
        flags = set(re.findall(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)[0].split()) if x86 \
            else set()
        expected = "c-avx2" if x86 and {"avx2", "fma", "f16c"} <= flags else "c-portable"
        assert kernels.backend_name() == expected, flags & {"avx2", "fma", "f16c"}

    def test_fused_compiled_variant_matches_reference(self):
        """The torch.compile path CUDA uses, checked here with Inductor's CPU backend."""
        assert kernels.fused_matches_reference(torch.device("cpu"), torch.float32, "onnx", True)

    @pytest.mark.cuda
    def test_cuda_uses_the_verified_fused_kernel(self):
        x = torch.randn(64, 3, 8, 8, device="cuda")
        amax = x.abs().amax(dim=(1, 2, 3), keepdim=True)
        out = tq.fake_tensor_quant(x, amax, 8, False, True, "onnx")
        assert kernels.fused_status(x.device, torch.float32, "onnx", True, -127.0, 127.0)[0] is True
        assert torch.equal(out.cpu(), tq.fake_tensor_quant(x.cpu(), amax.cpu(), 8, False, True, "onnx"))

    @pytest.mark.cuda
    def test_cuda_matches_cpu(self):
        x = torch.randn(10000)
        amax = torch.tensor(1.5)
        assert torch.equal(tq.fake_tensor_quant(x.cuda(), amax.cuda()).cpu(), tq.fake_tensor_quant(x, amax))
