"""Quantized Linear."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules import _utils

__all__ = ["Linear", "QuantLinear"]


class QuantLinear(_utils.QuantMixin, nn.Linear):
    """``y = quant(x) @ quant(W).T + b``; weights per row (output feature) by default."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    _float_module = nn.Linear

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs) -> None:
        factory, kwargs = _utils.split_factory_kwargs(kwargs)
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(self.__class__, **kwargs)
        super().__init__(in_features, out_features, bias, **factory)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input = self._input_quantizer(input)
        quant_weight = self._weight_quantizer(self.weight)
        return F.linear(quant_input, quant_weight, bias=self.bias)


Linear = QuantLinear
