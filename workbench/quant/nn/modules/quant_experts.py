"""Quantized mixture-of-experts experts: Hugging Face's ``MixtralExperts`` and its siblings.

transformers 5 stores a decoder's experts as two 3-D parameters, not as ``nn.Linear`` layers:
``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``, with an ``act_fn``, and calls the module as
``experts(hidden_states [T, H], top_k_index [T, K], top_k_weights [T, K])``. Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE, GraniteMoE, PhiMoE and Jamba all name their class differently but share that structure, so the class is
recognised by structure (:func:`is_experts_module`), never by importing transformers.

:class:`QuantExperts` has one input quantizer and one weight quantizer per projection (``_input_quantizers`` and
``_weight_quantizers``, index 0: ``gate_up_proj``, 1: ``down_proj``, the ModuleList convention of multi-layer
RNNs). A weight quantizer keeps one amax per output channel *per expert*, what TensorRT's per-channel INT8 does
on each expert's GEMM: it quantizes the weight viewed as ``[E * out, in]`` on axis 0 (amax ``[E * out, 1]``, row
``e * out + o`` is expert ``e``'s channel ``o``), so the exported file holds an ordinary per-axis
DequantizeLinear on a 2-D constant followed by a Reshape to ``[E, out, in]`` (ONNX Q/DQ takes one axis only;
an amax ``[E, out, 1]`` on the 3-D weight would need two).

Two routings compute the same thing:

* eager (calibration, evaluation): the original's sparse loop over the experts that some token picked, so the
  ``down_proj`` input quantizer only sees the activations of tokens routed to an expert (the dense form would
  calibrate it on activations that are multiplied by zero afterwards);
* traced (torch.export, TorchScript, ONNX export): the dense form, every expert on every token with batched
  matmuls over the expert axis, outputs weighted by routing weights that are zero for unselected experts. It has
  no ``grouped_mm``, ``histc``, ``nonzero`` or data-dependent shape, so both ONNX exporters take it, and every
  expert's GEMMs get their Q/DQ in the file. A per-tensor activation quantizer (fixed amax) quantizes each
  element the same way in both forms, so the two agree up to summation order.
"""
from __future__ import annotations

import torch
from torch import nn

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules import _utils

__all__ = ["QuantExperts", "QUANT_DESC_8BIT_EXPERTS_WEIGHT_PER_CHANNEL", "is_experts_module", "PROJECTIONS"]

# a weight viewed as [E * out, in]: one amax per expert and output channel
QUANT_DESC_8BIT_EXPERTS_WEIGHT_PER_CHANNEL = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
# the quantizer index of each projection, in the order the forward uses them
PROJECTIONS = ("gate_up_proj", "down_proj")


def is_experts_module(module: nn.Module) -> bool:
    """Whether ``module`` holds experts the way transformers 5 does: 3-D ``gate_up_proj`` ``[E, 2I, H]`` and
    ``down_proj`` ``[E, H, I]`` parameters, an ``act_fn``, and no other parameter (no biases: a class with
    biases computes something else and is not recognised)."""
    if isinstance(module, QuantExperts):
        return False
    params = dict(module.named_parameters(recurse=False))
    gate_up, down = params.get("gate_up_proj"), params.get("down_proj")
    if set(params) != set(PROJECTIONS) or gate_up is None or down is None or not callable(
            getattr(module, "act_fn", None)):
        return False
    if gate_up.dim() != 3 or down.dim() != 3:
        return False
    experts, two_inter, hidden = gate_up.shape
    return tuple(down.shape) == (experts, hidden, two_inter // 2) and two_inter % 2 == 0


def _tracing() -> bool:
    """Whether the forward is being captured into a graph (torch.export / dynamo, TorchScript, ONNX export)."""
    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())


