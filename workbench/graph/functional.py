"""Give functional operations that carry activations quantizers, without editing the user's model class.

For every module whose own ``forward`` adds two activations (``a + b``, ``torch.add``, ``a += b``,
``a.add_(b)``), concatenates them (``torch.cat``), multiplies two of them (``torch.matmul``, ``@``,
``torch.bmm``, ``torch.baddbmm``, a batched-product ``torch.einsum``) or calls ``F.scaled_dot_product_attention``,
:func:`insert_functional_quantizers` traces that forward with torch.fx (children stay opaque calls),
replaces each such operation by a QuantAdd / QuantConcat / QuantMatMul / QuantSDPA call, and puts the
resulting ``GraphModule`` where the module was. Hugging Face attention modules, which fx cannot trace,
get their attention function quantized instead (:mod:`workbench.graph.hf_attention`). Names are
derived from the owning module and stable across runs: the first add of ``layer1.0`` is
``layer1.0.add``, the next ``layer1.0.add_1``; the products of ``blocks.0.attn`` are
``blocks.0.attn.matmul`` and ``blocks.0.attn.matmul_1``; a concat of ``model.4`` is ``model.4.cat``.

What stays the same: every submodule keeps its object, name and parameters (nothing is copied), and
the new module's state_dict holds every key the old one had (plus the new quantizers). Modules whose
forward has nothing to quantize are left as they are. With a sample input, every traced module is run
against its original on the arguments it really received and kept only if the outputs are equal
(:mod:`workbench.graph.verify`). Operations on masks, positions and integer tensors, and products with
a parameter, get no quantizer (:mod:`workbench.graph.dataflow`); residual adds inside transformer
blocks stay float unless asked for. A module whose forward cannot be traced is reported with the
reason and left as it is; its children are still visited. The report lists every operation
quantized, every candidate skipped and why, and every module that could not be traced.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import replace as replace_facts
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from workbench.graph.composites import hides_calls, leaf_reason
from workbench.graph.dataflow import activation_nodes, in_transformer_block, inplace_alias_risk, pointwise_formula
from workbench.graph.fx_guard import GuardedTracer
from workbench.graph.hf_attention import quantize_hf_attention
from workbench.graph.operations import (
    SDPA_FUNCTIONS,
    SDPA_KEYWORDS,
    add_operands,
    describe_node,
    einsum_equation,
    matmul_operands,
    product_roles,
    takes_var_keyword,
)
from workbench.graph.placement import RESIDUAL_IN_BLOCK, OperationFacts, skip_reason
from workbench.graph.runtime_insert import RuntimeInsertion, insert_runtime_quantizers
from workbench.graph.runtime_ops import RuntimeRecord, record_functional_ops
from workbench.graph.trace import (
    CAT_FUNCTIONS,
    TraceFailure,
    attributes_kept,
    explain_trace_error,
    flag_constants,
    is_leaf,
    scalar_nodes,
    trace_with_call,
)
from workbench.graph.tree import NOTES_ATTR, add_note, is_quantized_module, module_notes
from workbench.graph.verify import ModuleCall, capture_calls, traced_differs, value_dtypes
from workbench.plurals import count_text
from workbench.quant.nn.modules.einsum_product import einsum_product
from workbench.quant.nn.modules.quant_attention import QuantMatMul, QuantSDPA
from workbench.quant.nn.modules.quant_ops import QuantAdd, QuantConcat
from workbench.quant.nn.modules.quant_transformer import QuantTransformerEncoder
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.replace import IgnorePolicy, ignore_matcher
from workbench.quant.tensor_quant import QuantDescriptor

logger = logging.getLogger(__name__)

__all__ = ["InsertedQuantizer", "SkippedOp", "FunctionalQuantReport", "insert_functional_quantizers"]


@dataclass(frozen=True)
class InsertedQuantizer:
    """A functional operation that now has quantizers."""

    name: str                 # qualified name of the new module, e.g. "layer1.0.add"
    kind: str                 # "add", "concat", "matmul" (a product of activations) or "attention"
    owner: str                # qualified name of the module whose forward holds the operation
    operation: str            # what was replaced, e.g. "operator.add(bn2, x)"
    num_inputs: int


@dataclass(frozen=True)
class SkippedOp:
    """A candidate operation left in floating point, and why."""

    owner: str
    operation: str
    reason: str
    kind: str = ""  # one of placement.KINDS ("" where the route did not say)


@dataclass
class FunctionalQuantReport:
    """What :func:`insert_functional_quantizers` did, module by module."""

    inserted: list[InsertedQuantizer] = field(default_factory=list)
    skipped: list[SkippedOp] = field(default_factory=list)
    failures: list[TraceFailure] = field(default_factory=list)
    traced: list[str] = field(default_factory=list)      # modules whose own forward was traced
    converted: list[str] = field(default_factory=list)   # modules replaced by a GraphModule
    opaque: list[str] = field(default_factory=list)      # torch.nn layers with children, not looked into
    verified: list[str] = field(default_factory=list)    # converted modules checked equal on the sample input
    # attention modules (Hugging Face, ...) quantized at the function level, or not, with the reason
    attention_modules: list[str] = field(default_factory=list)
    unquantized_attention: list[SkippedOp] = field(default_factory=list)
    # modules torch.fx could not rewrite whose operations were found by running the model and are
    # quantized at run time (workbench.graph.runtime_insert), and what that run recorded
    runtime: list[str] = field(default_factory=list)
    record: RuntimeRecord | None = None
    runtime_ops: list[RuntimeInsertion] = field(default_factory=list)  # each recorded op of those modules

    @property
    def adds(self) -> list[InsertedQuantizer]:
        return [i for i in self.inserted if i.kind == "add"]

    @property
    def concats(self) -> list[InsertedQuantizer]:
        return [i for i in self.inserted if i.kind == "concat"]

    @property
    def matmuls(self) -> list[InsertedQuantizer]:
        return [i for i in self.inserted if i.kind == "matmul"]

    @property
    def attentions(self) -> list[InsertedQuantizer]:
        return [i for i in self.inserted if i.kind == "attention"]

    @property
    def attention_products(self) -> int:
        """Matrix products of activations that now have both inputs quantized (an attention holds two)."""
        return len(self.matmuls) + 2 * len(self.attentions)

    @property
    def inserted_names(self) -> list[str]:
        return [i.name for i in self.inserted]

    @property
    def complete(self) -> bool:
        """True when every module could be traced and no candidate was skipped."""
        return not self.failures and not self.skipped

    def failures_text(self) -> str:
        """The modules that could not be traced, in words (the tracer's own errors are logged at debug level)."""
        return (f"{count_text(len(self.failures), 'module')} could not be traced (torch.fx cannot follow their Python "
                "code), so "
                "functional operations in their own forward are not quantized, their sublayers are: "
                + ", ".join(f"{f.name or '<model>'} ({f.type_name})" for f in self.failures[:5]))

    def attention_text(self) -> str:
        return (f"{count_text(len(self.unquantized_attention), 'attention module')} left in floating point: "
                + "; ".join(f"{s.owner}: {s.reason}" for s in self.unquantized_attention[:5]))

    def summary(self) -> str:
        parts = [f"{count_text(len(self.adds), 'add')}, {count_text(len(self.concats), 'concatenation')}, "
                 f"{count_text(len(self.matmuls), 'matrix product')} and "
                 f"{count_text(len(self.attentions), 'attention')} quantized in "
                 f"{count_text(len(self.converted), 'traced module')} and "
                 f"{count_text(len(self.attention_modules), 'attention module')} "
                 f"({count_text(len(self.traced), 'module')} traced)"]
        if self.unquantized_attention:
            parts.append(self.attention_text())
        if self.skipped:
            parts.append(f"{len(self.skipped)} left in floating point: "
                         + "; ".join(f"{s.owner or '<model>'}: {s.operation} ({s.reason})" for s in self.skipped[:5]))
        if self.failures:
            parts.append(self.failures_text())
        if self.opaque:
            parts.append(f"{count_text(len(self.opaque), 'torch.nn layer')} with sublayers kept whole (their internal "
                         f"adds are not quantized): {', '.join(self.opaque[:5])}")
        return "; ".join(parts)


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


_NOT_QUANTIZED_NOTE = "functional operations not quantized"
_NO_OWN_OPS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, QuantTransformerEncoder)


