"""torch's function-mode stack left as it was around a call that may push modes and fail half-way."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["function_modes_kept"]


@contextlib.contextmanager
def function_modes_kept() -> Iterator[None]:
    """Leave torch's function-mode stack (per thread) as it was, whatever the block does.

    A mode exits by popping the top of that stack, whichever mode it is. When torch.export fails inside a module
    whose hooks pushed a mode of ours (the run-time quantizers), its own handler's exit pops ours, and its handler
    stays on the stack for good: every later torch call of the thread went through torch.export's handler, and
    every ``torch.compile``d kernel traced it (the fused fake-quant kernels lost their divisions)."""
    from torch.overrides import _get_current_function_mode_stack  # no public reader; in every torch 2 release

    before = _get_current_function_mode_stack()
    try:
        yield
    finally:
        now = _get_current_function_mode_stack()
        if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
            while torch._C._len_torch_function_stack():
                torch._C._pop_torch_function_stack()
            for mode in before:
                torch._C._push_on_torch_function_stack(mode)
