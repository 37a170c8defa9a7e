"""Quantized pooling: the input is quantized, the pooling itself is the float module's."""
from __future__ import annotations

from torch import nn

from workbench.quant.nn.modules import _utils

__all__ = [
    "MaxPool1d", "QuantMaxPool1d", "MaxPool2d", "QuantMaxPool2d", "MaxPool3d", "QuantMaxPool3d",
    "AvgPool1d", "QuantAvgPool1d", "AvgPool2d", "QuantAvgPool2d", "AvgPool3d", "QuantAvgPool3d",
    "AdaptiveAvgPool1d", "QuantAdaptiveAvgPool1d", "AdaptiveAvgPool2d", "QuantAdaptiveAvgPool2d",
    "AdaptiveAvgPool3d", "QuantAdaptiveAvgPool3d",
]


class QuantMaxPool1d(_utils.QuantInputThenFloat, nn.MaxPool1d):
    """Quantized 1D max pooling."""

    _float_module = nn.MaxPool1d

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False,
                 **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
        self.init_quantizer(quant_desc_input)


class QuantMaxPool2d(_utils.QuantInputThenFloat, nn.MaxPool2d):
    """Quantized 2D max pooling."""

    _float_module = nn.MaxPool2d

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False,
                 **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
        self.init_quantizer(quant_desc_input)


class QuantMaxPool3d(_utils.QuantInputThenFloat, nn.MaxPool3d):
    """Quantized 3D max pooling."""

    _float_module = nn.MaxPool3d

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False,
                 **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
        self.init_quantizer(quant_desc_input)


class QuantAvgPool1d(_utils.QuantInputThenFloat, nn.AvgPool1d):
    """Quantized 1D average pooling."""

    _float_module = nn.AvgPool1d

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.init_quantizer(quant_desc_input)


class QuantAvgPool2d(_utils.QuantInputThenFloat, nn.AvgPool2d):
    """Quantized 2D average pooling."""

    _float_module = nn.AvgPool2d

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None, **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        self.init_quantizer(quant_desc_input)


class QuantAvgPool3d(_utils.QuantInputThenFloat, nn.AvgPool3d):
    """Quantized 3D average pooling."""

    _float_module = nn.AvgPool3d

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None, **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        self.init_quantizer(quant_desc_input)


class QuantAdaptiveAvgPool1d(_utils.QuantInputThenFloat, nn.AdaptiveAvgPool1d):
    """Quantized 1D adaptive average pooling."""

    _float_module = nn.AdaptiveAvgPool1d

    def __init__(self, output_size, **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(output_size)
        self.init_quantizer(quant_desc_input)


class QuantAdaptiveAvgPool2d(_utils.QuantInputThenFloat, nn.AdaptiveAvgPool2d):
    """Quantized 2D adaptive average pooling."""

    _float_module = nn.AdaptiveAvgPool2d

    def __init__(self, output_size, **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(output_size)
        self.init_quantizer(quant_desc_input)


class QuantAdaptiveAvgPool3d(_utils.QuantInputThenFloat, nn.AdaptiveAvgPool3d):
    """Quantized 3D adaptive average pooling."""

    _float_module = nn.AdaptiveAvgPool3d

    def __init__(self, output_size, **kwargs) -> None:
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(output_size)
        self.init_quantizer(quant_desc_input)


# Aliases kept from pytorch-quantization
MaxPool1d = QuantMaxPool1d
MaxPool2d = QuantMaxPool2d
MaxPool3d = QuantMaxPool3d
AvgPool1d = QuantAvgPool1d
AvgPool2d = QuantAvgPool2d
AvgPool3d = QuantAvgPool3d
AdaptiveAvgPool1d = QuantAdaptiveAvgPool1d
AdaptiveAvgPool2d = QuantAdaptiveAvgPool2d
AdaptiveAvgPool3d = QuantAdaptiveAvgPool3d