class _Inserter:
    def __init__(self, quant_desc_input: QuantDescriptor | None, ignored: Callable[[str], str | None],
                 add: bool, concat: bool, report: FunctionalQuantReport,
                 descriptor_for: Callable[[str], QuantDescriptor | None] | None = None, matmul: bool = True,
                 attention: bool = True, residual_adds_in_transformer_blocks: bool = False,
                 calls: dict[int, ModuleCall] | None = None) -> None:
        self.quant_desc_input = quant_desc_input
        self.descriptor_for = descriptor_for
        self.ignored = ignored
        self.add = add
        self.concat = concat
        self.matmul = matmul
        self.attention = attention
        self.residual_in_blocks = residual_adds_in_transformer_blocks
        self.calls = calls
        self.report = report
        self.memo: dict[int, nn.Module] = {}
        self.function_level: set[int] = set()  # attention modules quantized without tracing

    def descriptor(self, qualified: str) -> QuantDescriptor | None:
        chosen = self.descriptor_for(qualified) if self.descriptor_for is not None else None
        return chosen or self.quant_desc_input

    # ----- traversal ------------------------------------------------------------------------

    def convert(self, module: nn.Module, path: str) -> nn.Module:
        """Convert ``module``'s children (in place), then ``module`` itself; return what replaces it."""
        if id(module) in self.memo:  # a module registered under two names is converted once
            return self.memo[id(module)]
        if is_leaf(module):
            if module._modules and not isinstance(module, fx.GraphModule) and not is_quantized_module(module):
                self.report.opaque.append(path or "<model>")
            self.memo[id(module)] = module
            return module
        for attr, child in list(module._modules.items()):
            if child is None:
                continue
            new_child = self.convert(child, _qualified(path, attr))
            if new_child is not child:
                module._modules[attr] = new_child
        result = self._convert_own_forward(module, path)
        self.memo[id(module)] = result
        return result

    def _convert_own_forward(self, module: nn.Module, path: str) -> nn.Module:
        if type(module) in _NO_OWN_OPS[:3] or isinstance(module, _NO_OWN_OPS[3:]) or id(module) in self.function_level:
            return module  # containers add nothing of their own; quantized attention modules are done
        risk = inplace_alias_risk(module)
        if risk is not None:
            self.report.failures.append(TraceFailure(path, type(module).__name__, risk))
            logger.info("Not tracing %s (%s): %s", path or "<model>", type(module).__name__, risk)
            return module
        call = self.calls.get(id(module)) if self.calls is not None else None
        with attributes_kept(module):
            traced = self._trace(module, path, call)
        if traced is None:
            return module
        tracer, graph = traced
        return self._rewrite(module, path, call, tracer, graph)

    def _trace(self, module: nn.Module, path: str, call: ModuleCall | None) -> tuple[fx.Tracer, fx.Graph] | None:
        """The traced graph of ``module``'s own forward (and its tracer), or None with the failure reported."""
        try:
            tracer = _OwnForwardTracer()
            graph = tracer.trace(module)
        except Exception as error:  # the user's forward runs on proxies: anything can be raised
            graph = None
            flags = flag_constants(module)
            if flags:  # ``if augment:`` (YOLOv5): trace the path the default flags take
                try:
                    tracer = _OwnForwardTracer()
                    graph = tracer.trace(module, concrete_args=flags)
                except Exception:
                    graph = None
            if graph is None and call is not None and (call.kwargs or takes_var_keyword(module)):
                try:  # **kwargs forwards (Hugging Face blocks): trace the forward as it was called
                    tracer = _OwnForwardTracer()
                    graph = trace_with_call(tracer, module, call.args, call.kwargs)
                except Exception:  # report the first, plainer error
                    graph = None
            if graph is None:
                reason = explain_trace_error(error)
                self.report.failures.append(TraceFailure(path, type(module).__name__, reason))
                logger.info("Could not trace %s (%s): %s", path or "<model>", type(module).__name__, reason)
                return None
        return tracer, graph

    def _rewrite(self, module: nn.Module, path: str, call: ModuleCall | None, tracer: fx.Tracer,
                 graph: fx.Graph) -> nn.Module:
        """``module`` with the candidate operations of its traced ``graph`` quantized (or itself, unchanged)."""
        composite = next((n.target for n in graph.nodes if n.op == "call_function" and hides_calls(n.target)),
                         None)
        if composite is not None:  # its GEMMs and products are inside one call: the run-time route finds them
            self.report.failures.append(TraceFailure(path, type(module).__name__, leaf_reason(composite)))
            return module
        self.report.traced.append(path)
        gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
        dtypes = value_dtypes(gm, call) if call is not None else {}
        marks = len(self.report.inserted), len(self.report.skipped)
        added = self._insert(gm, module, path, dtypes)
        if not added:
            return module
        _complete_state(gm, module)
        if self.calls is not None:
            if call is None:
                reason = "not called when the model ran on the sample input, so the traced forward could not be checked"
            else:
                new = [q for name in added for q in gm.get_submodule(name).modules() if isinstance(q, TensorQuantizer)]
                reason = traced_differs(gm, module, call, new)
            if reason is not None:
                del self.report.inserted[marks[0]:]
                del self.report.skipped[marks[1]:]
                self.report.failures.append(TraceFailure(path, type(module).__name__, reason))
                add_note(module, f"{_NOT_QUANTIZED_NOTE}: {reason}")
                logger.info("Keeping %s (%s) untraced: %s", path or "<model>", type(module).__name__, reason)
                return module
            self.report.verified.append(path)
        self.report.converted.append(path)
        return gm

    # ----- graph rewriting ------------------------------------------------------------------

    def _insert(self, gm: fx.GraphModule, original: nn.Module, path: str,
                dtypes: dict[fx.Node, torch.dtype | None]) -> list[str]:
        """Replace the candidate operations of ``gm``; return the names of the new modules."""
        graph = gm.graph
        scalars = scalar_nodes(graph)
        activations = activation_nodes(graph, dtypes)
        order = {node: i for i, node in enumerate(graph.nodes)}
        taken: set[str] = set()
        added: list[str] = []
        block: list[bool] = []  # computed once, on the first add
        scores = _score_nodes(graph, activations)  # attention scores: an add of them is the scores' bias

        def new_name(base: str) -> str:
            index = 0
            while True:
                candidate = base if index == 0 else f"{base}_{index}"
                if candidate not in taken and not hasattr(original, candidate) and not hasattr(gm, candidate):
                    taken.add(candidate)
                    return candidate
                index += 1

        def is_tensor_operand(arg) -> bool:
            return isinstance(arg, fx.Node) and arg not in scalars

        def claim(base: str, reason: str | None) -> tuple[str | None, str | None, str | None]:
            """(name, qualified name, reason to skip): the name is reserved even when skipped."""
            name = new_name(base)
            qualified = _qualified(path, name)
            if reason is None:
                ignored = self.ignored(qualified)
                if ignored is not None:  # the name stays reserved: the next operation keeps its name
                    reason = f"ignored by policy {ignored!r}"
            return name, qualified, reason

        def replace(node: fx.Node, name: str, module: nn.Module, args: tuple, kwargs: dict | None = None) -> None:
            gm.add_submodule(name, module)
            with graph.inserting_before(node):
                replacement = graph.call_module(name, args, kwargs or {})
            replacement.meta = dict(node.meta)
            if node in activations:
                activations.add(replacement)
            if node in scores:
                scores.add(replacement)
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
            added.append(name)

        for node in list(graph.nodes):
            if self.add:
                operands = add_operands(node)
                if operands is not None:
                    a, b, alpha, inplace, has_out = operands
                    if not (is_tensor_operand(a) and is_tensor_operand(b)):
                        continue  # x + 1, x.size(0) + 1: nothing to quantize
                    description = describe_node(node)
                    parameter = a.op == "get_attr" or b.op == "get_attr"
                    facts = OperationFacts(
                        "add", parameter=parameter, activations=a in activations and b in activations,
                        has_out=has_out, alpha=alpha, formula=not parameter and pointwise_formula(a, b),
                        inplace_reread=inplace and any(order[user] > order[node] for user in a.users
                                                       if user is not node))
                    facts = replace_facts(facts, in_attention=any(_reaches(n, scores) for n in (a, b)))
                    reason = skip_reason(facts)
                    if reason is None and not self.residual_in_blocks:
                        if not block:
                            block.append(in_transformer_block(original))
                        reason = skip_reason(replace_facts(facts, in_block=block[0]))
                    # a residual add left float by default keeps its name, so the switch never renames others
                    name, qualified, reason = (claim("add", reason) if reason in (None, RESIDUAL_IN_BLOCK)
                                               else (None, None, reason))
                    if reason is not None:
                        self.report.skipped.append(SkippedOp(path, description, reason))
                        continue
                    replace(node, name, QuantAdd(self.descriptor(qualified)), (a, b))
                    self.report.inserted.append(InsertedQuantizer(qualified, "add", path, description, 2))
                    continue
            if self.concat and node.op == "call_function" and node.target in CAT_FUNCTIONS:
                tensors = node.args[0] if node.args else node.kwargs.get("tensors")
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", node.kwargs.get("axis", 0))
                description = describe_node(node)
                reason = None
                if isinstance(tensors, fx.Node) and tensors.op == "placeholder" and tensors not in scalars:
                    # YOLOv5's Concat module: forward(x) is torch.cat(x, self.d) over the list its caller passes;
                    # the caller's graph shows the tensors, so placement rules still see every operand
                    tensors = (tensors,)
                    if not isinstance(dim, int):
                        reason = "the concatenation dimension is computed at run time"
                    name, qualified, reason = claim("cat", reason) if reason is None else (None, None, reason)
                    if reason is not None:
                        self.report.skipped.append(SkippedOp(path, description, reason))
                        continue
                    replace(node, name, QuantConcat(dim, self.descriptor(qualified)), (tensors[0],))
                    self.report.inserted.append(InsertedQuantizer(qualified, "concat", path, description, 0))
                    continue
                if not isinstance(tensors, (list, tuple)) or not all(is_tensor_operand(t) for t in tensors):
                    reason = "its inputs are not a list of activations visible to the tracer"
                else:
                    reason = skip_reason(OperationFacts(
                        "concat", parameter=any(t.op == "get_attr" for t in tensors),
                        activations=all(t in activations for t in tensors), dim_known=isinstance(dim, int),
                        has_out="out" in node.kwargs))
                name, qualified, reason = claim("cat", reason) if reason is None else (None, None, reason)
                if reason is not None:
                    self.report.skipped.append(SkippedOp(path, description, reason))
                    continue
                replace(node, name, QuantConcat(dim, self.descriptor(qualified)), (list(tensors),))
                self.report.inserted.append(InsertedQuantizer(qualified, "concat", path, description, len(tensors)))
                continue
            if self.matmul:
                product = matmul_operands(node)
                if product is not None:
                    op, a, b, bias, beta, alpha, has_out = product
                    if not (is_tensor_operand(a) and is_tensor_operand(b)):
                        continue
                    description = describe_node(node)
                    reason = skip_reason(OperationFacts(
                        "matmul", parameter=a.op == "get_attr" or b.op == "get_attr",
                        activations=a in activations and b in activations, has_out=has_out))
                    name, qualified, reason = claim("matmul", reason) if reason is None else (None, None, reason)
                    if reason is not None:
                        self.report.skipped.append(SkippedOp(path, description, reason, "matmul"))
                        continue
                    kwargs = {} if op != "baddbmm" else {"bias": bias, "beta": beta, "alpha": alpha}
                    # the probabilities of P @ V get the attention-probabilities default, as QuantSDPA's do,
                    # unless a descriptor was chosen for this product
                    chosen = self.descriptor_for(qualified) if self.descriptor_for is not None else None
                    equation = einsum_equation(node) if op == "einsum" else None
                    transposed = equation is not None and einsum_product(equation).right_transposed
                    product_module = QuantMatMul(self.descriptor(qualified), op=op, quant_desc_probs=chosen,
                                                 roles=product_roles(a, b, transposed), equation=equation)
                    replace(node, name, product_module, (a, b), kwargs)
                    self.report.inserted.append(InsertedQuantizer(qualified, "matmul", path, description, 2))
                    continue
            if self.attention and node.op == "call_function" and node.target in SDPA_FUNCTIONS:
                names = ("query", "key", "value") + SDPA_KEYWORDS
                bound = dict(zip(names, node.args))
                bound.update(node.kwargs)
                q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
                description = describe_node(node)
                reason = skip_reason(OperationFacts(
                    "attention", activations=all(is_tensor_operand(t) and t in activations for t in (q, k, v))))
                name, qualified, reason = claim("sdpa", reason) if reason is None else (None, None, reason)
                if reason is not None:
                    self.report.skipped.append(SkippedOp(path, description, reason, "attention"))
                    continue
                kwargs = {key: bound[key] for key in SDPA_KEYWORDS if key in bound}
                replace(node, name, QuantSDPA(self.descriptor(qualified)), (q, k, v), kwargs)
                self.report.inserted.append(InsertedQuantizer(qualified, "attention", path, description, 4))
        if added:
            graph.lint()
            gm.recompile()
        return added


