"""Running a model on batches as data loaders yield them; comparing outputs.

Shared by calibration (:mod:`workbench.quant.calibrate`), analysis and export, so that all of them
agree on what a batch means and how an output is flattened.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["model_inputs", "batch_targets", "to_device", "run_model", "flat_tensors", "class_scores", "sqnr_db",
           "model_device"]

_TARGET_KEYS = ("labels", "label", "targets", "target")


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a stateless model)."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def model_inputs(batch: Any) -> tuple[tuple, dict]:
    """The positional and keyword arguments a batch gives the model.

    A tensor is the single input; a tuple or list is ``(inputs, targets...)`` whose first element is
    the input (or a tuple of inputs), as data loaders yield it; a mapping is keyword arguments.
    """
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)) and len(batch) > 0:
        first = batch[0]
        if isinstance(first, (tuple, list)):
            return tuple(first), {}
        if isinstance(first, Mapping):
            return (), dict(first)
        return (first,), {}
    raise TypeError(f"A batch must be a tensor, a (inputs, targets) tuple or a dict of inputs, "
                    f"got {type(batch).__name__}.")


def batch_targets(batch: Any) -> Any:
    """The targets of a batch: the second element of an ``(inputs, targets)`` pair, a dict's
    ``labels``/``targets`` entry, or None for an unlabelled batch."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[1]
    if isinstance(batch, Mapping):
        for key in _TARGET_KEYS:
            if key in batch:
                return batch[key]
    return None


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (nested tuples, lists, dicts) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, Mapping):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def run_model(model: nn.Module, batch: Any, device: torch.device) -> Any:
    """Call the model on one batch (see :func:`model_inputs`) on ``device``."""
    args, kwargs = model_inputs(batch)
    return model(*to_device(args, device), **to_device(kwargs, device))


def flat_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a model output (a tensor, or tuples, lists and dicts of them), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        return [t for v in output.values() for t in flat_tensors(v)]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in flat_tensors(v)]
    return []


def class_scores(output: Any) -> torch.Tensor:
    """The class scores in a model output: its ``logits`` entry, else its first tensor."""
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    tensors = flat_tensors(output)
    if not tensors:
        raise ValueError("The model's output holds no tensor of class scores.")
    return tensors[0]


def sqnr_db(reference: Any, quantized: Any) -> float | None:
    """Signal-to-quantization-noise ratio of ``quantized`` against ``reference`` in dB (inf if equal)."""
    ref, test = flat_tensors(reference), flat_tensors(quantized)
    if not ref or len(ref) != len(test):
        return None
    signal = sum(float(r.double().pow(2).sum()) for r in ref)
    noise = sum(float((r.double() - t.double()).pow(2).sum()) for r, t in zip(ref, test))
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10 * math.log10(signal / noise)
