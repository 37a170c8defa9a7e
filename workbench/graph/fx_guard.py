"""torch.fx tracing, one at a time in the process, leaving ``nn.Module`` as it found it.

Symbolic tracing patches ``nn.Module.__call__``, ``nn.Module.__getattr__`` and the functions of ``math`` (its
"autowrap" module) for the whole process while it runs, and puts back what it saw when it started. Two traces
overlapping in two threads (the GUI rebuilding a model on its job thread while another job traces) therefore leave
the first trace's wrapper installed for good: every later forward anywhere in the process fails with fx's
"NameError: module is not installed as a submodule" until the program restarts (and torch.export refuses every
graph: its verifier finds ``math.ceil`` no builtin). The same race leaves fx's wrapper on the functions given to
``torch.fx.wrap`` (torchvision's ``shifted_window_attention``): a later trace records the stale wrapper, whose code
computes nothing, and the attention products inside the real function stay float. :class:`GuardedTracer` runs one
trace at a time and, before and after each, checks that those are torch's, Python's and the model's own again,
putting them back (with a warning) when something else's trace left them patched."""
from __future__ import annotations

import builtins
import inspect
import logging
import math
import threading
from typing import Any

from torch import fx, nn
from torch.fx import _symbolic_trace

__all__ = ["GuardedTracer", "restore_module_methods"]

logger = logging.getLogger(__name__)

_TRACING = threading.RLock()  # re-entrant: a tracer's leaf decision may trace a submodule on the same thread
_DEPTH = threading.local()  # this thread's nesting of traces (1: the outermost)
_ORIGINAL = {"__call__": nn.Module.__call__, "__getattr__": nn.Module.__getattr__}
_MATH = {name: value for name, value in vars(math).items() if inspect.isbuiltin(value)}


# the code of fx's wrappers (one code object per kind, whatever they wrap): how a patch left behind is recognised
_WRAPPER_CODES = (_symbolic_trace._create_wrapped_func(len).__code__,
                  _symbolic_trace._create_wrapped_method(str, "upper").__code__)


def _is_fx_wrapper(value: object) -> bool:
    return getattr(value, "__code__", None) in _WRAPPER_CODES and hasattr(value, "__wrapped__")


def _unwrapped(value: object) -> object:
    while _is_fx_wrapper(value):
        value = value.__wrapped__  # type: ignore[attr-defined]
    return value


def _restore_wrapped_functions() -> list[str]:
    """Put back the functions given to ``torch.fx.wrap`` (and the methods fx wraps) where a trace left its
    wrapper; returns their names."""
    left = []
    for (_, name), frame_dict in list(_symbolic_trace._wrapped_fns_to_patch.items()):
        value = frame_dict.get(name)
        if not _is_fx_wrapper(value):
            continue
        original = _unwrapped(value)
        if original is getattr(builtins, name, None):
            del frame_dict[name]  # fx wrapped a builtin by setting the module's global: it had none
        else:
            frame_dict[name] = original
        left.append(f"{frame_dict.get('__name__', '?')}.{name}")
    for cls, name in list(_symbolic_trace._wrapped_methods_to_patch):
        value = cls.__dict__.get(name)
        if _is_fx_wrapper(value):
            setattr(cls, name, _unwrapped(value))
            left.append(f"{cls.__name__}.{name}")
    return left


def restore_module_methods() -> list[str]:
    """Put torch's own ``nn.Module.__call__``/``__getattr__``, Python's ``math`` functions and the functions given
    to ``torch.fx.wrap`` back where a trace left its wrappers, and clear fx's tracing flag; returns what was left
    (empty when nothing was). Only call it when no trace is running."""
    methods = [name for name, method in _ORIGINAL.items() if nn.Module.__dict__.get(name) is not method]
    for name in methods:
        setattr(nn.Module, name, _ORIGINAL[name])
    changed = [name for name, value in _MATH.items() if vars(math).get(name) is not value]
    for name in changed:
        setattr(math, name, _MATH[name])
    left = [f"nn.Module.{name}" for name in methods] + [f"math.{name}" for name in changed]
    left += _restore_wrapped_functions()
    # a private module flag (torch 2.x: torch.fx._symbolic_trace); is_fx_tracing() is the public reading of it
    if getattr(_symbolic_trace, "_is_fx_tracing_flag", False):
        _symbolic_trace._is_fx_tracing_flag = False
        left.append("torch.fx's tracing flag")
    return left


class GuardedTracer(fx.Tracer):
    """An ``fx.Tracer`` whose traces run one at a time in the process (see the module's docstring)."""

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        with _TRACING:
            _DEPTH.value = getattr(_DEPTH, "value", 0) + 1
            if _DEPTH.value == 1:  # a wrapper left before this trace would be recorded in its graph
                _warn_if_patched(restore_module_methods())
            try:
                return super().trace(root, concrete_args)
            finally:
                _DEPTH.value -= 1
                if _DEPTH.value == 0:  # the outermost trace of the one thread tracing: nothing else patches now
                    _warn_if_patched(restore_module_methods())


def _warn_if_patched(patched: list[str]) -> None:
    if patched:
        logger.warning("torch.fx left %s patched (a trace ran in another thread at the same time); put the "
                       "originals back", ", ".join(patched))
