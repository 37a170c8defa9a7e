"""Runs of a model on shapes only: what opening a lazily held checkpoint needs of a sample forward.

Opening a project runs the model on a sample input several times: ``new`` checks that the data fits the model, and
every build of the quantized model records which functional operations the forward calls, what each module
receives (to trace and check it) and the dtype of every value (integer tensors get no quantizer). None of that needs
a weight's values, only shapes and dtypes: with the weights of a lazily opened checkpoint on meta and the sample
moved to meta, the same forward runs in milliseconds per block and reads nothing from the checkpoint, where a real
one reads the whole checkpoint and computes a full forward (a 7B decoder: minutes, 13.5 GB read).

What is given up: a traced module is checked against its original on shapes and dtypes only (values cannot be
compared on meta). A model whose forward needs values (``.item()``, a branch on a tensor) fails on meta; the caller
then runs it on the real weights, as before (:func:`run_on_shapes_first`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_map

__all__ = ["on_meta", "run_on_shapes_first"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def on_meta(value: Any) -> Any:
    """``value`` (a tensor, or tuples, lists and dicts of them) with every tensor on meta: same shapes and dtypes,
    no data."""
    return tree_map(lambda item: item.to("meta") if isinstance(item, torch.Tensor) else item, value)


def run_on_shapes_first(on_shapes: Callable[[], T], on_values: Callable[[], T], what: str) -> T:
    """``on_shapes()`` (the run on meta); when it fails (a forward that needs values), ``on_values()`` (the run on
    the real weights), whose result and errors are the ones the caller gets. ``what`` names the run in the log."""
    try:
        return on_shapes()
    except Exception as error:  # the user's forward on meta: anything can be raised
        logger.info("%s on shapes only failed (%s: %s); running it on the weights", what, type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "")
    return on_values()
