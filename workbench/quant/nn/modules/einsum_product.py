"""A two-operand ``torch.einsum`` that is a batched matrix product, computed as one.

TensorRT runs such an einsum as a GEMM, and Model Optimizer quantizes the inputs of matrix products; torchvision's
MaxViT writes both attention products so (``torch.einsum("B G H I D, B G H J D -> B G H I J", q, k)`` and the
probabilities times V). :func:`einsum_product` reads an equation and says whether it is one: two operands, an
explicit output, exactly one contracted index, one free index per operand, every other index a batch index shared
by both operands and the output, no index repeated within an operand and no ellipsis. :class:`EinsumProduct`
then computes it as ``permute -> matmul -> permute``, so an exported graph holds a MatMul whose inputs are the
(quantized) operands moved by Transposes only, which TensorRT builds as an INT8 GEMM.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["EinsumProduct", "einsum_product", "einsum_operands"]


@dataclass(frozen=True)
class EinsumProduct:
    """How a batched-product einsum maps onto ``torch.matmul``.

    ``left`` / ``right`` permute the operands to ``(batch..., free, contracted)`` and ``(batch..., contracted,
    free)``; ``output`` permutes the matmul's ``(batch..., free_left, free_right)`` into the equation's output
    order. ``right_transposed``: the right operand holds the contracted index last (``q k^T`` written as einsum).
    """

    equation: str
    left: tuple[int, ...]
    right: tuple[int, ...]
    output: tuple[int, ...]
    right_transposed: bool

    @staticmethod
    def _moved(tensor: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
        return tensor if order == tuple(range(len(order))) else tensor.permute(order)

    def operands(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The operands laid out for ``torch.matmul`` (what a quantizer sees before the product)."""
        return self._moved(a, self.left), self._moved(b, self.right)

    def product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``torch.matmul`` of operands laid out by :meth:`operands`, in the equation's output order."""
        return self._moved(torch.matmul(a, b), self.output)


def einsum_operands(args: Sequence) -> tuple[object, list]:
    """The equation and the operands of a ``torch.einsum`` call's positional ``args``: ``einsum(eq, a, b)`` or
    ``einsum(eq, [a, b])`` (tensors, or the fx nodes standing for them)."""
    if not args:
        return None, []
    operands = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
    return args[0], list(operands)


def einsum_product(equation: object) -> EinsumProduct | None:
    """The :class:`EinsumProduct` of ``equation`` when it is a batched matrix product of two operands, else None
    (three operands, an implicit output, an ellipsis, a trace or diagonal, two contracted indices, an outer
    product, an index summed out of one operand only)."""
    return _parse(equation) if isinstance(equation, str) else None


@functools.lru_cache(maxsize=256)  # read at every einsum call a run-time recording sees; the result is immutable
def _parse(equation: str) -> EinsumProduct | None:
    if "->" not in equation or "." in equation:
        return None
    inputs, _, output = equation.replace(" ", "").partition("->")
    parts = inputs.split(",")
    if len(parts) != 2 or not all(s.isalpha() for s in (*parts, output)):
        return None
    a, b = parts
    if any(len(set(s)) != len(s) for s in (a, b, output)):
        return None
    contracted = [c for c in a if c in b and c not in output]
    free_a = [c for c in a if c not in b]
    free_b = [c for c in b if c not in a]
    batch = [c for c in output if c in a and c in b]
    if len(contracted) != 1 or len(free_a) != 1 or len(free_b) != 1 or free_a[0] not in output \
            or free_b[0] not in output or len(output) != len(batch) + 2:
        return None
    k, i, j = contracted[0], free_a[0], free_b[0]
    left = tuple(a.index(c) for c in (*batch, i, k))
    right = tuple(b.index(c) for c in (*batch, k, j))
    result = (*batch, i, j)  # what matmul returns, in this order
    out = tuple(result.index(c) for c in output)
    return EinsumProduct(equation, left, right, out, right_transposed=b[-1] == k)
