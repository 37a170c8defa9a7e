"""torch.fx tracing, one at a time in the process, leaving ``nn.Module`` as it found it.

Symbolic tracing patches ``nn.Module.__call__``, ``nn.Module.__getattr__`` and the functions of ``math`` (its
"autowrap" module) for the whole process while it runs, and puts back what it saw when it started. Two traces
overlapping in two threads (the GUI rebuilding a model on its job thread while another job traces) therefore leave
the first trace's wrapper installed for good: every later forward anywhere in the process fails with fx's
"NameError: module is not installed as a submodule" until the program restarts (and torch.export refuses every
graph: its verifier finds ``math.ceil`` no builtin). :class:`GuardedTracer` runs one trace at a time and, after
each, checks that those are torch's and Python's own again, putting them back (with a warning) when something else's
trace left them patched."""
from __future__ import annotations

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


def restore_module_methods() -> list[str]:
    """Put torch's own ``nn.Module.__call__``/``__getattr__`` and Python's ``math`` functions back where a trace
    left its wrappers, and clear fx's tracing flag; returns what was left (empty when nothing was). Only call it when
    no trace is running."""
    methods = [name for name, method in _ORIGINAL.items() if nn.Module.__dict__.get(name) is not method]
    for name in methods:
        setattr(nn.Module, name, _ORIGINAL[name])
    changed = [name for name, value in _MATH.items() if vars(math).get(name) is not value]
    for name in changed:
        setattr(math, name, _MATH[name])
    left = [f"nn.Module.{name}" for name in methods] + [f"math.{name}" for name in changed]
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
            try:
                return super().trace(root, concrete_args)
            finally:
                _DEPTH.value -= 1
                if _DEPTH.value == 0:  # the outermost trace of the one thread tracing: nothing else patches now
                    patched = restore_module_methods()
                    if patched:
                        logger.warning("torch.fx left %s patched (a trace ran in another thread at the same time); "
                                       "put the originals back", ", ".join(patched))
