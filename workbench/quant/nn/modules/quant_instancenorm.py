"""Quantized instance normalization: the input is quantized, the normalization is the float module's."""
from __future__ import annotations

from torch import nn

from workbench.quant.nn.modules import _utils

__all__ = ["QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d"]


class _QuantInstanceNormNd(_utils.QuantInputThenFloat):
    """Shared constructor of the quantized instance norms: the float module's arguments plus descriptors."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False, **kwargs) -> None:
        factory, kwargs = _utils.split_factory_kwargs(kwargs)
        quant_desc_input = _utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True, **kwargs)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, **factory)
        self.init_quantizer(quant_desc_input)


class QuantInstanceNorm1d(_QuantInstanceNormNd, nn.InstanceNorm1d):
    """Quantized 1D instance normalization."""

    _float_module = nn.InstanceNorm1d


class QuantInstanceNorm2d(_QuantInstanceNormNd, nn.InstanceNorm2d):
    """Quantized 2D instance normalization."""

    _float_module = nn.InstanceNorm2d


class QuantInstanceNorm3d(_QuantInstanceNormNd, nn.InstanceNorm3d):
    """Quantized 3D instance normalization."""

    _float_module = nn.InstanceNorm3d
