"""Mixins that give quantized modules their quantizers and default descriptors."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor

__all__ = ["QuantMixin", "QuantInputMixin", "QuantInputThenFloat", "pop_quant_desc_in_kwargs", "quantized_copy",
           "split_factory_kwargs"]

_FACTORY_KEYS = ("device", "dtype")


def split_factory_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Take ``device``/``dtype`` out of ``kwargs`` (for the float module) and return (them, the rest)."""
    factory = {key: kwargs.pop(key) for key in _FACTORY_KEYS if key in kwargs}
    return factory, kwargs


def _check_descriptor(value: Any, what: str) -> QuantDescriptor:
    if not isinstance(value, QuantDescriptor):
        raise ValueError(f"{what} must be an instance of QuantDescriptor, got {type(value).__name__}.")
    return value


class QuantMixin:
    """Input and weight quantizers for modules with weights (conv, linear, LSTM)."""

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor for the input quantizer of modules of this class created from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_check_descriptor(value, "default_quant_desc_input"))

    @classmethod
    def set_default_quant_desc_weight(cls, value: QuantDescriptor) -> None:
        """Descriptor for the weight quantizer of modules of this class created from now on."""
        cls.default_quant_desc_weight = copy.deepcopy(_check_descriptor(value, "default_quant_desc_weight"))

    def init_quantizer(self, quant_desc_input: QuantDescriptor, quant_desc_weight: QuantDescriptor,
                       num_layers: int | None = None) -> None:
        """Create the quantizers (one pair, or ``num_layers`` pairs in ModuleLists for RNNs)."""
        _check_descriptor(quant_desc_input, "quant_desc_input")
        _check_descriptor(quant_desc_weight, "quant_desc_weight")
        if not quant_desc_input.fake_quant or not quant_desc_weight.fake_quant:
            raise ValueError("Only fake quantization is supported in quantized modules: a layer needs float "
                             "inputs and weights. Use fake_quant=True in its descriptors.")
        self._fake_quant = True
        if num_layers is None:
            self._input_quantizer = TensorQuantizer(quant_desc_input)
            self._weight_quantizer = TensorQuantizer(quant_desc_weight)
        else:
            self._input_quantizers = nn.ModuleList([TensorQuantizer(quant_desc_input) for _ in range(num_layers)])
            self._weight_quantizers = nn.ModuleList([TensorQuantizer(quant_desc_weight) for _ in range(num_layers)])

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        return self._weight_quantizer

    @property
    def input_quantizers(self) -> nn.ModuleList:
        """One input quantizer per layer and direction (multi-layer RNNs; see :meth:`init_quantizer`)."""
        return self._input_quantizers

    @property
    def weight_quantizers(self) -> nn.ModuleList:
        """One weight quantizer per layer and direction (multi-layer RNNs)."""
        return self._weight_quantizers

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input: QuantDescriptor | None = None,
                   quant_desc_weight: QuantDescriptor | None = None) -> nn.Module:
        """A quantized module sharing ``module``'s parameters (no copy); see :func:`quantized_copy`."""
        _check_float_module(cls, module)
        return quantized_copy(module, cls, quant_desc_input, quant_desc_weight)


class QuantInputMixin:
    """An input quantizer for modules without weights (pooling, normalization)."""

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor for the input quantizer of modules of this class created from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_check_descriptor(value, "default_quant_desc_input"))

    def init_quantizer(self, quant_desc_input: QuantDescriptor) -> None:
        """Create the input quantizer."""
        _check_descriptor(quant_desc_input, "quant_desc_input")
        if not quant_desc_input.fake_quant:
            raise ValueError("Only fake quantization is supported in quantized modules. Use fake_quant=True.")
        self._fake_quant = True
        self._input_quantizer = TensorQuantizer(quant_desc_input)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input: QuantDescriptor | None = None) -> nn.Module:
        """A quantized module sharing ``module``'s state (no copy); see :func:`quantized_copy`."""
        _check_float_module(cls, module)
        return quantized_copy(module, cls, quant_desc_input)


class QuantInputThenFloat(QuantInputMixin):
    """The forward of the weightless quantized modules (pooling, instance norm): quantize the input,
    then run the float module's own forward. Listed first among the bases so its forward wins."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(self._input_quantizer(input))


def _check_float_module(quant_cls: type, module: nn.Module) -> None:
    float_cls = getattr(quant_cls, "_float_module", None)
    if float_cls is None:
        raise TypeError(f"{quant_cls.__name__} does not declare which float module it replaces (_float_module).")
    if not isinstance(module, float_cls):
        raise TypeError(f"{quant_cls.__name__}.from_float expects a {float_cls.__name__}, got {type(module).__name__}.")


def pop_quant_desc_in_kwargs(quant_cls: type, input_only: bool = False, **kwargs: Any):
    """Take ``quant_desc_input`` (and ``quant_desc_weight``) from kwargs, defaulting to the class's.

    Raises:
        TypeError: when other keywords are left over (they would otherwise be silently ignored).
    """
    quant_desc_input = kwargs.pop("quant_desc_input", quant_cls.default_quant_desc_input)
    quant_desc_weight = None
    if not input_only:
        quant_desc_weight = kwargs.pop("quant_desc_weight", quant_cls.default_quant_desc_weight)
    if kwargs:
        raise TypeError(f"Unused keys: {sorted(kwargs)}. {quant_cls.__name__} accepts quant_desc_input"
                        f"{'' if input_only else ' and quant_desc_weight'} besides the float module's arguments.")
    if input_only:
        return quant_desc_input
    return quant_desc_input, quant_desc_weight


def quantized_copy(float_module: nn.Module, quant_cls: type, quant_desc_input: QuantDescriptor | None = None,
                   quant_desc_weight: QuantDescriptor | None = None) -> nn.Module:
    """A ``quant_cls`` module that shares ``float_module``'s parameters, buffers, submodules and hooks.

    Nothing is copied or re-initialised, so the quantized module computes exactly what the float one
    did while its quantizers are disabled, and its state_dict keeps the same keys (plus quantizers).
    """
    quant = quant_cls.__new__(quant_cls)
    state = {}
    for key, value in vars(float_module).items():
        # containers get their own copy so that later changes to one module do not leak into the other
        if isinstance(value, dict):
            value = type(value)(value)
        elif isinstance(value, (list, set)):
            value = type(value)(value)
        state[key] = value
    quant.__dict__.update(state)
    if issubclass(quant_cls, QuantMixin):
        quant.init_quantizer(quant_desc_input or quant_cls.default_quant_desc_input,
                             quant_desc_weight or quant_cls.default_quant_desc_weight,
                             **_rnn_layers(quant))
    else:
        quant.init_quantizer(quant_desc_input or quant_cls.default_quant_desc_input)
    return quant


def _rnn_layers(module: nn.Module) -> dict[str, int]:
    """Multi-layer RNNs get one quantizer pair per layer and direction."""
    if isinstance(module, nn.RNNBase):
        return {"num_layers": module.num_layers * (2 if module.bidirectional else 1)}
    return {}
