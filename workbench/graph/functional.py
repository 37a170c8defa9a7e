"""Give functional adds and concatenations quantizers, without editing the user's model class.

For every module whose own ``forward`` adds two activations (``a + b``, ``torch.add``, ``a += b``,
``a.add_(b)``) or concatenates them (``torch.cat``), :func:`insert_functional_quantizers` traces that
forward with torch.fx (children stay opaque calls), replaces each such operation by a
:class:`~workbench.quant.nn.QuantAdd` / :class:`~workbench.quant.nn.QuantConcat` call, and puts the
resulting ``GraphModule`` where the module was. Names are derived from the owning module and stable
across runs: the first add of ``layer1.0`` is ``layer1.0.add``, the next ``layer1.0.add_1``, a concat
of ``model.4`` is ``model.4.cat``.

What stays the same: every submodule keeps its object, name and parameters (nothing is copied), and
the new module's state_dict holds every key the old one had (plus the new quantizers). Modules whose
forward has nothing to quantize are left as they are, so the model keeps its classes except where
quantizers were inserted. A module whose forward cannot be traced (Python control flow on tensor
values, say) is reported with the reason and left as it is; its children are still visited, and
module-level quantization (``replace_to_quantization_module``) is unaffected. The report lists every
operation quantized, every candidate skipped and why, and every module that could not be traced.
"""
from __future__ import annotations

import ast
import inspect
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.fx as fx
from torch import nn

from workbench.graph.trace import (
    ADD_FUNCTIONS,
    ADD_METHODS,
    CAT_FUNCTIONS,
    TraceFailure,
    is_leaf,
    scalar_nodes,
)
from workbench.graph.tree import is_quantized_module
from workbench.quant.nn.modules.quant_ops import QuantAdd, QuantConcat
from workbench.quant.replace import IgnorePolicy, ignore_matcher
from workbench.quant.tensor_quant import QuantDescriptor

logger = logging.getLogger(__name__)

__all__ = ["InsertedQuantizer", "SkippedOp", "FunctionalQuantReport", "insert_functional_quantizers"]


@dataclass(frozen=True)
class InsertedQuantizer:
    """A functional operation that now has quantizers."""

    name: str                 # qualified name of the new module, e.g. "layer1.0.add"
    kind: str                 # "add" or "concat"
    owner: str                # qualified name of the module whose forward holds the operation
    operation: str            # what was replaced, e.g. "operator.add(bn2, x)"
    num_inputs: int


@dataclass(frozen=True)
class SkippedOp:
    """A candidate operation left in floating point, and why."""

    owner: str
    operation: str
    reason: str


@dataclass
class FunctionalQuantReport:
    """What :func:`insert_functional_quantizers` did, module by module."""

    inserted: list[InsertedQuantizer] = field(default_factory=list)
    skipped: list[SkippedOp] = field(default_factory=list)
    failures: list[TraceFailure] = field(default_factory=list)
    traced: list[str] = field(default_factory=list)      # modules whose own forward was traced
    converted: list[str] = field(default_factory=list)   # modules replaced by a GraphModule
    opaque: list[str] = field(default_factory=list)      # torch.nn layers with children, not looked into

    @property
    def adds(self) -> list[InsertedQuantizer]:
        return [i for i in self.inserted if i.kind == "add"]

    @property
    def concats(self) -> list[InsertedQuantizer]:
        return [i for i in self.inserted if i.kind == "concat"]

    @property
    def inserted_names(self) -> list[str]:
        return [i.name for i in self.inserted]

    @property
    def complete(self) -> bool:
        """True when every module could be traced and no candidate was skipped."""
        return not self.failures and not self.skipped

    def summary(self) -> str:
        parts = [f"{len(self.adds)} adds and {len(self.concats)} concatenations quantized in "
                 f"{len(self.converted)} modules ({len(self.traced)} modules traced)"]
        if self.skipped:
            parts.append(f"{len(self.skipped)} left in floating point: "
                         + "; ".join(f"{s.owner or '<model>'}: {s.operation} ({s.reason})" for s in self.skipped[:5]))
        if self.failures:
            parts.append(f"{len(self.failures)} modules could not be traced, so functional operations in their own "
                         "forward are not quantized: " + "; ".join(str(f) for f in self.failures[:5]))
        if self.opaque:
            parts.append(f"{len(self.opaque)} torch.nn layers with sublayers kept whole (their internal adds are "
                         f"not quantized): {', '.join(self.opaque[:5])}")
        return "; ".join(parts)


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _describe(node: fx.Node) -> str:
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


