"""Quantized Linear-likes that are not ``nn.Linear``: Hugging Face's ``Conv1D`` (GPT-2, GPT, ...).

``transformers.pytorch_utils.Conv1D`` is a Linear whose weight is stored transposed, ``[in, out]``,
and applied with ``addmm(bias, x, W)``. Its output channels are the weight's axis 1, so per-channel
weight scales go on axis 1 (the same axis the exported DequantizeLinear carries in front of MatMul).
The class is recognised by name (:mod:`workbench.quant.gemm`), so transformers is never imported here.
"""
from __future__ import annotations

import torch
from torch import nn

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules import _utils

__all__ = ["QuantConv1D", "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_COLUMN"]

# the weight is [in_features, out_features]: one scale per output feature is one per column
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_COLUMN = tensor_quant.QuantDescriptor(num_bits=8, axis=1)


class QuantConv1D(_utils.QuantMixin, nn.Module):
    """``y = quant(x) @ quant(W) + b`` with ``W`` of shape ``[nx, nf]`` (Hugging Face ``Conv1D``).

    Build it with :meth:`from_float` from a ``Conv1D`` (the parameters are shared, not copied), or
    directly as ``QuantConv1D(nf, nx)``. A normal weight-quantized module: every weight descriptor
    (int8 per-channel on axis 1, int4 blockwise, fp8) applies to ``_weight_quantizer``.
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_COLUMN

    def __init__(self, nf: int, nx: int, **kwargs) -> None:
        factory, kwargs = _utils.split_factory_kwargs(kwargs)
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(self.__class__, **kwargs)
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf, **factory))
        self.bias = nn.Parameter(torch.zeros(nf, **factory))
        nn.init.normal_(self.weight, std=0.02)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input: tensor_quant.QuantDescriptor | None = None,
                   quant_desc_weight: tensor_quant.QuantDescriptor | None = None) -> QuantConv1D:
        """A quantized Conv1D sharing ``module``'s ``weight`` ([in, out]) and ``bias`` (no copy).

        Raises:
            TypeError: ``module`` is not Conv1D-shaped (a 2-D ``weight`` and an ``nf`` equal to its columns).
        """
        weight = getattr(module, "weight", None)
        nf = getattr(module, "nf", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or nf != weight.shape[1]:
            raise TypeError(f"QuantConv1D.from_float expects a Hugging Face Conv1D (weight [in, out], nf = out), "
                            f"got {type(module).__name__}.")
        return _utils.quantized_copy(module, cls, quant_desc_input, quant_desc_weight)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)
        quant_input = self._input_quantizer(x)
        quant_weight = self._weight_quantizer(self.weight)
        out = torch.addmm(self.bias, quant_input.reshape(-1, quant_input.size(-1)), quant_weight) \
            if self.bias is not None else quant_input.reshape(-1, quant_input.size(-1)) @ quant_weight
        return out.view(size_out)
