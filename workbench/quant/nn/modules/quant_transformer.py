"""Quantized ``nn.MultiheadAttention`` and transformer layers that cannot bypass their quantizers.

``nn.MultiheadAttention`` keeps its input projection as a bare parameter (``in_proj_weight``) and, in
eval mode, runs fused kernels (``torch._native_multi_head_attention``); ``nn.TransformerEncoderLayer``
calls ``torch._transformer_encoder_layer_fwd`` and never runs its submodules' forward. Quantizers
placed on those submodules would never see data. Here:

* :class:`QuantMultiheadAttention` computes attention explicitly while any of its quantizers
  quantizes or calibrates: the input projection quantizes its input (``_input_quantizer``, one per
  tensor for query, key and value) and its weight per row (``_weight_quantizer``; with ``kdim``/
  ``vdim`` also ``_k_weight_quantizer`` and ``_v_weight_quantizer``), the two products go through a
  :class:`~workbench.quant.nn.QuantSDPA` child named ``sdpa`` (query, key, value, probabilities), and
  ``out_proj`` is a :class:`~workbench.quant.nn.QuantLinear`. All parameters are the float module's
  own. With every quantizer off it calls ``nn.MultiheadAttention.forward`` itself, so it computes
  exactly what the float module did.
* :class:`QuantTransformerEncoderLayer` always takes the layer's explicit path (self-attention block,
  feed-forward block), and :class:`QuantTransformerEncoder` never converts its input to a nested
  tensor. ``nn.TransformerDecoderLayer`` has no fused path: quantizing its attention modules and
  Linears is enough.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules._utils import QuantMixin
from workbench.quant.nn.modules.quant_attention import QuantSDPA, attention_quantizers_active
from workbench.quant.nn.modules.quant_linear import QuantLinear
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QuantDescriptor

__all__ = ["QuantMultiheadAttention", "QuantTransformerEncoderLayer", "QuantTransformerEncoder"]


def _share_state(float_module: nn.Module, cls: type) -> nn.Module:
    """An instance of ``cls`` holding ``float_module``'s attributes, parameters and submodules (no copies)."""
    quant = cls.__new__(cls)
    state = {}
    for key, value in vars(float_module).items():
        state[key] = type(value)(value) if isinstance(value, (dict, list, set)) else value
    quant.__dict__.update(state)
    return quant