class _Inserter:
    def __init__(self, quant_desc_input: QuantDescriptor | None, ignored: Callable[[str], str | None],
                 add: bool, concat: bool, report: FunctionalQuantReport,
                 descriptor_for: Callable[[str], QuantDescriptor | None] | None = None) -> None:
        self.quant_desc_input = quant_desc_input
        self.descriptor_for = descriptor_for
        self.ignored = ignored
        self.add = add
        self.concat = concat
        self.report = report
        self.memo: dict[int, nn.Module] = {}

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
        if type(module) in (nn.Sequential, nn.ModuleList, nn.ModuleDict):
            return module  # torch's containers add nothing of their own
        risk = _inplace_alias_risk(module)
        if risk is not None:
            self.report.failures.append(TraceFailure(path, type(module).__name__, risk))
            logger.info("Not tracing %s (%s): %s", path or "<model>", type(module).__name__, risk)
            return module
        try:
            tracer = _OwnForwardTracer()
            graph = tracer.trace(module)
        except Exception as error:  # the user's forward runs on proxies: anything can be raised
            text = str(error).strip().splitlines()
            reason = f"{type(error).__name__}: {text[0] if text else ''}"[:400]
            self.report.failures.append(TraceFailure(path, type(module).__name__, reason))
            logger.info("Could not trace %s (%s): %s", path or "<model>", type(module).__name__, reason)
            return module
        self.report.traced.append(path)
        gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
        if not self._insert(gm, module, path):
            return module
        _complete_state(gm, module)
        self.report.converted.append(path)
        return gm

    # ----- graph rewriting ------------------------------------------------------------------

    def _insert(self, gm: fx.GraphModule, original: nn.Module, path: str) -> bool:
        graph = gm.graph
        scalars = scalar_nodes(graph)
        order = {node: i for i, node in enumerate(graph.nodes)}
        taken: set[str] = set()
        changed = False

        def new_name(base: str) -> str:
            index = 0
            while True:
                candidate = base if index == 0 else f"{base}_{index}"
                if candidate not in taken and not hasattr(original, candidate) and not hasattr(gm, candidate):
                    taken.add(candidate)
                    return candidate
                index += 1

        def is_activation(arg) -> bool:
            return isinstance(arg, fx.Node) and arg not in scalars

        for node in list(graph.nodes):
            if self.add:
                operands = _add_operands(node)
                if operands is not None:
                    a, b, alpha, inplace, has_out = operands
                    if not (is_activation(a) and is_activation(b)):
                        continue  # x + 1, x.size(0) + 1: nothing to quantize
                    description = _describe(node)
                    reason = None
                    if a.op == "get_attr" or b.op == "get_attr":
                        reason = "one operand is a parameter or buffer of the model, not an activation"
                    elif has_out:
                        reason = "writes into an out= tensor"
                    elif alpha != 1:
                        reason = f"scales the second operand (alpha={alpha!r})"
                    elif inplace and any(order[user] > order[node] for user in a.users if user is not node):
                        reason = "in-place add whose first operand is read again afterwards"
                    if reason is None:
                        name = new_name("add")
                        qualified = _qualified(path, name)
                        ignored = self.ignored(qualified)
                        if ignored is not None:  # the name stays reserved: the next add keeps its name
                            reason = f"ignored by policy {ignored!r}"
                    if reason is not None:
                        self.report.skipped.append(SkippedOp(path, description, reason))
                        continue
                    gm.add_submodule(name, QuantAdd(self.descriptor(qualified)))
                    with graph.inserting_before(node):
                        replacement = graph.call_module(name, (a, b))
                    replacement.meta = dict(node.meta)
                    node.replace_all_uses_with(replacement)
                    graph.erase_node(node)
                    self.report.inserted.append(InsertedQuantizer(qualified, "add", path, description, 2))
                    changed = True
                    continue
            if self.concat and node.op == "call_function" and node.target in CAT_FUNCTIONS:
                tensors = node.args[0] if node.args else node.kwargs.get("tensors")
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", node.kwargs.get("axis", 0))
                description = _describe(node)
                reason = None
                if not isinstance(tensors, (list, tuple)) or not all(is_activation(t) for t in tensors):
                    reason = "its inputs are not a list of activations visible to the tracer"
                elif any(t.op == "get_attr" for t in tensors):
                    reason = "one input is a parameter or buffer of the model, not an activation"
                elif not isinstance(dim, int):
                    reason = "the concatenation dimension is computed at run time"
                elif "out" in node.kwargs:
                    reason = "writes into an out= tensor"
                if reason is None:
                    name = new_name("cat")
                    qualified = _qualified(path, name)
                    ignored = self.ignored(qualified)
                    if ignored is not None:
                        reason = f"ignored by policy {ignored!r}"
                if reason is not None:
                    self.report.skipped.append(SkippedOp(path, description, reason))
                    continue
                gm.add_submodule(name, QuantConcat(dim, self.descriptor(qualified)))
                with graph.inserting_before(node):
                    replacement = graph.call_module(name, (list(tensors),))
                replacement.meta = dict(node.meta)
                node.replace_all_uses_with(replacement)
                graph.erase_node(node)
                self.report.inserted.append(InsertedQuantizer(qualified, "concat", path, description, len(tensors)))
                changed = True
        if changed:
            graph.lint()
            gm.recompile()
        return changed


