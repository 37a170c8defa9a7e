"""One rule table: whether a functional operation gets a quantizer, whichever route found it.

torch.fx (:mod:`workbench.graph.functional`, on forwards it can trace) and the run-time recorder
(:mod:`workbench.graph.runtime_ops`, on any forward that runs) describe each candidate operation with
the same :class:`OperationFacts`; :func:`skip_reason` turns them into ``None`` (quantize it) or the
reason it stays in floating point. The reasons are TensorRT's: it fuses a residual add in a transformer
block into its kernels, fuses an activation formula into one pointwise kernel, and runs no INT8 kernel
on a mask, a position, an integer tensor or a constant.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OperationFacts", "skip_reason", "KINDS", "RESIDUAL_IN_BLOCK", "IN_FORMULA", "NOT_ACTIVATION",
           "PARAMETER_OPERAND", "NOT_A_PRODUCT", "IN_ATTENTION", "IN_SCAN", "NOT_ATTENTION", "is_attention"]

# the kinds of functional operation, as InsertedQuantizer.kind names them
KINDS = ("add", "concat", "matmul", "attention")

RESIDUAL_IN_BLOCK = ("add inside a transformer block (a module with a LayerNorm or an attention): left in floating "
                     "point by default, TensorRT keeps it in its fused kernels; set "
                     "residual_adds_in_transformer_blocks to quantize it")
IN_FORMULA = ("a step inside an elementwise formula (an activation such as GELU's tanh approximation, SiLU or "
              "hard-swish written out): TensorRT fuses the whole formula into one pointwise kernel, a Q/DQ inside "
              "it would break that fusion and add error for no INT8 kernel")
NOT_ACTIVATION = ("an operand is not a floating activation (a mask, position or index computation, or an integer "
                  "tensor): TensorRT runs no INT8 kernel on it")
PARAMETER_OPERAND = "one operand is a parameter or buffer of the model, not an activation"
NOT_A_PRODUCT = ("not a product of two activations (an operand is a parameter, a mask, a position or an integer "
                 "tensor): a Linear-like or index computation")
IN_ATTENTION = ("an add inside an attention's own forward (a relative-position bias or a mask added to the scores): "
                "TensorRT's fused attention takes it in floating point, a Q/DQ there would break the fusion")
IN_SCAN = ("inside a loop of tensor operations with no layer in it (a scan over the sequence, as a state-space "
           "model's): the number of steps follows the input's length, and TensorRT runs no fused INT8 kernel there")
# reasons that say a product of two activations is not an attention: TensorRT fuses no multi-head attention there,
# so neither `show` nor a check of the exported file (bench/zoo_checks.py) counts it among the attention products
NOT_ATTENTION = (IN_SCAN,)
_OUT = "writes into an out= tensor"
_DIM = "the concatenation dimension is computed at run time"
_INPLACE = "in-place add whose first operand is read again afterwards"


@dataclass(frozen=True)
class OperationFacts:
    """What a route knows about one candidate operation's operands."""

    kind: str                        # one of KINDS
    parameter: bool = False          # an operand is a parameter or buffer (or a view of one)
    activations: bool = True         # every operand is a floating activation
    has_out: bool = False            # out= given
    alpha: object = 1                # torch.add's alpha
    formula: bool = False            # both operands of an add come from one tensor through elementwise steps
    inplace_reread: bool = False     # an in-place add whose first operand is read again
    dim_known: bool = True           # a concatenation's dimension is a Python int
    in_block: bool = False           # the operation is in a transformer block's own forward
    in_attention: bool = False       # an add in a forward that computes attention products (a bias or mask)


def skip_reason(facts: OperationFacts, *, residual_adds_in_transformer_blocks: bool = False) -> str | None:
    """``None`` when the operation gets a quantizer, else why it stays in floating point (TensorRT's rules)."""
    kind = facts.kind
    if kind == "matmul":
        if facts.parameter or not facts.activations:
            return NOT_A_PRODUCT
        return _OUT if facts.has_out else None
    if kind == "attention":
        return None if facts.activations else NOT_ACTIVATION
    if facts.parameter:
        return PARAMETER_OPERAND
    if not facts.activations:
        return NOT_ACTIVATION
    if kind == "concat":
        if not facts.dim_known:
            return _DIM
        return _OUT if facts.has_out else None
    if facts.has_out:
        return _OUT
    if facts.alpha != 1:
        return f"scales the second operand (alpha={facts.alpha!r})"
    if facts.formula:
        return IN_FORMULA
    if facts.in_attention:
        return IN_ATTENTION
    if facts.inplace_reread:
        return _INPLACE
    if facts.in_block and not residual_adds_in_transformer_blocks:
        return RESIDUAL_IN_BLOCK
    return None


def is_attention(kind: str, reason: str | None) -> bool:
    """Whether an operation of ``kind`` left in floating point for ``reason`` (None: quantized) is an attention
    product: a product of two activations (``matmul``) or a fused attention, unless the rule that left it in
    float says TensorRT fuses no attention there (a scan step of a state-space model)."""
    return kind in ("matmul", "attention") and reason not in NOT_ATTENTION
