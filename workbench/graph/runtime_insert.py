"""The run-time route of the functional rewrite: quantizers for the operations torch.fx could not reach.

:func:`workbench.graph.insert_functional_quantizers` rewrites with torch.fx every forward it can trace
(the rewrite is checked against the original on the sample input, and the placement rules read the
traced graph). For the forwards it cannot trace (or whose rewrite differed), it now runs the model once
under :func:`workbench.graph.runtime_ops.record_functional_ops` and gives each such module the
quantizers of its own recorded operations, applied at run time
(:mod:`workbench.graph.runtime_quant`). The decision is the one rule table's
(:mod:`workbench.graph.placement`); the names are the fx route's (``<owner>.matmul_1``); what is left in
floating point is reported with its reason.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from workbench.graph.placement import RESIDUAL_IN_BLOCK
from workbench.graph.runtime_ops import NAME_BASES, RecordedOp, RuntimeRecord
from workbench.graph.runtime_quant import attach_runtime_quantizers
from workbench.quant.nn.modules.quant_attention import QuantMatMul, QuantSDPA
from workbench.quant.nn.modules.quant_ops import QuantAdd, QuantConcat
from workbench.quant.tensor_quant import QuantDescriptor

__all__ = ["RuntimeInsertion", "insert_runtime_quantizers"]

_MATMUL_OPS = {"matmul": "matmul", "rmatmul": "matmul", "bmm": "bmm", "baddbmm": "baddbmm", "einsum": "einsum"}


@dataclass(frozen=True)
class RuntimeInsertion:
    """One recorded operation, quantized at run time (``name`` set) or left in floating point (``reason`` set)."""

    owner: str
    op: RecordedOp
    name: str | None        # qualified name of the quantizer module
    reason: str | None


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _new_name(module: nn.Module, taken: set[str], base: str) -> str:
    """``base``, ``base_1``, ... : the first name neither taken here nor an attribute of the module."""
    index = 0
    while True:
        name = base if index == 0 else f"{base}_{index}"
        if name not in taken and not hasattr(module, name):
            taken.add(name)
            return name
        index += 1


def _module_for(op: RecordedOp, descriptor: QuantDescriptor | None, chosen: QuantDescriptor | None) -> nn.Module:
    options = dict(op.options)
    if op.kind == "add":
        return QuantAdd(descriptor)
    if op.kind == "concat":
        return QuantConcat(options.get("dim", 0), descriptor)
    if op.kind == "matmul":
        return QuantMatMul(descriptor, op=_MATMUL_OPS[op.layout], roles=op.roles, quant_desc_probs=chosen,
                           equation=options.get("equation"))
    return QuantSDPA(descriptor)


def insert_runtime_quantizers(model: nn.Module, record: RuntimeRecord, owners: list[str], *,
                              enabled: Callable[[str], bool],
                              descriptor: Callable[[str], QuantDescriptor | None],
                              chosen: Callable[[str], QuantDescriptor | None],
                              ignored: Callable[[str], str | None],
                              residual_adds_in_transformer_blocks: bool = False) -> list[RuntimeInsertion]:
    """Give each of ``owners`` the quantizers of its recorded operations that the rule table quantizes.

    Args:
        model: the model (the owners are its submodules, by qualified name; "" is the model).
        record: what :func:`workbench.graph.runtime_ops.record_functional_ops` recorded on it.
        owners: the modules whose own forward torch.fx did not rewrite.
        enabled: ``kind -> bool``: the add / concat / matmul / attention switches.
        descriptor: ``qualified name -> descriptor`` of the new quantizers (None: the modules' default).
        chosen: ``qualified name -> descriptor`` chosen for that operation only (None: none chosen).
        ignored: the ignore policy: ``qualified name -> the pattern that ignores it, or None``.
        residual_adds_in_transformer_blocks: quantize residual adds in transformer blocks too.

    Returns:
        One :class:`RuntimeInsertion` per recorded operation of the owners, in call order.
    """
    results: list[RuntimeInsertion] = []
    for owner in owners:
        module = model.get_submodule(owner) if owner else model
        taken: set[str] = set()
        children: dict[tuple, tuple[str, nn.Module]] = {}
        for op in record.by_owner(owner):
            reason = op.reason(residual_adds_in_transformer_blocks)
            if reason is None and not enabled(op.kind):
                reason = f"{op.kind} quantization is switched off in the project's functional settings"
            name = qualified = None
            if reason in (None, RESIDUAL_IN_BLOCK):  # as the fx route: a residual add left float keeps its name
                name = _new_name(module, taken, NAME_BASES[op.kind])
                qualified = _qualified(owner, name)
                if reason is None:
                    pattern = ignored(qualified)
                    if pattern is not None:
                        reason = f"ignored by policy {pattern!r}"
            if reason is not None:
                results.append(RuntimeInsertion(owner, op, None, reason))
                continue
            children[op.key] = (name, _module_for(op, descriptor(qualified), chosen(qualified)))
            results.append(RuntimeInsertion(owner, op, qualified, None))
        if children:
            attach_runtime_quantizers(module, children)
    return results
