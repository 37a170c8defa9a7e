"""Quantized convolutions: the float module's computation with quantized input and weight.

Each class subclasses its torch counterpart, so ``isinstance(m, torch.nn.Conv2d)`` stays true for
code that walks a model, and parameters keep their names. Aliases without the ``Quant`` prefix are
kept for scripts written against pytorch-quantization.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules import _utils

__all__ = [
    "Conv2d", "QuantConv2d", "Conv3d", "QuantConv3d", "Conv1d", "QuantConv1d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "QuantConvTranspose1d", "QuantConvTranspose2d", "QuantConvTranspose3d",
]

class _QuantConvNd(_utils.QuantMixin):
    """Shared part of the quantized convolutions: quantize input and weight, then convolve."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", **kwargs):
        factory, kwargs = _utils.split_factory_kwargs(kwargs)
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(self.__class__, **kwargs)
        # the float class by name: the transposed convolutions below put their own signature in between
        self._float_module.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                                    bias, padding_mode, **factory)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def _quant(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._input_quantizer(input), self._weight_quantizer(self.weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input, quant_weight = self._quant(input)
        return self._conv_forward(quant_input, quant_weight, self.bias)


class QuantConv1d(_QuantConvNd, nn.Conv1d):
    """Quantized 1D convolution."""

    _float_module = nn.Conv1d
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL


class QuantConv2d(_QuantConvNd, nn.Conv2d):
    """Quantized 2D convolution."""

    _float_module = nn.Conv2d
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL


class QuantConv3d(_QuantConvNd, nn.Conv3d):
    """Quantized 3D convolution."""

    _float_module = nn.Conv3d
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL


class _QuantConvTransposeNd(_QuantConvNd):
    """Shared part of the quantized transposed convolutions (weight per-channel on axis 1)."""

    _num_spatial_dims = 0
    _functional = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", **kwargs):
        factory, kwargs = _utils.split_factory_kwargs(kwargs)
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(self.__class__, **kwargs)
        self._float_module.__init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding,
                                    groups, bias, dilation, padding_mode, **factory)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError(f"Only `zeros` padding mode is supported for {type(self).__name__}")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              self._num_spatial_dims, self.dilation)
        quant_input, quant_weight = self._quant(input)
        return type(self)._functional(quant_input, quant_weight, self.bias, self.stride, self.padding,
                                      output_padding, self.groups, self.dilation)


class QuantConvTranspose1d(_QuantConvTransposeNd, nn.ConvTranspose1d):
    """Quantized 1D transposed convolution."""

    _float_module = nn.ConvTranspose1d
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 1
    _functional = staticmethod(F.conv_transpose1d)


class QuantConvTranspose2d(_QuantConvTransposeNd, nn.ConvTranspose2d):
    """Quantized 2D transposed convolution."""

    _float_module = nn.ConvTranspose2d
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 2
    _functional = staticmethod(F.conv_transpose2d)


class QuantConvTranspose3d(_QuantConvTransposeNd, nn.ConvTranspose3d):
    """Quantized 3D transposed convolution."""

    _float_module = nn.ConvTranspose3d
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 3
    _functional = staticmethod(F.conv_transpose3d)


# Aliases kept from pytorch-quantization
Conv1d = QuantConv1d
Conv2d = QuantConv2d
Conv3d = QuantConv3d
ConvTranspose1d = QuantConvTranspose1d
ConvTranspose2d = QuantConvTranspose2d
ConvTranspose3d = QuantConvTranspose3d
