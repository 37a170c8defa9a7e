"""What counts as a BatchNorm: torch's own, and the frozen affines detection models carry in their place
(torchvision's ``FrozenBatchNorm2d``, Hugging Face DETR's ``DetrFrozenBatchNorm2d``, and their copies): a module
named ``*BatchNorm*`` holding per-channel ``weight``, ``bias``, ``running_mean`` and ``running_var`` tensors and
computing ``(x - mean) / sqrt(var + eps) * weight + bias`` over channel axis 1.

Such a module is one operation to the tracer (:func:`~workbench.graph.trace.is_leaf`), so folding
(:mod:`workbench.graph.fold`) finds it after its Conv/Linear as it finds an ``nn.BatchNorm2d``.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["is_batchnorm", "is_frozen_batchnorm", "batchnorm_eps", "batchnorm_features"]

# DetrFrozenBatchNorm2d (and its copies in other Hugging Face detectors) adds this epsilon in its forward
_FROZEN_EPS = 1e-5


def is_frozen_batchnorm(module: nn.Module) -> bool:
    """A BatchNorm-like affine that is not torch's (its statistics fixed: buffers, not a training layer)."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) or "BatchNorm" not in type(module).__name__:
        return False
    tensors = [getattr(module, name, None) for name in ("weight", "bias", "running_mean", "running_var")]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in tensors):
        return False
    return len({t.numel() for t in tensors}) == 1


def is_batchnorm(module: nn.Module) -> bool:
    """torch's BatchNorm1d/2d/3d, or a frozen one (:func:`is_frozen_batchnorm`)."""
    return isinstance(module, nn.modules.batchnorm._BatchNorm) or is_frozen_batchnorm(module)


def batchnorm_eps(module: nn.Module) -> float:
    """The epsilon added to the variance: the module's ``eps`` (or ``epsilon``), else DETR's fixed 1e-5."""
    for name in ("eps", "epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return _FROZEN_EPS


def batchnorm_features(module: nn.Module) -> int:
    """The number of channels it normalises."""
    features = getattr(module, "num_features", None)
    return int(features) if isinstance(features, int) else int(module.running_mean.numel())
