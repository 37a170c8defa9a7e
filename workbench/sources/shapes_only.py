"""Runs of a model on shapes only: what opening a lazily held checkpoint needs of a sample forward.

Opening a project runs the model on a sample input several times: ``new`` checks that the data fits the model, and
every build of the quantized model records which functional operations the forward calls, what each module
receives (to trace and check it) and the dtype of every value (integer tensors get no quantizer). None of that needs
a weight's values, only shapes and dtypes: with the weights of a lazily opened checkpoint on meta and the sample
moved to meta, the same forward runs in milliseconds per block and reads nothing from the checkpoint, where a real
one reads the whole checkpoint and computes a full forward (a 7B decoder: minutes, 13.5 GB read).

The forwards run on plain meta tensors first. When that fails they run again under torch's ``FakeTensorMode``
(:func:`shapes_mode`), as ``torch.onnx.enable_fake_mode`` and ``torch.export`` do: tensors made inside the forward
(``arange`` position ids) are fake too, and transformers recognises fake tensors as tracing and skips its checks of
values (its packed-sequence detection, run without an attention mask and a cache, calls ``.all()`` on the position
ids, which plain meta tensors refuse). Fake tensors cost a Python dispatch per operation (a 0.5B LLaMA's build:
about 40 000, tens of seconds), plain meta ones next to nothing, hence the order. What the runs keep (a module's
arguments) is turned back into plain meta tensors (:func:`plain_meta`), so that no fake tensor outlives its mode.

What is given up: a traced module is checked against its original on shapes and dtypes only (values cannot be
compared on meta). A model whose forward needs values (``.item()``, a branch on a tensor) fails on meta; the caller
then runs it on the real weights, as before (:func:`run_on_shapes_first`).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["on_meta", "on_shapes", "plain_meta", "run_on_shapes_first", "shapes_mode"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
# whether shapes_mode fakes the tensors: set by run_on_shapes_first for its second try (per thread and task)
_FAKE: contextvars.ContextVar[bool] = contextvars.ContextVar("workbench_fake_shapes", default=False)


def on_meta(value: Any) -> Any:
    """``value`` (a tensor, or tuples, lists and dicts of them) with every tensor on meta: same shapes and dtypes,
    no data."""
    return tree_map(lambda item: item.to("meta") if isinstance(item, torch.Tensor) else item, value)


def on_shapes(value: Any) -> bool:
    """Whether ``value`` (a sample input, a module's arguments) holds a meta tensor: a run on shapes only."""
    return any(isinstance(item, torch.Tensor) and item.is_meta for item in tree_flatten(value)[0])


@contextlib.contextmanager
def shapes_mode(value: Any) -> Iterator[None]:
    """Around a forward on ``value``: torch's ``FakeTensorMode`` when it is a run on shapes only and the run on plain
    meta tensors failed (see the module's docstring; meta weights and real buffers are taken as they are), nothing
    otherwise."""
    if not _FAKE.get() or not on_shapes(value):
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            yield
    finally:
        _forget_weights(mode)


def _forget_weights(mode: Any) -> None:
    """Drop what ``mode`` remembers of the real tensors it met (weak references to the model's parameters): a
    lazily opened checkpoint swaps weights into those parameters later, which ``torch.utils.swap_tensors`` refuses
    while a weak reference to them lives (and the mode lives on in a traceback when the forward failed)."""
    converter = getattr(mode, "fake_tensor_converter", None)
    meta = getattr(converter, "meta_converter", None)
    describer = getattr(meta, "describer", None)
    for owner, name in ((converter, "tensor_memo"), (meta, "storage_memo"), (meta, "tensor_memo"),
                        (describer, "lookup_tensor"), (describer, "lookup_storage")):
        table = getattr(owner, name, None)
        if hasattr(table, "clear"):
            table.clear()


def plain_meta(tensor: torch.Tensor) -> torch.Tensor:
    """A plain meta tensor with ``tensor``'s shape, strides and dtype (a fake tensor's, kept past its mode)."""
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")


def run_on_shapes_first(on_shapes: Callable[[], T], on_values: Callable[[], T], what: str) -> T:
    """``on_shapes()`` (the run on meta: plain meta tensors, then fake ones); when both fail (a forward that needs
    values), ``on_values()`` (the run on the real weights), whose result and errors are the ones the caller gets.
    ``what`` names the run in the log."""
    for fake in (False, True):
        token = _FAKE.set(fake)
        try:
            return on_shapes()
        except Exception as error:  # the user's forward on meta: anything can be raised
            logger.info("%s on shapes only (%s) failed (%s: %s)", what, "fake tensors" if fake else "meta tensors",
                        type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        finally:
            _FAKE.reset(token)
    logger.info("%s: running it on the weights", what)
    return on_values()
