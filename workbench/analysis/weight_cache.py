"""Reuse fake-quantized weights across the passes of an analysis.

A sensitivity profile runs the model once per unit in configurations that differ only in which
quantizers are switched off; a weight quantizer that stays on quantizes the same parameter with the
same amax in every pass, and per-channel weight fake-quant is a noticeable share of a cached pass.
:class:`WeightQuantCache` remembers each weight quantizer's last output and returns it while nothing
it depends on has changed: the same parameter object with the same storage and version counter, the
same amax / pre-quant-scale values, the same flags. Anything else
(a disabled quantizer, an activation, a changed amax) runs the quantizer as usual, so the outputs are
the ones the plain model computes, bit for bit.

Costs one extra copy of the quantized weights while it is active. Only for passes under
``torch.no_grad()`` with calibration off (the analyses run that way): the cached output carries no graph.
A weight edited through ``.data`` (behind autograd's version counter) is not noticed: nothing does that
during an analysis, whose model is held by a snapshot.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["WeightQuantCache"]


def _tensor_key(tensor: torch.Tensor | None) -> tuple | None:
    if tensor is None:
        return None
    return (id(tensor), tensor.data_ptr(), tensor._version, tensor.dtype, tuple(tensor.shape), tensor.stride())


def _values(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().clone()


def _same_values(tensor: torch.Tensor | None, saved: torch.Tensor | None) -> bool:
    if tensor is None or saved is None:
        return tensor is None and saved is None
    return tensor.shape == saved.shape and tensor.dtype == saved.dtype and bool(torch.equal(tensor, saved))


def _state_key(quantizer: TensorQuantizer) -> tuple:
    """Everything of the quantizer's own state that its forward reads."""
    return (quantizer.config_key(), _tensor_key(quantizer.amax), _tensor_key(quantizer.pre_quant_scale))


def _scales(quantizer: TensorQuantizer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return quantizer.amax, quantizer.pre_quant_scale


class _Memo:
    """One quantizer's forward, remembering its output for a parameter."""

    __slots__ = ("quantizer", "forward", "key", "scales", "output", "output_version", "hits")

    def __init__(self, quantizer: TensorQuantizer) -> None:
        self.quantizer = quantizer
        self.forward = quantizer.forward  # the bound class method
        self.key: tuple | None = None
        self.scales: tuple = (None, None)
        self.output: torch.Tensor | None = None
        self.output_version = -1
        self.hits = 0

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        quantizer = self.quantizer
        if (args or kwargs or not isinstance(inputs, nn.Parameter) or not quantizer.is_enabled
                or torch.is_grad_enabled() or quantizer.learn_amax or not quantizer.fake_quant):
            return self.forward(inputs, *args, **kwargs)
        key = (_tensor_key(inputs), _state_key(quantizer))
        output = self.output
        scales = _scales(quantizer)
        # amax is compared by value: writes through ``.data`` (the amax setter) leave its version as it was
        if (key == self.key and output is not None and output._version == self.output_version
                and all(_same_values(now, saved) for now, saved in zip(scales, self.scales))):
            self.hits += 1
            return output
        output = self.forward(inputs)
        if isinstance(output, torch.Tensor) and output is not inputs:
            self.key, self.output, self.output_version = key, output, output._version
            self.scales = tuple(_values(t) for t in scales)
        else:
            self.key, self.output = None, None
        return output


class WeightQuantCache:
    """Context manager: ``quantizers`` return their remembered output for an unchanged weight.

    The quantizers' ``forward`` is replaced on the instances while the context is active and restored
    on exit, whatever happens inside.
    """

    def __init__(self, quantizers: Iterable[TensorQuantizer]) -> None:
        self._quantizers = [q for q in quantizers if "forward" not in q.__dict__]
        self._memos: list[_Memo] = []

    @property
    def hits(self) -> int:
        """How many quantizer calls were answered from the cache."""
        return sum(memo.hits for memo in self._memos)

    def __enter__(self) -> WeightQuantCache:
        for quantizer in self._quantizers:
            memo = _Memo(quantizer)
            self._memos.append(memo)
            quantizer.forward = memo
        return self

    def __exit__(self, *exc: Any) -> None:
        for memo in self._memos:
            memo.quantizer.__dict__.pop("forward", None)
            memo.output = None
