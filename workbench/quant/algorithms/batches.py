"""Running a model on batches as data loaders yield them; comparing outputs.

Shared by calibration (:mod:`workbench.quant.algorithms.calibrate`), analysis and export, so that all of them
agree on what a batch means and how an output is flattened.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["model_inputs", "batch_targets", "to_device", "run_model", "flat_tensors", "class_scores", "sqnr_db",
           "sqnr_powers", "model_device", "select_output", "output_keys", "first_samples", "input_shapes"]

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
    the input (a tensor, a tuple of inputs, or a dict of keyword inputs), as data loaders yield it; a
    mapping is keyword arguments (``input_ids``, ``attention_mask``...) except its ``labels``/``targets``
    entry, which is the batch's targets (see :func:`batch_targets`), not an input: a Hugging Face model
    given ``labels`` would compute a loss and change its output.
    """
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, Mapping):
        return (), {k: v for k, v in batch.items() if k not in _TARGET_KEYS}
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)) and len(batch) > 0:
        first = batch[0]
        if isinstance(first, (tuple, list)):
            return tuple(first), {}
        if isinstance(first, Mapping):
            return (), {k: v for k, v in first.items() if k not in _TARGET_KEYS}
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


def to_device(value: Any, device: torch.device | None, copy: bool = False) -> Any:
    """``value`` with every tensor in it (nested tuples, lists, dicts) moved to ``device`` (None: where it
    is); with ``copy``, every tensor is a new one even where it is on ``device`` already (one copy either way)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True, copy=copy)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device, copy) for v in value)
    if isinstance(value, Mapping):
        return {k: to_device(v, device, copy) for k, v in value.items()}
    return value


def run_model(model: nn.Module, batch: Any, device: torch.device) -> Any:
    """Call the model on one batch (see :func:`model_inputs`) on ``device``.

    The model gets its own copy of the inputs: a model that changes its input in place (``x.mul_(...)``,
    ``relu_`` on the input) must not change the batch that the next pass (INT8 after FP32, the next epoch, a
    cached data source) reads. The copy costs one memory copy of the inputs per call (bench/input_copy.py).
    """
    args, kwargs = model_inputs(batch)
    return model(*to_device(args, device, copy=True), **to_device(kwargs, device, copy=True))


def first_samples(inputs: Any, count: int) -> Any:
    """``inputs`` (a tensor, or tuples, lists and dicts of them) cut to their first ``count`` samples."""
    if isinstance(inputs, torch.Tensor):
        return inputs[:count] if inputs.dim() > 0 else inputs
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(first_samples(v, count) for v in inputs)
    if isinstance(inputs, Mapping):
        return {k: first_samples(v, count) for k, v in inputs.items()}
    return inputs


def input_shapes(args: tuple, kwargs: dict) -> str:
    """``"(2, 3, 8, 8) float32"`` or ``"input_ids (2, 16) int64, attention_mask (2, 16) int64"``, for messages."""
    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
        return type(value).__name__
    parts = [one(v) for v in args] + [f"{k} {one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "no inputs"


def output_keys(output: Any) -> list[str]:
    """The names :func:`select_output` accepts for ``output``: dict / ModelOutput keys, or tuple indices."""
    if isinstance(output, Mapping):
        return [str(k) for k in output.keys()]
    if isinstance(output, (tuple, list)):
        return [str(i) for i in range(len(output))]
    return []


def select_output(output: Any, key: str | None = None) -> Any:
    """The part of a model output that metrics, sensitivity, parity checks and export compare.

    With ``key``: that entry (a dict or ``ModelOutput`` key such as ``logits``, or a tuple index such as
    ``"0"``). Without: a tensor, or a tuple/list of tensors only (a plain multi-output model), is kept
    whole; any other output (a dict, a Hugging Face ``ModelOutput``, nested structures, outputs holding
    a cache object or None) gives its first tensor (``logits``, ``last_hidden_state``...), so caches
    and auxiliary outputs are never compared.

    Raises:
        ValueError: ``key`` names no entry (the message lists the names there are), or the output
            holds no tensor.
    """
    if key is not None and key != "":
        picked: Any = None
        if isinstance(output, Mapping):
            picked = output.get(key)
        elif isinstance(output, (tuple, list)) and str(key).lstrip("-").isdigit() and \
                -len(output) <= int(key) < len(output):
            picked = output[int(key)]
        elif not isinstance(output, torch.Tensor):
            picked = getattr(output, str(key), None)
        if picked is None or not flat_tensors(picked):
            names = output_keys(output)
            raise ValueError(f"The model's output has no tensor under {key!r}; "
                             + (f"it has: {', '.join(names)}." if names else
                                f"it is a single {type(output).__name__}: leave the output key empty."))
        return picked
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and all(isinstance(v, torch.Tensor) for v in output):
        return output
    tensors = flat_tensors(output)
    if not tensors:
        raise ValueError(f"The model's output (a {type(output).__name__}) holds no tensor.")
    return tensors[0]


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


def _powers(ref: list[torch.Tensor], test: list[torch.Tensor]) -> tuple[float, float]:
    signal = sum(float(r.double().pow(2).sum()) for r in ref)
    noise = sum(float((r.double() - t.double()).pow(2).sum()) for r, t in zip(ref, test))
    return signal, noise


def sqnr_powers(reference: Any, quantized: Any) -> tuple[float, float] | None:
    """(signal power, noise power) of one output against its reference, on the part :func:`select_output` picks:
    sums of squares that add up over batches, so an SQNR over many batches is pooled, not averaged. None when
    the outputs cannot be compared."""
    try:
        ref, test = flat_tensors(select_output(reference)), flat_tensors(select_output(quantized))
    except ValueError:
        return None
    if not ref or len(ref) != len(test):
        return None
    return _powers(ref, test)


def sqnr_db(reference: Any, quantized: Any) -> float | None:
    """Signal-to-quantization-noise ratio of ``quantized`` against ``reference`` in dB (inf if equal).

    Either is one output or a list of outputs (one per batch); each output is compared on the part
    :func:`select_output` picks.
    """
    def picked(value: Any) -> list[torch.Tensor]:
        if isinstance(value, list) and value and not all(isinstance(v, torch.Tensor) for v in value):
            return [t for v in value for t in flat_tensors(select_output(v))]
        return flat_tensors(select_output(value))
    try:
        ref, test = picked(reference), picked(quantized)
    except ValueError:
        return None
    if not ref or len(ref) != len(test):
        return None
    signal, noise = _powers(ref, test)
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10 * math.log10(signal / noise)
