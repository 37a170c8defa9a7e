"""Recognising the functional operations the rewrite quantizes, in an fx graph.

Adds (``a + b``, ``torch.add``, ``a += b``, ``a.add_(b)``), matrix products (``torch.matmul``, ``@``,
``torch.bmm``, ``torch.baddbmm``, their Tensor methods, and a two-operand ``torch.einsum`` whose equation is a
batched matrix product), ``F.scaled_dot_product_attention``, and
what the operands of a product are in an attention (query/key or probabilities/value).
"""
from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from workbench.graph.trace import ADD_FUNCTIONS, ADD_METHODS
from workbench.quant.nn.modules.einsum_product import einsum_operands, einsum_product

__all__ = ["describe_node", "add_operands", "matmul_operands", "einsum_equation", "product_roles", "takes_var_keyword",
           "SDPA_FUNCTIONS", "SDPA_KEYWORDS"]

def describe_node(node: fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        label = f"Tensor.{target}"
    else:
        module = getattr(target, "__module__", None) or ""
        module = "operator" if module in ("_operator", "operator") else module
        label = f"{module}.{getattr(target, '__name__', str(target))}" if module else str(target)

    def arg(a) -> str:
        if isinstance(a, fx.Node):
            return a.name
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(arg(x) for x in a) + "]"
        return repr(a)
    args = ", ".join([arg(a) for a in node.args] + [f"{k}={arg(v)}" for k, v in node.kwargs.items()])
    return f"{label}({args})"


MATMUL_FUNCTIONS = {torch.matmul: "matmul", operator.matmul: "matmul", torch.bmm: "bmm", torch.baddbmm: "baddbmm"}
MATMUL_METHODS = {"matmul": "matmul", "__matmul__": "matmul", "bmm": "bmm", "baddbmm": "baddbmm"}
SDPA_FUNCTIONS = (F.scaled_dot_product_attention,)
SDPA_KEYWORDS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
def add_operands(node: fx.Node):
    """``(a, b, alpha, inplace, has_out)`` for an add node, else None."""
    if node.op == "call_function" and node.target in ADD_FUNCTIONS:
        inplace = ADD_FUNCTIONS[node.target]
        names = ("input", "other")  # torch.add's keywords; operator.add takes none
    elif node.op == "call_method" and node.target in ADD_METHODS:
        inplace = ADD_METHODS[node.target]
        names = ("self", "other")
    else:
        return None
    args = list(node.args)
    kwargs = dict(node.kwargs)
    for key in names[len(args):]:
        if key in kwargs:
            args.append(kwargs.pop(key))
    if len(args) < 2:
        return None
    alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
    return args[0], args[1], alpha, inplace, "out" in kwargs


_SOFTMAX = (torch.softmax, F.softmax, torch.nn.functional.softmax)
_PASS_THROUGH = (F.dropout, torch.dropout)


def product_roles(a: fx.Node, b: fx.Node, b_transposed: bool = False) -> tuple[str, ...]:
    """("probabilities", "value") when ``a`` is a softmax (maybe through dropout or a module such as
    nn.Softmax/nn.Dropout), ("query", "key") when ``b`` is a transposed tensor (or ``b_transposed``: an einsum
    that contracts ``b``'s last index), else ()."""
    def is_softmax(node: fx.Node, depth: int = 0) -> bool:
        if (node.op == "call_function" and node.target in _SOFTMAX
                or node.op == "call_method" and node.target == "softmax"):
            return True
        if node.op == "call_module" and "softmax" in str(node.target).lower():
            return True
        passing = (node.op == "call_function" and node.target in _PASS_THROUGH) or (
            node.op == "call_module" and ("drop" in str(node.target).lower()))
        return depth < 3 and passing and bool(node.args) and isinstance(node.args[0], fx.Node) and \
            is_softmax(node.args[0], depth + 1)

    if is_softmax(a):
        return ("probabilities", "value")
    transposed = b_transposed or (b.op == "call_method" and b.target in ("transpose", "permute", "mT")) or (
        b.op == "call_function" and b.target in (torch.transpose,))
    return ("query", "key") if transposed else ()


def takes_var_keyword(module: nn.Module) -> bool:
    try:
        parameters = inspect.signature(type(module).forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def einsum_equation(node: fx.Node) -> str | None:
    """The equation of a ``torch.einsum`` node of two operands that is a batched matrix product, else None."""
    if node.op != "call_function" or node.target is not torch.einsum or node.kwargs:
        return None
    equation, tensors = einsum_operands(node.args)
    return equation if len(tensors) == 2 and einsum_product(equation) is not None else None


def matmul_operands(node: fx.Node):
    """``(op, a, b, bias, beta, alpha, has_out)`` for a matrix product node, else None; ``op`` is ``"einsum"``
    for a batched-product einsum (its equation: :func:`einsum_equation`)."""
    if einsum_equation(node) is not None:
        _, (a, b) = einsum_operands(node.args)
        return "einsum", a, b, None, 1, 1, False
    if node.op == "call_function" and node.target in MATMUL_FUNCTIONS:
        op = MATMUL_FUNCTIONS[node.target]
        names = ("input", "batch1", "batch2") if op == "baddbmm" else ("input", "other") if op == "matmul" \
            else ("input", "mat2")
    elif node.op == "call_method" and node.target in MATMUL_METHODS:
        op = MATMUL_METHODS[node.target]
        names = ("self", "batch1", "batch2") if op == "baddbmm" else ("self", "other") if op == "matmul" \
            else ("self", "mat2")
    else:
        return None
    if operator.matmul is node.target:
        names = ("a", "b")
    bound: dict[str, Any] = dict(zip(names, node.args))
    bound.update({k: v for k, v in node.kwargs.items() if k in names})
    if any(n not in bound for n in names):
        return None
    values = [bound[n] for n in names]
    has_out = "out" in node.kwargs
    if op == "baddbmm":
        extra = list(node.args[3:]) + [None, None]
        beta = node.kwargs.get("beta", extra[0] if extra[0] is not None else 1)
        alpha = node.kwargs.get("alpha", extra[1] if extra[1] is not None else 1)
        return op, values[1], values[2], values[0], beta, alpha, has_out
    return op, values[0], values[1], None, 1, 1, has_out
