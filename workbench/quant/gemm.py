"""Which modules are weight GEMMs: the Linear-likes of other libraries, and what starts in floating point.

One home for three rules the whole tool reads (replacement, ``new``, ``show``, the tree, the export):

* :data:`KNOWN_LINEAR_LIKES`: classes of timm, torchvision and transformers that compute ``x @ W (+ b)``
  but are not ``nn.Linear`` (or override its ``forward``), by qualified class name so that none of those
  libraries is imported to recognise them. Hugging Face's ``Conv1D`` (GPT-2's projections) stores its
  weight transposed, ``[in, out]``: it gets :class:`~workbench.quant.nn.QuantConv1D`, whose per-channel
  weight axis is 1.
* :func:`unknown_weight_gemm`: a module of any other class that holds a weight matrix (a GEMM or a
  convolution the core has no quantized class for) is listed as left in floating point, with the reason,
  instead of disappearing from every count.
* :data:`FLOAT_BY_DEFAULT`: quantizable layer types a new project leaves in floating point, with why.
"""
from __future__ import annotations

from torch import nn

from workbench.quant.nn.modules.quant_gemm import QuantConv1D
from workbench.quant.nn.modules.quant_linear import QuantLinear

__all__ = ["KNOWN_LINEAR_LIKES", "FLOAT_BY_DEFAULT", "qualified_class_name", "known_linear_like",
           "unknown_weight_gemm", "float_by_default_reason"]

KNOWN_LINEAR_LIKES: dict[str, type] = {
    # Hugging Face: GPT, GPT-2, ImageGPT, DecisionTransformer... (weight [in, out], addmm)
    "transformers.pytorch_utils.Conv1D": QuantConv1D,
    "transformers.modeling_utils.Conv1D": QuantConv1D,  # where transformers < 4.20 defined it
    # timm's Linear: F.linear with a TorchScript-only cast branch
    "timm.layers.linear.Linear": QuantLinear,
    "timm.models.layers.linear.Linear": QuantLinear,
    # torchvision / torch: MultiheadAttention's out_proj (its forward is nn.Linear's anyway)
    "torch.nn.modules.linear.NonDynamicallyQuantizableLinear": QuantLinear,
}

_LSTM_REASON = ("left in floating point by default: a quantized LSTM is unrolled step by step in the export (fixed "
                "sequence length, an ONNX graph that no longer matches the PyTorch model closely) and TensorRT "
                "runs its LSTM layer in floating point anyway; quantize it with `set --quantize` if you need to")

# the quantized layer type (as `show` and the project name it) -> why a new project leaves it float
FLOAT_BY_DEFAULT: dict[str, str] = {"LSTM": _LSTM_REASON, "LSTMCell": _LSTM_REASON}

# modules whose 2-D weight is a lookup table or a scale, not a GEMM operand
_NOT_GEMMS = (nn.Embedding, nn.EmbeddingBag)


def qualified_class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def known_linear_like(cls: type) -> tuple[type, type] | None:
    """``(the recognised class in cls's MRO, its quantized class)`` for a known Linear-like, else None."""
    for klass in cls.__mro__:
        quantized = KNOWN_LINEAR_LIKES.get(qualified_class_name(klass))
        if quantized is not None:
            return klass, quantized
    return None


def unknown_weight_gemm(module: nn.Module) -> str | None:
    """Why ``module`` (of a class with no quantized counterpart) stays a floating-point weight GEMM, or None
    when it holds no weight matrix of its own."""
    if isinstance(module, _NOT_GEMMS):
        return None
    # a weight matrix by name (``weight``, ``in_proj_weight``): a 3-D ``pos_embed`` or ``cls_token`` is no GEMM operand
    weights = [(name, p) for name, p in module.named_parameters(recurse=False)
               if p is not None and p.dim() >= 2 and "weight" in name]
    if not weights:
        return None
    name, weight = weights[0]
    shape = "x".join(str(d) for d in weight.shape)
    return (f"weight GEMM left in floating point: {qualified_class_name(type(module))} holds a {shape} '{name}' "
            "but is not a Linear, convolution or known Linear-like (Hugging Face Conv1D, timm Linear), so its "
            "computation is unknown and it gets no quantizer; if it computes x @ W + b, use nn.Linear in the "
            "model or leave it float")


def float_by_default_reason(layer_type: str) -> str | None:
    """Why a new project leaves layers of ``layer_type`` (``"LSTM"``) in floating point, or None."""
    return FLOAT_BY_DEFAULT.get(layer_type.removeprefix("Quant"))