class QuantExperts(_utils.QuantMixin, nn.Module):
    """Experts ``down(act(gate(x)) * up(x))`` with quantized inputs and per-expert per-channel weights.

    Build it with :meth:`from_float` from a transformers experts module (parameters shared, not copied).
    Quantizers: ``_input_quantizers[i]`` and ``_weight_quantizers[i]`` for ``PROJECTIONS[i]``.
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = QUANT_DESC_8BIT_EXPERTS_WEIGHT_PER_CHANNEL
    # tokens routed to each expert since :meth:`count_routing` started (None: not counting); calibration uses it
    # to name the experts no calibration token reached (their down_proj input statistics miss them)
    routed_tokens: torch.Tensor | None = None

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input: tensor_quant.QuantDescriptor | None = None,
                   quant_desc_weight: tensor_quant.QuantDescriptor | None = None) -> QuantExperts:
        """A quantized copy of ``module`` sharing its ``gate_up_proj`` and ``down_proj`` (no copy).

        A per-output-channel weight descriptor for 2-D GEMMs (``axis=0``) is per expert and output channel here
        (the weight is quantized as ``[E * out, in]``).

        Raises:
            TypeError: ``module`` is not an experts module (see :func:`is_experts_module`).
        """
        if not is_experts_module(module):
            raise TypeError(f"QuantExperts.from_float expects a transformers experts module (3-D gate_up_proj "
                            f"[E, 2I, H] and down_proj [E, H, I] and an act_fn), got {type(module).__name__}.")
        quant = cls.__new__(cls)
        quant.__dict__.update({k: (type(v)(v) if isinstance(v, (dict, list, set)) else v)
                               for k, v in vars(module).items()})
        quant.init_quantizer(quant_desc_input or cls.default_quant_desc_input,
                             quant_desc_weight or cls.default_quant_desc_weight, num_layers=len(PROJECTIONS))
        return quant

    def extra_repr(self) -> str:
        experts, two_inter, hidden = self.gate_up_proj.shape
        return f"experts={experts}, hidden={hidden}, intermediate={two_inter // 2}"

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        gate_up = self._quantized_weight(0, self.gate_up_proj)
        down = self._quantized_weight(1, self.down_proj)
        if _tracing():
            return self._dense(hidden_states, top_k_index, top_k_weights, gate_up, down)
        return self._sparse(hidden_states, top_k_index, top_k_weights, gate_up, down)

    def count_routing(self, start: bool) -> torch.Tensor | None:
        """Start counting the tokens routed to each expert (``start=True``), or stop and return the counts [E]."""
        counts = self.routed_tokens
        self.routed_tokens = torch.zeros(self.gate_up_proj.shape[0], dtype=torch.long) if start else None
        return counts

    def _quantized_weight(self, index: int, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` [E, out, in] through ``_weight_quantizers[index]``, as ``[E * out, in]`` (see the module doc)."""
        experts, out, inputs = weight.shape
        return self._weight_quantizers[index](weight.reshape(experts * out, inputs)).reshape(experts, out, inputs)

    def _dense(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
               gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        experts = gate_up.shape[0]
        x = self._input_quantizers[0](hidden_states)
        # [E, T, 2I]: every expert on every token, one batched matmul over the expert axis
        gate, up = torch.matmul(x.unsqueeze(0), gate_up.transpose(1, 2)).chunk(2, dim=-1)
        inner = self._input_quantizers[1](self.act_fn(gate) * up)
        out = torch.matmul(inner, down.transpose(1, 2))  # [E, T, H]
        # [T, E] routing weights, zero for the experts a token did not pick (compare with arange: no one_hot/scatter)
        chosen = (top_k_index.unsqueeze(-1) == torch.arange(experts, device=top_k_index.device)).to(out.dtype)
        weights = (chosen * top_k_weights.unsqueeze(-1).to(out.dtype)).sum(dim=1)
        return (out * weights.transpose(0, 1).unsqueeze(-1)).sum(dim=0).to(hidden_states.dtype)

    def _sparse(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        experts = gate_up.shape[0]
        if self.routed_tokens is not None:
            self.routed_tokens += torch.bincount(top_k_index.flatten().cpu(), minlength=experts)[:experts]
        x = self._input_quantizers[0](hidden_states)
        final = torch.zeros_like(hidden_states)
        for expert in range(experts):
            # slot-major, as transformers' eager experts order the rows (same rows, same GEMM, same sums)
            top_k_pos, token_idx = torch.where(top_k_index.transpose(0, 1) == expert)
            if token_idx.numel() == 0:
                continue
            gate, up = nn.functional.linear(x[token_idx], gate_up[expert]).chunk(2, dim=-1)
            inner = self._input_quantizers[1](self.act_fn(gate) * up)
            current = nn.functional.linear(inner, down[expert]) * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, current.to(final.dtype))
        return final

