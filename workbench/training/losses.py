"""The loss a fine-tune minimises: cross-entropy on labelled classification data, or the user's function."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from workbench.analysis.entry_point import load_entry_point
from workbench.quant.algorithms.batches import batch_targets, class_scores
from workbench.sources.errors import TrustRequired

__all__ = ["LossFunction", "resolve_loss", "cross_entropy", "batch_targets", "BUILTIN_LOSSES"]

LossFunction = Callable[[Any, Any], torch.Tensor]

def cross_entropy(outputs: Any, targets: Any) -> torch.Tensor:
    """Cross-entropy of the model's class scores (N, classes, ...) against class indices or class
    probabilities; computed in float32 even under mixed precision."""
    if targets is None:
        raise ValueError("The cross-entropy loss needs labelled batches ((inputs, labels) pairs), and this data has "
                         "no labels. Give labelled training data: an .npz holding two arrays, the inputs and the "
                         "labels (named inputs and labels, or x and y), e.g. 'workbench finetune P --train-data "
                         "train.npz'; or, for data without labels, a loss function fn(outputs, targets) as "
                         "'module:function' (--loss).")
    logits = class_scores(outputs).float()
    if not isinstance(targets, torch.Tensor):
        targets = torch.as_tensor(targets)
    targets = targets.to(logits.device)
    if targets.is_floating_point() and targets.shape == logits.shape:  # class probabilities (soft labels)
        return F.cross_entropy(logits, targets.float())
    return F.cross_entropy(logits, targets.long())


BUILTIN_LOSSES: dict[str, LossFunction] = {"cross_entropy": cross_entropy}
_ALIASES = {"ce": "cross_entropy", "crossentropy": "cross_entropy", "cross-entropy": "cross_entropy"}


def resolve_loss(loss: str | LossFunction | None, *, trust_code: bool = False) -> tuple[LossFunction, str]:
    """The loss function and its name.

    Args:
        loss: None or ``"cross_entropy"`` (the default), a function ``fn(outputs, targets) -> loss``,
            or such a function named as ``"module:function"`` / ``"file.py:function"``.
        trust_code: an entry point runs the user's code, so it needs the same trust as a model's code.

    Raises:
        TrustRequired: an entry point without ``trust_code``.
        ValueError: an unknown name, or an entry point that cannot be loaded.
    """
    if loss is None:
        return cross_entropy, "cross_entropy"
    if callable(loss):
        return loss, getattr(loss, "__qualname__", None) or repr(loss)
    if not isinstance(loss, str):
        raise TypeError(f"loss must be a name, an entry point or a function, got {type(loss).__name__}.")
    key = _ALIASES.get(loss.strip().lower(), loss.strip().lower())
    if key in BUILTIN_LOSSES:
        return BUILTIN_LOSSES[key], key
    if ":" not in loss:
        raise ValueError(f"Unknown loss {loss!r}: use 'cross_entropy', or a function fn(outputs, targets) as "
                         "'module:function' or 'file.py:function'.")
    if not trust_code:
        raise TrustRequired(f"The loss {loss} is user code; only run it if you trust it, then allow it "
                            "(--trust-code on the command line).")
    return load_entry_point(loss), loss
