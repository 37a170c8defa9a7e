"""torch.fx tracing, one at a time in the process, leaving ``nn.Module`` as it found it.

Symbolic tracing patches ``nn.Module.__call__`` and ``nn.Module.__getattr__`` for the whole process while it runs,
and puts back what it saw when it started. Two traces overlapping in two threads (the GUI rebuilding a model on its
job thread while another job traces) therefore leave the first trace's wrapper installed for good: every later
forward anywhere in the process fails with fx's "NameError: module is not installed as a submodule" until the
program restarts. :class:`GuardedTracer` runs one trace at a time and, after each, checks that the two methods are
torch's own again, putting them back (with a warning) when something else's trace left them patched.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from torch import fx, nn

__all__ = ["GuardedTracer", "restore_module_methods"]

logger = logging.getLogger(__name__)

_TRACING = threading.RLock()  # re-entrant: a tracer's leaf decision may trace a submodule on the same thread
_DEPTH = threading.local()  # this thread's nesting of traces (1: the outermost)
_ORIGINAL = {"__call__": nn.Module.__call__, "__getattr__": nn.Module.__getattr__}


def restore_module_methods() -> list[str]:
    """Put torch's own ``nn.Module.__call__``/``__getattr__`` back where a trace left its wrappers; returns the
    names that were patched (empty when none was). Only call it when no trace is running."""
    patched = [name for name, method in _ORIGINAL.items() if nn.Module.__dict__.get(name) is not method]
    for name in patched:
        setattr(nn.Module, name, _ORIGINAL[name])
    return patched


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
                        logger.warning("torch.fx left nn.Module.%s patched (a trace ran in another thread at the "
                                       "same time); put torch's own back", " and ".join(patched))