class _OwnForwardTracer(fx.Tracer):
    """Traces one module's own forward: every submodule call stays a call."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _add_operands(node: fx.Node):
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


_AUGMENTED = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
              ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}


def _inplace_alias_risk(module: nn.Module) -> str | None:
    """Why tracing this forward would change its result, or None.

    fx records ``x += y`` as ``x = x + y``: the tensor that ``x`` named is no longer changed in place.
    That only matters when something else still refers to that tensor: a forward argument (the caller
    may read it afterwards) or a name bound to it (``keep = x``). Such forwards are left as they are.
    """
    if isinstance(module, fx.GraphModule):
        return None
    try:
        source = textwrap.dedent(inspect.getsource(type(module).forward))
        function = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    arguments = function.args
    params = {a.arg for a in arguments.posonlyargs + arguments.args[1:] + arguments.kwonlyargs}
    aliases: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            aliases.add(node.value.id)
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(function):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and (
                node.target.id in params or node.target.id in aliases):
            op = _AUGMENTED.get(type(node.op), "?")
            line = function.lineno + node.lineno - 1 if hasattr(function, "lineno") else node.lineno
            where = "a forward argument" if node.target.id in params else "a tensor another name refers to"
            return (f"`{node.target.id} {op}= ...` (line {line} of forward) changes {where} in place, which fx "
                    "would record as a copy")
    return None


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
        gm._buffers[name] = buffer
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


def insert_functional_quantizers(model: nn.Module, *, quant_desc_input: QuantDescriptor | None = None,
                                 ignore_policy: IgnorePolicy = None, add: bool = True, concat: bool = True,
                                 descriptor_for: Callable[[str], QuantDescriptor | None] | None = None,
                                 ) -> tuple[nn.Module, FunctionalQuantReport]:
    """Insert QuantAdd / QuantConcat for the functional adds and concatenations of ``model``.

    Works like :func:`workbench.quant.replace_to_quantization_module`: submodules are replaced in
    place and share their parameters with the originals. Use the returned module: it is ``model``
    itself unless the model's own forward had operations to quantize, in which case it is a
    ``GraphModule`` (named after the model's class) holding the same submodules.

    Args:
        model: the model, float or already quantized.
        quant_desc_input: descriptor of the new quantizers (per tensor); default 8-bit, max calibration.
        ignore_policy: names of new modules (e.g. ``"layer1.0.add"``) to leave in floating point, as in
            :func:`workbench.quant.ignore_matcher`.
        add, concat: which operations to quantize.
        descriptor_for: ``qualified_name -> descriptor or None``: per-operation descriptors (None falls
            back to ``quant_desc_input``).

    Returns:
        ``(model, report)``; see :class:`FunctionalQuantReport`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}.")
    report = FunctionalQuantReport()
    inserter = _Inserter(quant_desc_input, ignore_matcher(ignore_policy), add, concat, report,
                         descriptor_for)
    result = inserter.convert(model, "")
    if report.failures:
        logger.warning("Functional quantization: %s", report.summary())
    return result, report
