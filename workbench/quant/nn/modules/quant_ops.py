"""Quantizers for functional operations that carry activations: elementwise add and concatenation.

A residual ``out + identity`` or a ``torch.cat`` in a model's ``forward`` has no module that a
quantizer could live in. These modules give them one, so that the QDQ graph gets QuantizeLinear /
DequantizeLinear on their inputs where TensorRT expects them. :mod:`workbench.graph` inserts them
without editing the user's model class; they can also be used by hand, as the reference scripts do.

* :class:`QuantAdd` quantizes each operand with its own quantizer (``_input0_quantizer``,
  ``_input1_quantizer``). For a residual add that TensorRT fuses into the preceding convolution,
  the operand coming from that convolution stays in floating point (its quantizer is disabled) and
  only the identity branch is quantized.
* :class:`QuantConcat` quantizes every input with one shared ``_input_quantizer``: TensorRT
  concatenates INT8 tensors without re-quantizing only when they share one scale.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor

__all__ = ["QuantAdd", "QuantConcat"]


def _descriptor(value: QuantDescriptor | None, default: QuantDescriptor) -> QuantDescriptor:
    if value is None:
        return default
    if not isinstance(value, QuantDescriptor):
        raise TypeError(f"quant_desc_input must be a QuantDescriptor, got {type(value).__name__}.")
    if not value.fake_quant:
        raise ValueError("Only fake quantization is supported for functional operations. Use fake_quant=True.")
    if value.axis is not None:
        # the operands of an add or a concat are activations: TensorRT quantizes them per tensor
        raise ValueError(f"Activation quantizers are per tensor; got axis={value.axis!r}.")
    return value


class QuantAdd(nn.Module):
    """``input0 + input1`` with each operand fake-quantized by its own quantizer.

    Args:
        quant_desc_input: descriptor of both input quantizers (per tensor); default 8-bit per tensor.
    """

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR

    def __init__(self, quant_desc_input: QuantDescriptor | None = None) -> None:
        super().__init__()
        desc = _descriptor(quant_desc_input, type(self).default_quant_desc_input)
        self._input0_quantizer = TensorQuantizer(desc)
        self._input1_quantizer = TensorQuantizer(desc)

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor for the input quantizers of QuantAdd modules created from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_descriptor(value, cls.default_quant_desc_input))

    def forward(self, input0: torch.Tensor, input1: torch.Tensor) -> torch.Tensor:
        return self._input0_quantizer(input0) + self._input1_quantizer(input1)


class QuantConcat(nn.Module):
    """``torch.cat(tensors, dim)`` with every input fake-quantized by one shared quantizer.

    Args:
        dim: the default concatenation dimension (``forward``'s ``dim`` overrides it).
        quant_desc_input: descriptor of the shared input quantizer; default 8-bit per tensor.
    """

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR

    def __init__(self, dim: int = 0, quant_desc_input: QuantDescriptor | None = None) -> None:
        super().__init__()
        self.dim = dim
        self._input_quantizer = TensorQuantizer(_descriptor(quant_desc_input, type(self).default_quant_desc_input))

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor for the input quantizer of QuantConcat modules created from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_descriptor(value, cls.default_quant_desc_input))

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer

    def forward(self, tensors: Sequence[torch.Tensor], dim: int | None = None) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            raise TypeError("QuantConcat takes a sequence of tensors, as torch.cat does, not a single tensor.")
        quantizer = self._input_quantizer
        return torch.cat([quantizer(t) for t in tensors], self.dim if dim is None else dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
