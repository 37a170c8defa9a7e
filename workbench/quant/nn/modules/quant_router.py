"""Quantized mixture-of-experts routers: the ``[E, H]`` gate GEMM of Hugging Face's ``*TopKRouter`` classes.

transformers 5's routers (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``, ``OlmoeTopKRouter``, ``JambaTopKRouter``,
``GraniteMoeTopKRouter``...) hold one ``weight`` ``[num_experts, hidden]`` and compute
``logits = F.linear(hidden_states, self.weight)``, then a softmax and a top-k each family writes its own way.
Rather than rewriting each family's routing, :func:`router_quant_class` makes a subclass of the router's own
class that quantizes the GEMM's two operands where the original reads them: the input on the way in (the router
uses ``hidden_states`` only for that GEMM, its shape and its dtype) and ``self.weight`` through a property (per
output channel, one scale per expert's logit), the way :mod:`workbench.quant.parametrized` gives a layer a
computed weight. The softmax and top-k run on the logits of the quantized GEMM, as TensorRT runs them after an
INT8 gate. Ignore the routers (``--ignore '.*\\.(gate|router)$'``) to keep their logits float, as Model Optimizer's
default configurations do.
"""
from __future__ import annotations

import torch
from torch import nn

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules import _utils

__all__ = ["QuantRouter", "is_router_module", "router_quant_class"]

_CLASSES: dict[type, type] = {}


def is_router_module(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers top-k router: a module with no submodules, one 2-D ``weight``
    ``[num_experts, hidden]`` (no bias) and integer ``top_k`` and ``num_experts`` attributes. PhiMoE's router is an
    ``nn.Linear`` subclass whose forward calls ``super().forward`` (``F.linear`` on ``self.weight``) and then its
    own sparse mixer: recognised too (a plain Linear has no ``top_k``)."""
    if isinstance(module, QuantRouter) or module._modules:
        return False
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if set(params) != {"weight"} or weight is None or weight.dim() != 2:
        return False
    top_k, experts = getattr(module, "top_k", None), getattr(module, "num_experts", None)
    return isinstance(top_k, int) and isinstance(experts, int) and experts == weight.shape[0] and 0 < top_k <= experts


class QuantRouter(_utils.QuantMixin, nn.Module):
    """Mixed into a router's class by :func:`router_quant_class`: quantized input and weight of its gate GEMM."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW  # one scale per expert

    @property
    def weight(self) -> torch.Tensor:
        # the parameter stays in _parameters (state_dict keys unchanged); the router's forward reads this
        return self._weight_quantizer(self._parameters["weight"])

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input: tensor_quant.QuantDescriptor | None = None,
                   quant_desc_weight: tensor_quant.QuantDescriptor | None = None) -> nn.Module:
        """A quantized copy of ``module`` sharing its weight (no copy).

        Raises:
            TypeError: ``module`` is not a router (see :func:`is_router_module`).
        """
        if not is_router_module(module):
            raise TypeError(f"{cls.__name__}.from_float expects a transformers top-k router (one weight "
                            f"[num_experts, hidden], top_k, num_experts), got {type(module).__name__}.")
        return _utils.quantized_copy(module, cls, quant_desc_input, quant_desc_weight)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        return super().forward(self._input_quantizer(hidden_states), *args, **kwargs)


def router_quant_class(router_cls: type) -> type:
    """``Quant<RouterClass>``: :class:`QuantRouter` in front of ``router_cls`` (one class per router class)."""
    made = _CLASSES.get(router_cls)
    if made is None:
        made = type(f"Quant{router_cls.__name__}", (QuantRouter, router_cls),
                    {"__module__": __name__, "__doc__": f"{router_cls.__name__} with a quantized gate GEMM."})
        _CLASSES[router_cls] = made
    return made
