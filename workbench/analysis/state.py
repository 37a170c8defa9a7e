"""Snapshot and restore of everything an analysis touches, so the model leaves it as it came in.

An analysis flips quantizers on and off thousands of times and calls user code (metrics) in between;
whatever happens (success, error, cancel), the quantizers' flags and buffers (amax, pre-quant scale)
and every module's train/eval mode are put back, with the very same tensor objects.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["ModelSnapshot", "all_quantizers"]


def all_quantizers(model: nn.Module) -> list[TensorQuantizer]:
    """Every TensorQuantizer under ``model``, each object once (shared ones included)."""
    return [m for m in model.modules() if isinstance(m, TensorQuantizer)]


@dataclass
class _QuantizerState:
    flags: tuple[bool, bool, bool]
    buffers: dict[str, torch.Tensor | None]  # the objects themselves
    values: dict[str, torch.Tensor | None]  # their contents, cloned


class ModelSnapshot:
    """The quantizer state and train/eval modes of a model, taken now, restorable later.

    Use as a context manager to restore on exit whatever happened in between.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._training = {module: module.training for module in model.modules()}
        self._quantizers: dict[TensorQuantizer, _QuantizerState] = {}
        for q in all_quantizers(model):
            buffers = dict(q._buffers)
            values = {k: None if v is None else v.detach().clone() for k, v in buffers.items()}
            self._quantizers[q] = _QuantizerState((q._disabled, q._if_quant, q._if_calib), buffers, values)

    def restore(self) -> None:
        """Put back flags, buffers (same objects, same values) and train/eval modes."""
        for q, saved in self._quantizers.items():
            q._disabled, q._if_quant, q._if_calib = saved.flags
            q._buffers.clear()
            q._buffers.update(saved.buffers)
            with torch.no_grad():
                for name, tensor in saved.buffers.items():
                    value = saved.values[name]
                    if tensor is None or value is None:
                        continue
                    if tensor.shape == value.shape and tensor.dtype == value.dtype:
                        tensor.copy_(value)
                    else:  # resized in place by someone: give it its old contents back
                        tensor.data = value.clone()
        for module, training in self._training.items():
            module.training = training

    def __enter__(self) -> ModelSnapshot:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
