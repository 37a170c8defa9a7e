"""The functions pytorch-quantization's compiled ``cuda_ext`` exposed, on the fused kernels.

They run on CPU and CUDA tensors alike and give the same numbers as :func:`fake_tensor_quant`.
"""
from __future__ import annotations

import torch

import workbench.quant.tensor_quant as tensor_quant

__all__ = ["fake_tensor_quant", "fake_tensor_quant_", "fake_tensor_quant_with_axis", "fake_e4m3fy"]


def fake_tensor_quant(inputs: torch.Tensor, amax: torch.Tensor, num_bits: int = 8, unsigned: bool = False,
                      narrow_range: bool = True) -> torch.Tensor:
    """Per-tensor fake quantization (no autograd)."""
    with torch.no_grad():
        return tensor_quant.fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)


def fake_tensor_quant_(inputs: torch.Tensor, amax: torch.Tensor, num_bits: int = 8, unsigned: bool = False,
                       narrow_range: bool = True) -> torch.Tensor:
    """In-place per-tensor fake quantization."""
    with torch.no_grad():
        inputs.copy_(tensor_quant.fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range))
    return inputs


def fake_tensor_quant_with_axis(inputs: torch.Tensor, amax: torch.Tensor, axis: int, num_bits: int = 8,
                                unsigned: bool = False, narrow_range: bool = True) -> torch.Tensor:
    """Per-channel fake quantization with a 1-D ``amax`` along ``axis``."""
    amax = torch.as_tensor(amax).reshape(-1)
    axis = axis % inputs.dim()
    if amax.numel() != inputs.shape[axis]:
        raise ValueError(f"amax has {amax.numel()} values but inputs have {inputs.shape[axis]} along axis {axis}.")
    shape = [1] * inputs.dim()
    shape[axis] = amax.numel()
    with torch.no_grad():
        return tensor_quant.fake_tensor_quant(inputs, amax.reshape(shape), num_bits, unsigned, narrow_range)


def fake_e4m3fy(inputs: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP8 E4M3 value (saturating at +-448), in the input's dtype."""
    with torch.no_grad():
        return tensor_quant.scaled_e4m3(inputs, None, 4, 3)
