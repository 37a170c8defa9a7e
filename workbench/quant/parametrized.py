"""Quantized layers whose weight is computed by a ``torch.nn.utils.parametrize`` parametrization.

``torch.nn.utils.parametrizations.weight_norm`` (Hugging Face wav2vec2's, HuBERT's and WavLM's
``pos_conv_embed.conv``), ``spectral_norm`` and ``orthogonal`` turn a ``Conv1d`` into a
``ParametrizedConv1d``: a class torch makes on the fly whose ``weight`` is a property computing the weight
from the parametrization's tensors. The quantized layer must read that same property, or it has no weight.
:func:`parametrized_quant_class` gives the quantized class of the base (``QuantConv1d``) the parametrized
class's properties and copy hooks, so ``self.weight`` inside the quantized forward is the computed weight
(quantized per channel by the weight quantizer, as TensorRT quantizes the constant it folds it into), and
the state_dict keeps the parametrization's keys (``parametrizations.weight.original0``...).
"""
from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize

__all__ = ["parametrized_base", "parametrized_quant_class"]

_CLASSES: dict[tuple[type, type], type] = {}
# what torch's injected class adds besides its properties: copying and pickling rules of a parametrized module
_HOOKS = ("__getstate__", "__deepcopy__")


def parametrized_base(cls: type) -> type | None:
    """The layer class a ``torch.nn.utils.parametrize`` class was made from (``Conv1d`` for
    ``ParametrizedConv1d``), or None when ``cls`` is not one."""
    if not issubclass(cls, nn.Module) or cls.__module__ != parametrize.__name__ or len(cls.__bases__) != 1:
        return None
    base = cls.__bases__[0]
    return base if cls.__name__ == f"Parametrized{base.__name__}" else None


def parametrized_quant_class(parametrized_cls: type, quant_cls: type) -> type:
    """``quant_cls`` (the base's quantized class) with ``parametrized_cls``'s computed tensors; one class per
    pair, so modules of one parametrized class share it."""
    key = (parametrized_cls, quant_cls)
    made = _CLASSES.get(key)
    if made is None:
        members = {name: value for name, value in vars(parametrized_cls).items()
                   if isinstance(value, property) or name in _HOOKS}
        members["__module__"] = __name__
        members["__doc__"] = f"{quant_cls.__name__} of a layer whose tensors a parametrization computes."
        made = type(f"{quant_cls.__name__}Parametrized", (quant_cls,), members)
        _CLASSES[key] = made
    return made
