"""Traces in two threads at once (the GUI's job thread rebuilding while another job traces) must not leave torch.fx's
wrapper on nn.Module: before the guard, every later forward in the process failed with "module is not installed as a
submodule" until the app restarted (found driving the GUI: Apply, Export, Undo apply, then Calibrate)."""
from __future__ import annotations

import inspect
import math
import threading
import time

import torch
from torch import fx, nn

from workbench.graph import fx_guard
from workbench.graph.trace import QuantTracer


def _wrapped_scale(x: torch.Tensor) -> torch.Tensor:
    return x.matmul(x.transpose(-2, -1))


fx.wrap("_wrapped_scale")


class _Slow(nn.Module):
    """A forward that holds its trace open long enough for the other thread's to start."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return _wrapped_scale(self.linear(x))


def _trace_in_two_threads(tracer_class: type) -> list[BaseException]:
    errors: list[BaseException] = []

    def trace(seconds: float) -> None:
        try:
            tracer_class().trace(_Slow(seconds))
        except BaseException as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    first = threading.Thread(target=trace, args=(0.4,))
    second = threading.Thread(target=trace, args=(0.8,))
    first.start()
    time.sleep(0.1)
    second.start()
    first.join()
    second.join()
    return errors


def test_overlapping_traces_run_one_after_the_other_and_leave_modules_callable():
    original = nn.Module.__call__
    assert _trace_in_two_threads(QuantTracer) == []
    assert nn.Module.__call__ is original and not fx._symbolic_trace.is_fx_symbolic_tracing()
    model = nn.Sequential(nn.Linear(4, 4))
    assert model(torch.ones(1, 4)).shape == (1, 4)


def test_a_wrapper_left_by_someone_elses_traces_is_put_back_after_the_next_guarded_one(caplog):
    original, builtin_ceil, wrapped = nn.Module.__call__, math.ceil, _wrapped_scale
    try:
        _trace_in_two_threads(fx.Tracer)  # plain fx, as a library's own tracing would run: leaves its wrapper
        assert nn.Module.__call__ is not original
        assert globals()["_wrapped_scale"] is not wrapped  # so is the function given to torch.fx.wrap
        graph = QuantTracer().trace(_Slow(0.0))
        assert nn.Module.__call__ is original and globals()["_wrapped_scale"] is wrapped
        # the trace itself recorded the function, not the wrapper left behind (whose code computes nothing: the
        # products inside stayed float, torchvision's Swin in CI's order)
        assert [n.target for n in graph.nodes if n.op == "call_function"] == [wrapped]
        assert math.ceil is builtin_ceil and inspect.isbuiltin(math.sqrt)  # what torch.export's verifier requires
        assert not fx._symbolic_trace.is_fx_symbolic_tracing()  # set, torch.compile'd functions refuse to run
        assert torch.compile(torch.sin, backend="eager")(torch.zeros(1)).item() == 0.0
        assert "left nn.Module.__call__" in caplog.text
        assert nn.Sequential(nn.Linear(4, 4))(torch.ones(1, 4)).shape == (1, 4)
    finally:
        fx_guard.restore_module_methods()
