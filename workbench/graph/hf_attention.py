"""Quantize Hugging Face attention at the function level, where the model cannot be traced.

Hugging Face ``transformers`` (4.48+, 5.x) routes every attention module's products through one
function chosen by ``config._attn_implementation`` from the ``ALL_ATTENTION_FUNCTIONS`` registry
(``eager_attention_forward``, ``sdpa_attention_forward``, flash...). Those forwards are not
fx-traceable (``*shape`` unpacking of proxies, caches, ``**kwargs``), but the registry is a public
extension point: :func:`quantize_hf_attention` registers one implementation, ``"workbench_quant"``,
gives each attention module its own copy of its config naming it, and a
:class:`QuantHFAttention` child (``<module>.sdpa``) that quantizes query, key, value and the
probabilities. The model-level masks are still built for the original implementation (the top-level
config is unchanged), so the child interprets them as the original function would; while none of its
quantizers is on, it calls the original function itself, which keeps the float results exact.

No class is patched; only the instances of the (quantized copy of the) model change.
"""
from __future__ import annotations

import copy
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from workbench.quant.nn.modules.quant_attention import QuantSDPA
from workbench.quant.tensor_quant import QuantDescriptor

logger = logging.getLogger(__name__)

__all__ = ["QuantHFAttention", "HFAttentionResult", "quantize_hf_attention", "is_hf_attention_module",
           "IMPLEMENTATION_NAME", "SUPPORTED_IMPLEMENTATIONS"]

IMPLEMENTATION_NAME = "workbench_quant"
SUPPORTED_IMPLEMENTATIONS = ("eager", "sdpa")
CHILD_NAME = "sdpa"

_uses_registry: dict[type, bool] = {}


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return states
    batch, heads, length, dim = states.shape
    return states[:, :, None, :, :].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups,
                                                                                         length, dim)


class QuantHFAttention(QuantSDPA):
    """A Hugging Face attention function with query, key, value and probabilities quantized.

    Called as the registered ``"workbench_quant"`` implementation: ``(module, query, key, value,
    attention_mask, dropout=..., scaling=..., **kwargs) -> (output [B, L, H, D], weights or None)``.

    Args:
        implementation: the implementation it stands for, ``"eager"`` or ``"sdpa"``.
        original: that implementation's function (called while no quantizer is on).
    """

    def __init__(self, implementation: str, original: Callable, quant_desc_input: QuantDescriptor | None = None,
                 quant_desc_probs: QuantDescriptor | None = None) -> None:
        super().__init__(quant_desc_input, quant_desc_probs)
        if implementation not in SUPPORTED_IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {SUPPORTED_IMPLEMENTATIONS}, got {implementation!r}.")
        self.implementation = implementation
        self.original = original

    def forward(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs):
        if not self.active():
            if is_causal is not None:
                kwargs["is_causal"] = is_causal
            return self.original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                 **kwargs)
        groups = int(getattr(module, "num_key_value_groups", 1) or 1)
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
        mask = attention_mask
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :, :, : key.shape[-2]]
        if self.implementation == "sdpa" and mask is None:
            causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            if causal and query.shape[2] > 1:
                mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
        output, probs = self.attention(query, key, value, mask, scale=scaling, dropout_p=dropout)
        output = output.transpose(1, 2).contiguous()
        return output, (probs if self.implementation == "eager" else None)

    def __setstate__(self, state) -> None:
        # an unpickled model in a new process needs the registered implementation its modules name
        super().__setstate__(state)
        _register()

    def extra_repr(self) -> str:
        return f"implementation={self.implementation}"


def _dispatch(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """The registered ``"workbench_quant"`` implementation: the module's own quantized attention."""
    child = module._modules.get(CHILD_NAME)
    if child is None:
        raise RuntimeError(f"{type(module).__name__} uses the '{IMPLEMENTATION_NAME}' attention but has no "
                           f"'{CHILD_NAME}' quantized attention: quantize it with quantize_hf_attention.")
    return child(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION_NAME, _dispatch)  # a dict entry: registering twice is harmless


def is_hf_attention_module(module: nn.Module) -> bool:
    """A ``transformers`` module whose forward picks its attention function from the registry."""
    kind = type(module)
    if not kind.__module__.startswith("transformers.") or not hasattr(module, "config"):
        return False
    if kind not in _uses_registry:
        try:
            source = inspect.getsource(kind.forward)
        except (OSError, TypeError):
            source = ""
        _uses_registry[kind] = "ALL_ATTENTION_FUNCTIONS" in source
    return _uses_registry[kind]


@dataclass(frozen=True)
class HFAttentionResult:
    """One attention module: quantized (``name`` of the new child) or not (``reason``)."""

    owner: str
    implementation: str | None
    name: str | None = None
    reason: str | None = None


def _original_function(module: nn.Module, implementation: str) -> Callable | None:
    if implementation == "eager":
        return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get(implementation)


def quantize_hf_attention(model: nn.Module, *, quant_desc_input: QuantDescriptor | None = None,
                          ignored: Callable[[str], str | None] = lambda name: None,
                          descriptor_for: Callable[[str], QuantDescriptor | None] | None = None,
                          ) -> list[HFAttentionResult]:
    """Give every Hugging Face attention module of ``model`` a quantized attention, in place.

    Returns one :class:`HFAttentionResult` per attention module found (none for other models).
    """
    results: list[HFAttentionResult] = []
    registered = False
    for path, module in list(model.named_modules()):
        if not is_hf_attention_module(module):
            continue
        if isinstance(module._modules.get(CHILD_NAME), QuantHFAttention):
            continue  # quantized already
        config = module.config
        implementation = getattr(config, "_attn_implementation", None)
        qualified = f"{path}.{CHILD_NAME}" if path else CHILD_NAME
        if implementation not in SUPPORTED_IMPLEMENTATIONS:
            results.append(HFAttentionResult(path, implementation, reason=(
                f"attention implementation {implementation!r} has no quantized counterpart; load the model with "
                f"attn_implementation='eager' or 'sdpa'")))
            continue
        original = _original_function(module, implementation)
        if original is None:
            results.append(HFAttentionResult(path, implementation, reason=(
                f"{type(module).__module__} has no eager_attention_forward to stand in for")))
            continue
        if CHILD_NAME in module._modules or hasattr(module, CHILD_NAME):
            results.append(HFAttentionResult(path, implementation,
                                             reason=f"the module already has an attribute named {CHILD_NAME!r}"))
            continue
        reason = ignored(qualified)
        if reason is not None:
            results.append(HFAttentionResult(path, implementation, reason=f"ignored by policy {reason!r}"))
            continue
        if not registered:
            _register()
            registered = True
        desc = (descriptor_for(qualified) if descriptor_for is not None else None) or quant_desc_input
        child = QuantHFAttention(implementation, original, desc)
        own_config = copy.copy(config)
        # set the stored value, not the property: its setter walks sub-configs the copy shares
        own_config.__dict__["_attn_implementation_internal"] = IMPLEMENTATION_NAME
        module.config = own_config
        module.add_module(CHILD_NAME, child)
        results.append(HFAttentionResult(path, implementation, name=qualified))
    if results:
        logger.info("Hugging Face attention: %d quantized, %d not", sum(r.name is not None for r in results),
                    sum(r.name is None for r in results))
    return results