_SCORE_STEPS = frozenset({"mul", "truediv", "div", "to", "float", "type_as", "view", "reshape", "reshape_as",
                          "transpose", "permute", "contiguous", "getitem", "add", "sub"})


def _score_nodes(graph: fx.Graph, activations: set[fx.Node]) -> set[fx.Node]:
    """Products of two activations in this forward (attention scores, ``q @ k^T``)."""
    found = set()
    for node in graph.nodes:
        product = matmul_operands(node)
        if product is not None:
            a, b = product[1], product[2]
            if isinstance(a, fx.Node) and isinstance(b, fx.Node) and a in activations and b in activations:
                found.add(node)
    return found


def _reaches(node: fx.Node, scores: set[fx.Node], depth: int = 0) -> bool:
    """Whether ``node`` is a product in ``scores`` or comes from one through scaling and shape steps (the
    operand of ``scores * scale + bias``), as the run-time route's rule reads it."""
    if node in scores:
        return True
    if depth > 6 or node.op not in ("call_function", "call_method"):
        return False
    name = getattr(node.target, "__name__", str(node.target)).strip("_")
    return name in _SCORE_STEPS and bool(node.args) and isinstance(node.args[0], fx.Node) and \
        _reaches(node.args[0], scores, depth + 1)


class _OwnForwardTracer(GuardedTracer):
    """Traces one module's own forward: every submodule call stays a call."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _complete_state(gm: fx.GraphModule, original: nn.Module) -> None:
    """Make ``gm`` hold every submodule, parameter and buffer ``original`` had, under the same names.

    A traced GraphModule only copies what its forward uses; a layer that is defined but not called
    (or called through a path fx flattened into a new container) would otherwise drop out of the
    state_dict. The objects are the original ones, not copies.
    """
    for attr, child in original._modules.items():
        gm._modules[attr] = child
    for name, param in original._parameters.items():
        gm._parameters[name] = param
    for name, buffer in original._buffers.items():
        gm.register_buffer(name, buffer)  # persistence follows from the set copied below
    gm._non_persistent_buffers_set |= set(original._non_persistent_buffers_set)
    gm.training = original.training
    # plain attributes the user's code may read (flags such as YOLOv5's ``Bottleneck.add``)
    for key, value in vars(original).items():
        if not key.startswith("_") and key != "forward" and key not in vars(gm) and not hasattr(type(gm), key):
            gm.__dict__[key] = value
    # hooks registered on the module itself still run
    for hooks in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_state_dict_hooks",
                  "_load_state_dict_pre_hooks"):
        source = getattr(original, hooks, None)
        target = getattr(gm, hooks, None)
        if source and target is not None:
            target.update(source)


def _insert_at_run_time(model: nn.Module, record: RuntimeRecord, report: FunctionalQuantReport,
                        inserter: _Inserter, residual: bool, switches: dict[str, bool]) -> None:
    """Quantize, at run time, the recorded operations of the modules torch.fx could not rewrite."""
    failed = {f.name: f for f in report.failures}
    owners = [owner for owner in record.owners if owner in failed]
    # a forward that ran without a single candidate operation has nothing left in float
    empty = [name for name in failed if name in record.called and name not in owners]
    report.failures = [f for f in report.failures if f.name not in empty]
    if not owners:
        return
    results = insert_runtime_quantizers(
        model, record, owners, enabled=lambda kind: switches.get(kind, True), descriptor=inserter.descriptor,
        chosen=lambda name: inserter.descriptor_for(name) if inserter.descriptor_for is not None else None,
        ignored=inserter.ignored, residual_adds_in_transformer_blocks=residual)
    report.runtime_ops.extend(results)
    for item in results:
        operation = f"{item.op.describe()}, found at run time"
        if item.name is not None:
            inputs = len(item.op.operands) + (1 if item.op.kind == "attention" else 0)
            report.inserted.append(InsertedQuantizer(item.name, item.op.kind, item.owner, operation, inputs))
        else:
            report.skipped.append(SkippedOp(item.owner, operation, item.reason or "", item.op.kind))
    # their operations were found and judged: they are no longer "not traced, left in float"
    for owner in owners:
        module = model.get_submodule(owner) if owner else model
        kept = tuple(n for n in module_notes(module) if not n.startswith(_NOT_QUANTIZED_NOTE))
        setattr(module, NOTES_ATTR, kept)
        add_note(module, f"functional operations found at run time and quantized there (torch.fx: "
                         f"{failed[owner].reason})")
    report.failures = [f for f in report.failures if f.name not in owners]
    report.runtime.extend(owners)


def insert_functional_quantizers(model: nn.Module, *, quant_desc_input: QuantDescriptor | None = None,
                                 ignore_policy: IgnorePolicy = None, add: bool = True, concat: bool = True,
                                 descriptor_for: Callable[[str], QuantDescriptor | None] | None = None,
                                 matmul: bool = True, attention: bool = True,
                                 residual_adds_in_transformer_blocks: bool = False,
                                 example_inputs: Any = None,
                                 ) -> tuple[nn.Module, FunctionalQuantReport]:
    """Insert quantizers for the functional operations of ``model`` that carry activations.

    Adds and concatenations get QuantAdd / QuantConcat; products of two activations (``torch.matmul``,
    ``@``, ``torch.bmm``, ``torch.baddbmm``) a QuantMatMul; ``F.scaled_dot_product_attention`` a
    QuantSDPA; Hugging Face attention modules (not traceable) a QuantHFAttention child through the
    attention-function registry (see :mod:`workbench.graph.hf_attention`).

    Works like :func:`workbench.quant.replace_to_quantization_module`: submodules are replaced in
    place and share their parameters with the originals. Use the returned module: it is ``model``
    itself unless the model's own forward had operations to quantize, in which case it is a
    ``GraphModule`` (named after the model's class) holding the same submodules.

    Args:
        model: the model, float or already quantized.
        quant_desc_input: descriptor of the new quantizers (per tensor); default 8-bit, max calibration.
        ignore_policy: names of new modules (e.g. ``"layer1.0.add"``) to leave in floating point, as in
            :func:`workbench.quant.ignore_matcher`.
        add, concat, matmul, attention: which operations to quantize (attention: SDPA and Hugging Face
            attention functions).
        descriptor_for: ``qualified_name -> descriptor or None``: per-operation descriptors (None falls
            back to ``quant_desc_input``).
        residual_adds_in_transformer_blocks: also quantize adds in modules holding a LayerNorm/RMSNorm
            or an attention (off by default: TensorRT keeps them in its fused kernels).
        example_inputs: a sample input (a tensor, a tuple of positional inputs or a dict of keyword
            inputs; one small batch). When given, the model runs once on it, every traced module is run
            against its original on its real arguments and kept only if the outputs are equal, and
            integer/boolean tensors are recognised by their dtype.

    Returns:
        ``(model, report)``; see :class:`FunctionalQuantReport`.

    Raises:
        ValueError: the model fails on ``example_inputs``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}.")
    report = FunctionalQuantReport()
    ignored = ignore_matcher(ignore_policy)
    calls = None
    if example_inputs is not None:
        try:
            calls = capture_calls(model, example_inputs)
        except Exception as error:
            raise ValueError(f"The model fails on the sample input used to check traced modules: "
                             f"{type(error).__name__}: {error}") from error
    inserter = _Inserter(quant_desc_input, ignored, add, concat, report, descriptor_for, matmul=matmul,
                         attention=attention, residual_adds_in_transformer_blocks=residual_adds_in_transformer_blocks,
                         calls=calls)
    if attention:
        for result in quantize_hf_attention(model, quant_desc_input=quant_desc_input, ignored=ignored,
                                            descriptor_for=descriptor_for):
            module = model.get_submodule(result.owner) if result.owner else model
            what = f"{result.implementation} attention function"
            if result.name is not None:
                inserter.function_level.add(id(module))
                report.attention_modules.append(result.owner)
                report.inserted.append(InsertedQuantizer(result.name, "attention", result.owner, what, 4))
            else:
                report.unquantized_attention.append(SkippedOp(result.owner, what, result.reason or ""))
                add_note(module, f"attention not quantized: {result.reason}")
    record = None
    if example_inputs is not None:
        try:  # after the attention functions are swapped: their products are the QuantHFAttention's own
            record = record_functional_ops(model, example_inputs)
        except Exception as error:
            raise ValueError(f"The model fails on the sample input used to find its functional operations: "
                             f"{type(error).__name__}: {error}") from error
        report.record = record
    result = inserter.convert(model, "")
    if record is not None:
        _insert_at_run_time(result, record, report, inserter, residual_adds_in_transformer_blocks,
                            {"add": add, "concat": concat, "matmul": matmul, "attention": attention})
    # one idea per line, each the same on every rebuild (the app shows a warning once); what is left in float
    # by design (residual adds in transformer blocks) is no warning: the full summary is at debug level
    if report.failures:
        logger.warning("Functional quantization: %s", report.failures_text())
    if report.unquantized_attention:
        logger.warning("Functional quantization: %s", report.attention_text())
    logger.debug("Functional quantization: %s", report.summary())
    for failure in report.failures:
        logger.debug("tracing %s failed: %s", failure.name or "<model>", failure.reason)
    return result, report
