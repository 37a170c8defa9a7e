"""Quantizers for the two matrix products of attention: ``Q @ K^T`` and ``P @ V``.

TensorRT builds its INT8 fused multi-head attention when Q/DQ sit on both inputs of both products:
the query and key before ``Q @ K^T``, the softmax probabilities and the value before ``P @ V``
(pytorch-quantization's quant_bert places the same four; the softmax, the scaling and the mask stay
in floating point). Two modules give these tensors quantizers:

* :class:`QuantMatMul` replaces one product between two activations (``torch.matmul``, ``@``,
  ``torch.bmm``, ``torch.baddbmm``, or a ``torch.einsum`` that is a batched matrix product:
  :mod:`workbench.quant.nn.modules.einsum_product`), with ``_input0_quantizer`` and ``_input1_quantizer``.
* :class:`QuantSDPA` replaces ``F.scaled_dot_product_attention``, with ``_q_quantizer``,
  ``_k_quantizer``, ``_v_quantizer`` and ``_probs_quantizer``. While any of them quantizes or
  calibrates it computes attention explicitly (``softmax(q k^T * scale + mask) v``), so the exported
  graph holds two MatMuls whose inputs come from DequantizeLinear; otherwise it calls
  ``F.scaled_dot_product_attention`` itself and computes exactly what the float model computed.

Default descriptors: 8-bit signed, per tensor, max calibration. The probabilities lie in [0, 1]; an
unsigned quantizer would use the grid better, but TensorRT accepts only int8 Q/DQ (a uint8
QuantizeLinear does not build), so their default is signed int8 with max calibration, which never
clips a probability and places amax at (or near) 1 (``QUANT_DESC_8BIT_ATTENTION_PROBS``); choose
``unsigned=True`` for onnxruntime-only deployments.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench.quant.nn.modules.einsum_product import einsum_product
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor

__all__ = ["QuantMatMul", "QuantSDPA", "QUANT_DESC_8BIT_ATTENTION_PROBS", "probabilities_descriptor",
           "attention_quantizers_active",
           "ATTENTION_QUANTIZER_ROLES"]

QUANT_DESC_8BIT_ATTENTION_PROBS = QuantDescriptor(num_bits=8, calib_method="max")

# what each attention quantizer quantizes, for the tree and the GUI (attribute name -> role)
ATTENTION_QUANTIZER_ROLES = {
    "_q_quantizer": "query", "_k_quantizer": "key", "_v_quantizer": "value",
    "_probs_quantizer": "probabilities",
}

_MATMUL_OPS = ("matmul", "bmm", "baddbmm", "einsum")


def _activation_descriptor(value: QuantDescriptor | None, default: QuantDescriptor) -> QuantDescriptor:
    if value is None:
        return default
    if not isinstance(value, QuantDescriptor):
        raise TypeError(f"quant_desc_input must be a QuantDescriptor, got {type(value).__name__}.")
    if not value.fake_quant:
        raise ValueError("Only fake quantization is supported for attention products. Use fake_quant=True.")
    if value.axis is not None:
        raise ValueError(f"Attention quantizers are per tensor (TensorRT's fused attention); got axis={value.axis!r}.")
    return value


def probabilities_descriptor(quant_desc_input: QuantDescriptor | None, default: QuantDescriptor) -> QuantDescriptor:
    """The descriptor of an attention's probabilities quantizer when none is given: the format of its query/key/value
    quantizers (``quant_desc_input``) with max calibration (the probabilities lie in [0, 1]), so that an FP8
    attention is FP8 in all four quantizers; ``default`` (INT8) for integer inputs or none.

    TensorRT has no kernel for a product of an INT8 and an FP8 operand: P @ V must take the probabilities in the
    format V is in.
    """
    if quant_desc_input is None or not isinstance(quant_desc_input.num_bits, tuple):
        return default
    return QuantDescriptor(num_bits=quant_desc_input.num_bits, calib_method="max")


def attention_quantizers_active(quantizers: list[nn.Module]) -> bool:
    """Whether any quantizer changes or observes its input (quantizes or calibrates).

    An export stand-in (not a TensorQuantizer) always counts as active.
    """
    for q in quantizers:
        if not isinstance(q, TensorQuantizer):
            return True
        if not q._disabled and (q._if_quant or q._if_calib):
            return True
    return False


class QuantMatMul(nn.Module):
    """A product of two activations with both operands fake-quantized.

    Args:
        quant_desc_input: descriptor of both input quantizers (per tensor); default 8-bit per tensor.
        op: ``"matmul"`` (``torch.matmul`` / ``@``), ``"bmm"``, ``"baddbmm"`` or ``"einsum"``; the product
            computed, so that with the quantizers off the module computes exactly what the replaced call did.
        equation: with ``op="einsum"``, the einsum's equation; it must be a batched matrix product
            (:func:`workbench.quant.nn.modules.einsum_product.einsum_product`). While a quantizer is active the
            product is computed as ``permute -> quantize -> matmul -> permute`` (an exported graph holds a MatMul
            with DequantizeLinear, through Transposes, on both inputs); otherwise ``torch.einsum`` itself runs.
        roles: what the operands are, when the caller could tell: ``("query", "key")`` or
            ``("probabilities", "value")``.
        quant_desc_probs: with roles ``("probabilities", "value")``, the descriptor of the probabilities'
            quantizer (``_input0_quantizer``); default ``QUANT_DESC_8BIT_ATTENTION_PROBS``, as QuantSDPA's.
    """

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_probs = QUANT_DESC_8BIT_ATTENTION_PROBS

    def __init__(self, quant_desc_input: QuantDescriptor | None = None, op: str = "matmul",
                 roles: tuple[str, ...] = (), quant_desc_probs: QuantDescriptor | None = None,
                 equation: str | None = None) -> None:
        super().__init__()
        if op not in _MATMUL_OPS:
            raise ValueError(f"op must be one of {_MATMUL_OPS}, got {op!r}.")
        self.op = op
        self.equation = equation
        self._einsum = einsum_product(equation) if op == "einsum" else None
        if op == "einsum" and self._einsum is None:
            raise ValueError(f"einsum equation {equation!r} is not a batched matrix product of two operands (one "
                             "contracted index, one free index per operand, the others batch indices of both).")
        self.roles: tuple[str, ...] = tuple(roles)
        desc = _activation_descriptor(quant_desc_input, type(self).default_quant_desc_input)
        first = desc
        if self.roles[:1] == ("probabilities",):  # P @ V: the softmax output, in [0, 1]
            first = _activation_descriptor(quant_desc_probs, probabilities_descriptor(
                quant_desc_input, type(self).default_quant_desc_probs))
        self._input0_quantizer = TensorQuantizer(first)
        self._input1_quantizer = TensorQuantizer(desc)

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor for the input quantizers of QuantMatMul modules created from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_activation_descriptor(value, cls.default_quant_desc_input))

    def forward(self, input0: torch.Tensor, input1: torch.Tensor, bias: torch.Tensor | None = None,
                beta: float = 1, alpha: float = 1) -> torch.Tensor:
        if self._einsum is not None:
            if not attention_quantizers_active([self._input0_quantizer, self._input1_quantizer]):
                return torch.einsum(self._einsum.equation, input0, input1)  # exactly the replaced call
            # laid out for matmul first: per-tensor quantization commutes with the permutation, and the exported
            # MatMul then reads DequantizeLinear outputs through Transposes only
            a, b = self._einsum.operands(input0, input1)
            return self._einsum.product(self._input0_quantizer(a), self._input1_quantizer(b))
        a = self._input0_quantizer(input0)
        b = self._input1_quantizer(input1)
        if self.op == "bmm":
            return torch.bmm(a, b)
        if self.op == "baddbmm":
            return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha)
        return torch.matmul(a, b)

    def extra_repr(self) -> str:
        return f"op={self.op}" + (f", equation={self.equation!r}" if self.op == "einsum" else "")


class QuantSDPA(nn.Module):
    """``F.scaled_dot_product_attention`` with query, key, value and the probabilities quantized.

    Args:
        quant_desc_input: descriptor of the query/key/value quantizers (per tensor).
        quant_desc_probs: descriptor of the probabilities' quantizer; default
            ``QUANT_DESC_8BIT_ATTENTION_PROBS``.
    """

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_probs = QUANT_DESC_8BIT_ATTENTION_PROBS

    def __init__(self, quant_desc_input: QuantDescriptor | None = None,
                 quant_desc_probs: QuantDescriptor | None = None) -> None:
        super().__init__()
        desc = _activation_descriptor(quant_desc_input, type(self).default_quant_desc_input)
        probs = _activation_descriptor(quant_desc_probs, probabilities_descriptor(
            quant_desc_input, type(self).default_quant_desc_probs))
        self._q_quantizer = TensorQuantizer(desc)
        self._k_quantizer = TensorQuantizer(desc)
        self._v_quantizer = TensorQuantizer(desc)
        self._probs_quantizer = TensorQuantizer(probs)

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor for the query/key/value quantizers of QuantSDPA modules created from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_activation_descriptor(value, cls.default_quant_desc_input))

    @classmethod
    def set_default_quant_desc_probs(cls, value: QuantDescriptor) -> None:
        """Descriptor for the probabilities' quantizer of QuantSDPA modules created from now on."""
        cls.default_quant_desc_probs = copy.deepcopy(_activation_descriptor(value, cls.default_quant_desc_probs))

    def quantizers(self) -> list[nn.Module]:
        return [self._q_quantizer, self._k_quantizer, self._v_quantizer, self._probs_quantizer]

    def active(self) -> bool:
        """Whether the explicit (quantized) computation runs; see :func:`attention_quantizers_active`."""
        return attention_quantizers_active(self.quantizers())

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        if not self.active():
            extra = {"enable_gqa": True} if enable_gqa else {}
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, **extra)
        if enable_gqa and query.dim() >= 3 and key.size(-3) != query.size(-3):
            groups = query.size(-3) // key.size(-3)
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        mask = attn_mask
        if is_causal:
            if attn_mask is not None:
                raise ValueError("scaled_dot_product_attention: is_causal=True and an attn_mask cannot both be given.")
            length, source = query.size(-2), key.size(-2)
            mask = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        output, _ = self.attention(query, key, value, mask, scale=scale, dropout_p=dropout_p)
        return output

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  mask: torch.Tensor | None = None, *, scale: float | None = None,
                  dropout_p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(softmax(q k^T * scale + mask) v, probabilities)`` with the four tensors quantized.

        ``mask`` is boolean (True: attend) or additive. The key is transposed before its quantizer, so
        in the exported graph both MatMuls read DequantizeLinear outputs directly.
        """
        if scale is None:
            scale = 1.0 / math.sqrt(query.size(-1))
        q = self._q_quantizer(query)
        k = self._k_quantizer(key.transpose(-2, -1))
        scores = torch.matmul(q, k) * scale
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(mask.logical_not(), float("-inf"))
            else:
                scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0.0:  # as F.scaled_dot_product_attention: callers pass 0 in eval mode
            probs = F.dropout(probs, p=dropout_p)
        output = torch.matmul(self._probs_quantizer(probs), self._v_quantizer(value))
        return output, probs
