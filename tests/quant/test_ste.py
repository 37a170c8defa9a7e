"""The fused straight-through-estimator backward returns the reference's gradient bit for bit."""
from __future__ import annotations

import pytest
import torch

from workbench.quant import tensor_quant as tq
from workbench.quant.kernels import fake_quant as kernels
from workbench.quant.kernels import ste

needs_kernel = pytest.mark.skipif(not kernels.kernel_available(), reason="C kernel not built")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so NaN payloads and -0 count too."""
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16)


def tricky(shape, dtype, scale=2.0):
    """Random values plus the ones that decide a straight-through gradient: exactly at the threshold,
    one float16 step above it, NaN and Inf inputs, and NaN / -0 / Inf gradients."""
    x = torch.randn(shape) * scale
    g = torch.randn(shape)
    x.view(-1)[:5] = torch.tensor([1.0, -1.0, 1.0009766, float("nan"), -float("inf")])
    g.view(-1)[:3] = torch.tensor([float("nan"), -0.0, float("inf")])
    return x.to(dtype), g.to(dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("shape,amax_shape", [
    ((300_017,), ()),                   # per tensor, several threads, a 1-7 value tail
    ((64, 3, 3, 3), (64, 1, 1, 1)),     # per channel, rows of 27 (tail only on some rows)
    ((5, 33, 7), (1, 33, 1)),           # per channel on a middle axis
    ((4, 6), (4, 1)),                   # rows shorter than a vector
])
def test_c_kernel_gradient_equals_reference(dtype, portable, shape, amax_shape):
    from workbench.quant.kernels import _cpu_kernels

    x, g = tricky(shape, dtype)
    amaxes = [torch.full(amax_shape, 1.0), torch.full(amax_shape, 1.0006), torch.rand(amax_shape) * 3,
              torch.full(amax_shape, 1.0006, dtype=torch.float64), torch.zeros(amax_shape)]
    _cpu_kernels.force_portable(portable)
    try:
        for amax in amaxes:
            fused = ste.ste_grad(x, amax, g)
            reference = ste.ste_grad_reference(x, amax, g)
            assert fused.dtype == reference.dtype and fused.shape == reference.shape
            assert torch.equal(bits(fused), bits(reference)), (amax.dtype, tuple(amax.shape))
    finally:
        _cpu_kernels.force_portable(False)


def test_threshold_follows_torch_promotion():
    """A 0-dim float32 amax against float16 inputs is compared in float16 (torch rounds amax first); a
    1-element amax with dimensions is compared in float32. Both as torch does."""
    x = torch.full((20,), 1.0009766, dtype=torch.float16)  # 1 + 2**-10: one float16 step above 1
    g = torch.ones(20, dtype=torch.float16)
    assert ste.ste_grad(x, torch.tensor(1.0006), g).tolist() == [1.0] * 20  # 1.0006 rounds to 1 + 2**-10
    assert ste.ste_grad(x, torch.tensor([1.0006]), g).tolist() == [0.0] * 20  # compared in float32


@needs_kernel
def test_layouts_and_strided_gradients():
    """channels_last inputs and a gradient that is an expanded view (what y.sum().backward() hands in)."""
    x, _ = tricky((8, 16, 5, 5), torch.float32)
    x = x.contiguous(memory_format=torch.channels_last)
    for amax in (torch.tensor(1.5), torch.rand(1, 16, 1, 1) * 2):
        for g in (torch.ones(()).expand(x.shape), torch.randn(8, 16, 5, 5)):
            assert torch.equal(bits(ste.ste_grad(x, amax, g)), bits(ste.ste_grad_reference(x, amax, g)))


def test_unsupported_cases_use_the_reference():
    """float64, a gradient of another dtype and multi-axis amax give the reference's values."""
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    g = torch.randn(6, 4, 3, dtype=torch.float64)
    amax = torch.tensor(0.7, dtype=torch.float64)
    assert torch.equal(ste.ste_grad(x, amax, g), ste.ste_grad_reference(x, amax, g))
    xf = x.float()
    assert torch.equal(ste.ste_grad(xf, torch.tensor(0.7), g), ste.ste_grad_reference(xf, torch.tensor(0.7), g))
    two_axes = torch.rand(6, 4, 1) + 0.2
    assert torch.equal(ste.ste_grad(xf, two_axes, g.float()), ste.ste_grad_reference(xf, two_axes, g.float()))


@pytest.mark.parametrize("axis_amax", [False, True])
def test_autograd_through_fake_quant_uses_the_fused_gradient(axis_amax):
    """What training sees: the gradient of fake_tensor_quant equals the reference STE, zero outside amax."""
    x = (torch.randn(32, 8, 4, 4) * 2).requires_grad_(True)
    amax = torch.rand(1, 8, 1, 1) + 0.5 if axis_amax else torch.tensor(1.0)
    g = torch.randn(32, 8, 4, 4)
    (grad,) = torch.autograd.grad(tq.fake_tensor_quant(x, amax), x, g)
    assert torch.equal(grad, ste.ste_grad_reference(x.detach(), amax, g))
    outside = x.detach().abs() > amax
    assert outside.any() and (grad[outside] == 0).all() and torch.equal(grad[~outside], g[~outside])


def test_compiled_kernel_matches_reference():
    """The torch.compile kernel CUDA uses, checked here with Inductor's CPU backend."""
    assert ste.fused_matches_reference(torch.device("cpu"), torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_gradient_equals_reference(dtype):
    x, g = tricky((64, 3, 8, 8), dtype)
    x, g = x.cuda(), g.cuda()
    for amax in (torch.tensor(1.0006, device="cuda"), torch.rand(64, 1, 1, 1, device="cuda") * 3):
        fused = ste.ste_grad(x, amax, g)
        assert ste.fused_status(x.device, dtype)[0] is True, ste.fused_status(x.device, dtype)[1]
        assert torch.equal(bits(fused), bits(ste.ste_grad_reference(x, amax, g)))
        assert torch.equal(bits(fused.cpu()), bits(ste.ste_grad_reference(x.cpu(), amax.cpu(), g.cpu())))
