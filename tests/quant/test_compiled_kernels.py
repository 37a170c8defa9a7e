"""The torch.compile kernels CUDA uses, exercised with Inductor's CPU backend: their verification is
strict enough to refuse an inexact kernel, and a compiler failure falls back instead of raising."""
from __future__ import annotations

import logging
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.quant.kernels import compiled, ste
from workbench.quant.kernels import fake_quant as kernels


@pytest.fixture
def fresh_kernels(monkeypatch):
    """Empty kernel caches, so a test compiles its own (and leaves the process's caches alone)."""
    monkeypatch.setattr(kernels, "_kernels", {})
    monkeypatch.setattr(kernels, "_verified", {})
    monkeypatch.setattr(kernels, "_why_not", {})
    monkeypatch.setattr(kernels, "_engines", {})
    monkeypatch.setattr(ste, "_kernels", {})
    monkeypatch.setattr(ste, "_verified", {})
    monkeypatch.setattr(ste, "_why_not", {})
    monkeypatch.setattr(ste, "_engines", {})


def _divide_by_reciprocal(x, amax, lo: float, hi: float, max_bound: float, divide: bool, dequantize: bool,
                          out_dtype: torch.dtype):
    # what a compiler may turn x / step into: one reciprocal per step, then a multiply
    step = amax.float() / max_bound
    return (torch.clamp(torch.round(x.float() * torch.reciprocal(step)), lo, hi) * step).to(out_dtype)


def test_probe_finds_a_kernel_that_multiplies_by_the_reciprocal(fresh_kernels, monkeypatch, caplog):
    monkeypatch.setattr(kernels, "_fused_formula", _divide_by_reciprocal)
    with caplog.at_level(logging.WARNING):
        assert not kernels.fused_matches_reference(torch.device("cpu"), torch.float32, "onnx", True)
    message = kernels._why_not[("cpu", torch.float32, "onnx", True, -127.0, 127.0)]
    assert "elements differ from the CPU formula" in message
    assert "differs" in caplog.text


def test_exact_kernels_pass_and_status_says_so(fresh_kernels):
    for rounding in ("pytorch_quantization", "onnx"):
        assert kernels.fused_matches_reference(torch.device("cpu"), torch.bfloat16, rounding, True, -128.0, 127.0)
    kernels._verified[("cpu", torch.bfloat16, "onnx", True, -128.0, 127.0)] = True
    assert kernels.fused_status("cpu", torch.bfloat16, "onnx", True, -128.0, 127.0) == (
        True, "compiled kernel, verified bit for bit against the CPU formula")  # no Triton engine on CPU
    assert kernels.fused_status("cpu", torch.float16, "onnx", True) == (None, "not tried yet")


def test_probe_covers_every_rounding_boundary():
    inputs, amax = kernels.probe_tensors()
    assert inputs.shape[1] == amax.shape[1] and amax.min() == 0
    step = amax[0, 0, 0] / 127
    channel0 = inputs[:, 0, :].reshape(-1)
    ties = (torch.arange(-130, 130) + 0.5) * step
    assert torch.isin(ties, channel0).all()  # the exact boundaries themselves
    assert torch.isin(torch.nextafter(ties, torch.full_like(ties, 9e9)), channel0).all()


def test_compile_failure_falls_back_and_is_reported(fresh_kernels, monkeypatch, caplog):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no Triton for this GPU")

    monkeypatch.setattr(torch, "compile", broken_compile)
    with caplog.at_level(logging.WARNING):
        assert not kernels.fused_matches_reference(torch.device("cpu"), torch.float32, "pytorch_quantization", True)
        assert not ste.fused_matches_reference(torch.device("cpu"), torch.float16)
    assert "no Triton for this GPU" in kernels._why_not[("cpu", torch.float32, "pytorch_quantization", True, -127.0,
                                                         127.0)]
    assert "no Triton for this GPU" in ste._why_not[("cpu", torch.float16)]
    assert caplog.text.count("failed (RuntimeError: no Triton for this GPU)") == 2  # once per kernel


def test_recompile_limit_raised_for_our_kernel_then_never_raises(monkeypatch):
    """The H200 failure: FailOnRecompileLimitHit from fullgraph=True must not reach the caller. Past dynamo's
    limit the kernel compiles under its own higher one; past that, it returns None (the caller's reference)."""
    import torch._dynamo

    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 2)
    kernel = compiled.ElementwiseKernel(ste._ste_elementwise, "limit_test")
    x = torch.randn(64)
    with torch._dynamo.config.patch(recompile_limit=1):
        first = kernel(x, x, torch.ones(1))
        assert torch.equal(first, ste.ste_grad_reference(x, torch.tensor(1.0), x))
        half = kernel(x.half(), x.half(), torch.ones(1))  # a second graph: over dynamo's limit, within ours
        assert torch.equal(half, ste.ste_grad_reference(x.half(), torch.tensor(1.0), x.half()))
        assert kernel.error is None
        assert kernel(x.bfloat16(), x.bfloat16(), torch.ones(1)) is None  # a third: over ours too
    assert "recompile" in kernel.error.lower(), kernel.error
    assert kernel(x, x, torch.ones(1)) is None  # switched off for good: the caller's reference runs