class QuantMultiheadAttention(QuantMixin, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` with its projections and both attention products quantized.

    A :class:`QuantMixin` (its default descriptors, ``input_quantizer``/``weight_quantizer``), with its own
    :meth:`init_quantizer`: per-row weight quantizers for separate key/value projections, the output
    projection and the attention products."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    _float_module = nn.MultiheadAttention

    def __init__(self, embed_dim: int, num_heads: int, *args, quant_desc_input: QuantDescriptor | None = None,
                 quant_desc_weight: QuantDescriptor | None = None, **kwargs) -> None:
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    @classmethod
    def from_float(cls, module: nn.MultiheadAttention, quant_desc_input: QuantDescriptor | None = None,
                   quant_desc_weight: QuantDescriptor | None = None) -> QuantMultiheadAttention:
        """A quantized module sharing ``module``'s parameters (no copy)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"{cls.__name__}.from_float expects an nn.MultiheadAttention, got {type(module).__name__}.")
        quant = _share_state(module, cls)
        quant.init_quantizer(quant_desc_input, quant_desc_weight)
        return quant

    def init_quantizer(self, quant_desc_input: QuantDescriptor | None = None,
                       quant_desc_weight: QuantDescriptor | None = None) -> None:
        """Create every quantizer (the class's default descriptors where none is given)."""
        desc_input = quant_desc_input or type(self).default_quant_desc_input
        desc_weight = quant_desc_weight or type(self).default_quant_desc_weight
        self._input_quantizer = TensorQuantizer(desc_input)
        self._weight_quantizer = TensorQuantizer(desc_weight)
        if not self._qkv_same_embed_dim:
            self._k_weight_quantizer = TensorQuantizer(desc_weight)
            self._v_weight_quantizer = TensorQuantizer(desc_weight)
        if not isinstance(self.out_proj, QuantLinear):
            self.out_proj = QuantLinear.from_float(self.out_proj, desc_input, desc_weight)
        self.sdpa = QuantSDPA(desc_input)

    def _quantizers(self) -> list[nn.Module]:
        # by attribute name, so that an export stand-in in a quantizer's place counts too
        return [m for name, m in self.named_modules() if name.rpartition(".")[2].endswith("_quantizer")]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not attention_quantizers_active(self._quantizers()):
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        return self._explicit(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                              is_causal)

    def _explicit(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                  is_causal):
        batched = query.dim() == 3
        same_key, same_value = key is query, value is key
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        length, batch, embed = query.shape
        heads, head_dim = self.num_heads, self.head_dim

        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=query.dtype)
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)

        # input projection: one input quantizer, reused when key/value are the query tensor (self-attention)
        q_in = self._input_quantizer(query)
        k_in = q_in if same_key else self._input_quantizer(key)
        v_in = k_in if same_value else self._input_quantizer(value)
        bias_q = bias_k = bias_v = None
        if self.in_proj_bias is not None:
            bias_q, bias_k, bias_v = self.in_proj_bias.chunk(3)
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self._weight_quantizer(self.in_proj_weight).chunk(3)
        else:
            w_q = self._weight_quantizer(self.q_proj_weight)
            w_k = self._k_weight_quantizer(self.k_proj_weight)
            w_v = self._v_weight_quantizer(self.v_proj_weight)
        q = F.linear(q_in, w_q, bias_q)
        k = F.linear(k_in, w_k, bias_k)
        v = F.linear(v_in, w_v, bias_v)

        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(1, batch, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, batch, 1)])
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None

        q = q.reshape(length, batch, heads, head_dim).permute(1, 2, 0, 3)
        k = k.reshape(k.shape[0], batch, heads, head_dim).permute(1, 2, 0, 3)
        v = v.reshape(v.shape[0], batch, heads, head_dim).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            zeros = torch.zeros(batch, heads, 1, head_dim, dtype=k.dtype, device=k.device)
            k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
        source = k.shape[2]

        mask = None
        if attn_mask is not None:
            mask = attn_mask.reshape(1, 1, length, source) if attn_mask.dim() == 2 else \
                attn_mask.reshape(batch, heads, length, source)
        elif is_causal:
            mask = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
            mask = torch.zeros(length, source, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        if key_padding_mask is not None:
            padding = key_padding_mask.reshape(batch, 1, 1, source)
            mask = padding if mask is None else mask + padding

        dropout = self.dropout if self.training else 0.0
        output, probs = self.sdpa.attention(q, k, v, mask, dropout_p=dropout)
        output = output.permute(2, 0, 1, 3).reshape(length, batch, embed)
        output = self.out_proj(output)
        weights = None
        if need_weights:
            weights = probs.mean(dim=1) if average_attn_weights else probs
        if not batched:
            output = output.squeeze(1)
            weights = weights.squeeze(0) if weights is not None else None
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, weights


def _canonical_masks(src: torch.Tensor, src_mask: torch.Tensor | None, src_key_padding_mask: torch.Tensor | None):
    """The layer's masks as float additive masks (or None), as nn.TransformerEncoderLayer makes them."""
    src_key_padding_mask = F._canonical_mask(mask=src_key_padding_mask, mask_name="src_key_padding_mask",
                                             other_type=F._none_or_dtype(src_mask), other_name="src_mask",
                                             target_type=src.dtype)
    src_mask = F._canonical_mask(mask=src_mask, mask_name="src_mask", other_type=None, other_name="",
                                 target_type=src.dtype, check_other=False)
    return src_mask, src_key_padding_mask


# one call in a traced graph (its checks read tensor types, which proxies do not have)
torch.fx.wrap("_canonical_masks")


class QuantTransformerEncoderLayer(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` that always runs its submodules (no fused fast path)."""

    _float_module = nn.TransformerEncoderLayer

    @classmethod
    def from_float(cls, module: nn.TransformerEncoderLayer, quant_desc_input: QuantDescriptor | None = None,
                   quant_desc_weight: QuantDescriptor | None = None) -> QuantTransformerEncoderLayer:
        """The same layer (same submodules and parameters) without the fused path. Its quantizers live in
        its submodules (self_attn, linear1, linear2), which the module replacement converts on their own."""
        if not isinstance(module, nn.TransformerEncoderLayer):
            raise TypeError(f"{cls.__name__}.from_float expects an nn.TransformerEncoderLayer, "
                            f"got {type(module).__name__}.")
        return _share_state(module, cls)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        src_mask, src_key_padding_mask = _canonical_masks(src, src_mask, src_key_padding_mask)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal=is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal=is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x


class QuantTransformerEncoder(nn.TransformerEncoder):
    """``nn.TransformerEncoder`` that never turns its input into a nested tensor (a fused path that the
    quantized layers' explicit computation cannot take)."""

    _float_module = nn.TransformerEncoder

    @classmethod
    def from_float(cls, module: nn.TransformerEncoder, quant_desc_input: QuantDescriptor | None = None,
                   quant_desc_weight: QuantDescriptor | None = None) -> QuantTransformerEncoder:
        if not isinstance(module, nn.TransformerEncoder):
            raise TypeError(f"{cls.__name__}.from_float expects an nn.TransformerEncoder, got {type(module).__name__}.")
        quant = _share_state(module, cls)
        quant.use_nested_tensor = False
        quant.enable_nested_tensor = False
        return quant

