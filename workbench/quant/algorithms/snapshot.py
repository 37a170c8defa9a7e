"""Snapshot and restore of everything a job touches, so that the model leaves it as it came in.

Calibration and analysis flip quantizers, create amax buffers and call user code (the model, metrics)
in between; whatever happens (success, error, cancel), the quantizers' flags and buffers (amax,
pre-quant scale), optionally their calibrators' statistics, and every module's train/eval mode are
put back, with the very same tensor objects.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["ModelSnapshot", "all_quantizers", "quantizer_names", "is_quantizing", "owned_quantizers",
           "holds_quantizers"]

# containers that can hold a layer's quantizers (an RNN's _input_quantizers ModuleList, for example)
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def all_quantizers(model: nn.Module) -> list[TensorQuantizer]:
    """Every TensorQuantizer under ``model``, each object once (shared ones included)."""
    return [m for m in model.modules() if isinstance(m, TensorQuantizer)]


def quantizer_names(model: nn.Module) -> dict[str, TensorQuantizer]:
    """Every qualified name under which a TensorQuantizer is reachable, in model order.

    A quantizer shared between layers (a placement rule's TensorRT scale sharing) appears once per
    name; its first name is the one ``named_modules()`` gives it.
    """
    return {name: m for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, TensorQuantizer)}


def is_quantizing(quantizer: TensorQuantizer) -> bool:
    """Whether the quantizer changes its input in a forward pass: enabled and with quantization on."""
    return not quantizer._disabled and bool(quantizer._if_quant)


def owned_quantizers(module: nn.Module) -> list[tuple[str, TensorQuantizer]]:
    """The quantizers ``module`` holds for its own computation, with their names relative to it.

    Direct TensorQuantizer children (``_input_quantizer``, ``_weight_quantizer``, QuantAdd's
    ``_input0_quantizer``...) and the items of a container child made of quantizers only (an RNN's
    ``_input_quantizers`` list, named ``"_input_quantizers.0"``...). Quantizers deeper down belong to
    the submodules.
    """
    owned: list[tuple[str, TensorQuantizer]] = []
    for child_name, child in module._modules.items():
        if isinstance(child, TensorQuantizer):
            owned.append((child_name, child))
        elif isinstance(child, _CONTAINERS) and len(child._modules) > 0 and all(
                isinstance(item, TensorQuantizer) for item in child._modules.values()):
            owned.extend((f"{child_name}.{key}", item) for key, item in child._modules.items())
    return owned


def holds_quantizers(module: nn.Module) -> bool:
    """Whether ``module`` is a quantized layer: it holds quantizers itself (see :func:`owned_quantizers`)."""
    return bool(owned_quantizers(module))


@dataclass
class _QuantizerState:
    flags: tuple[bool, bool, bool]
    buffers: dict[str, torch.Tensor | None]  # the objects themselves
    values: dict[str, torch.Tensor | None]  # their contents, cloned
    calibrator: dict | None = None  # the calibrator's state(), when asked for


class ModelSnapshot:
    """The quantizer state and train/eval modes of a model, taken now, restorable later.

    Args:
        model: the model.
        calibrators: also keep the statistics the calibrators collected (histograms, running max),
            for jobs that reset and refill them.

    Use as a context manager to restore on exit whatever happened in between.
    """

    def __init__(self, model: nn.Module, calibrators: bool = False) -> None:
        self.model = model
        self._training = {module: module.training for module in model.modules()}
        self._quantizers: dict[TensorQuantizer, _QuantizerState] = {}
        for q in all_quantizers(model):
            buffers = dict(q._buffers)
            values = {k: None if v is None else v.detach().clone() for k, v in buffers.items()}
            calibrator = q._calibrator.state() if calibrators and hasattr(q._calibrator, "state") else None
            self._quantizers[q] = _QuantizerState((q._disabled, q._if_quant, q._if_calib), buffers, values,
                                                  calibrator)

    def restore(self, only: TensorQuantizer | None = None) -> None:
        """Put back flags, buffers (same objects, same values), calibrator statistics and train/eval modes.

        With ``only``, just that quantizer's state (flags, buffers, statistics).
        """
        for q, saved in self._quantizers.items():
            if only is not None and q is not only:
                continue
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
            if saved.calibrator is not None:
                q._calibrator.load_state(saved.calibrator)
        if only is None:
            self.restore_modes()

    def restore_flags(self) -> None:
        """Put back only the quantizers' enable flags (a job that succeeded keeps its new amax)."""
        for q, saved in self._quantizers.items():
            q._disabled, q._if_quant, q._if_calib = saved.flags

    def restore_modes(self) -> None:
        """Put back every module's train/eval mode."""
        for module, training in self._training.items():
            module.training = training

    def __enter__(self) -> ModelSnapshot:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