def test_kernels_have_their_own_recompile_budget(fresh_kernels):
    """Per dtype and layout one kernel, each with its own dynamo cache: no dtype or layout churn."""
    for dtype in (torch.float32, torch.float16):
        for shape, amax in (((6, 5), torch.tensor(1.0)), ((6, 5), torch.rand(6, 1) + 0.5),
                            ((1, 5, 3), torch.rand(1, 5, 1) + 0.5)):
            x, g = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
            limits = ste.thresholds(x, amax)
            out = ste._run_compiled(x, g, limits, kernels.channel_layout(x.shape, amax.shape))
            assert torch.equal(out, ste.ste_grad_reference(x, amax, g))
    entries = {key: kernel.cache_entries() for key, kernel in ste.compiled_kernels().items()}
    assert len(entries) == 4 and all(count is None or count <= 4 for count in entries.values()), entries


class _DivisionRecorder(TorchDispatchMode):
    """Records the operand types of every aten.div call."""

    def __init__(self) -> None:
        super().__init__()
        self.divisions: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.div:
            self.divisions.append((type(args[0]).__name__, type(args[1]).__name__))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rounding", kernels.ROUNDINGS)
def test_parameters_divide_by_a_tensor_never_by_a_number(rounding):
    """On CUDA torch computes ``t / number`` as ``t * (1 / number)`` (one ulp off for some amax: the H200
    run's onnx step differed from the CPU's in 3% of the elements), so every division is tensor by tensor."""
    amax = torch.rand(7) + 0.1
    with _DivisionRecorder() as recorder:
        kernels.quant_params(amax, 127.0, rounding)
    assert recorder.divisions and all(divisor == "Tensor" for _, divisor in recorder.divisions), recorder.divisions


def test_compiled_formula_divides_by_graph_inputs_not_constants():
    """Inductor replaces division by a constant with a multiplication by its reciprocal on GPUs (not exact);
    the compiled formula gets max_bound as a tensor input, so every division in its graph has a runtime divisor."""
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    # a copy with its own code object: Dynamo keeps compiled graphs per code object, and in a whole-suite run the
    # product's kernels already compiled this formula: the call ran one of theirs and never reached ``capture``
    original = kernels._fused_formula
    copy = types.FunctionType(original.__code__.replace(co_name="_fused_formula_copy"), original.__globals__,
                              "_fused_formula_copy", original.__defaults__, original.__closure__)
    formula = torch.compile(copy, backend=capture, dynamic=True, fullgraph=True)
    x = torch.randn(4, 3, 8)
    amax = x.abs().amax(dim=(0, 2), keepdim=True)
    for divide in (True, False):
        out = formula(x, amax, -127.0, 127.0, kernels.bound_tensor(127.0, x.device), divide, True, torch.float32)
        assert torch.equal(out, kernels.quantize_reference(x, amax, 127.0, -127.0,
                                                           "onnx" if divide else "pytorch_quantization", True))
    assert graphs, "the formula was not compiled by this test's backend"
    divisors = [node.args[1] for graph in graphs for node in graph.graph.nodes
                if node.op == "call_function" and "div" in str(node.target)]
    assert len(divisors) >= 4 and all(isinstance(d, torch.fx.Node) for d in divisors), divisors


def test_status_is_found_under_either_spelling_of_the_device(fresh_kernels):
    """fused_status(torch.device("cuda")) must find what a call on a cuda:0 tensor recorded."""
    assert compiled.device_key("cpu") == "cpu"
    assert compiled.device_key(torch.device("cpu")) == "cpu"
    kernels._verified[(compiled.device_key("cpu"), torch.float32, "onnx", True, -127.0, 127.0)] = True
    assert kernels.fused_status(torch.device("cpu"), torch.float32, "onnx", True)[0] is True
    assert kernels.fused_status("cpu", torch.float16, "onnx", True)[0] is None


def test_triton_engine_is_checked_like_the_compiled_one(monkeypatch):
    """A Triton kernel that is one ulp off, or fails to launch, is refused with the reason (the GPU then
    tries the compiled kernel); a correct one passes the same probe."""
    def exact(x, amax, channels, inner, lo, hi, tiny, divide, dequantize):
        shape = (-1, channels, inner) if channels > 1 else (-1,)
        params = amax.reshape(1, channels, 1) if channels > 1 else amax.reshape(())
        rounding = "onnx" if divide else "pytorch_quantization"
        return kernels.quantize_reference(x.view(shape), params, hi, lo, rounding, dequantize).view(x.shape)

    monkeypatch.setattr(kernels.triton_kernels, "fake_quant", exact)
    assert kernels._probe_engine("triton", torch.device("cpu"), torch.float32, "onnx", True, -127.0, 127.0) is None
    monkeypatch.setattr(kernels.triton_kernels, "fake_quant",
                        lambda *args: torch.nextafter(exact(*args), torch.tensor(float("inf"))))
    problem = kernels._probe_engine("triton", torch.device("cpu"), torch.float32, "onnx", True, -127.0, 127.0)
    assert problem.startswith("triton kernel:") and "elements differ from the CPU formula" in problem
    monkeypatch.setattr(kernels.triton_kernels, "fake_quant", lambda *args: None)
    problem = kernels._probe_engine("triton", torch.device("cpu"), torch.float32, "onnx", True, -127.0, 127.0)
    assert problem.startswith("compile or run failed")


def test_triton_missing_means_no_triton_engine_and_no_error():
    try:
        import triton  # noqa: F401
    except ImportError:
        assert not kernels.triton_kernels.available() and not kernels.triton_kernels.ste_available()
        assert "triton" in (kernels.triton_kernels.error() or "").lower()
        assert kernels.triton_kernels.fake_quant(torch.ones(3), torch.ones(1), 1, 3, -127.0, 127.0, 1e-7, True,
                                                 True) is None
    else:
        pytest.skip("Triton is installed here: the GPU tests cover its kernels")
