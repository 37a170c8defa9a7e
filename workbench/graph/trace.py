"""torch.fx tracing with quantized modules as leaves, and a fallback for modules that cannot be traced.

Symbolic tracing runs ``forward`` on proxies, so Python control flow on tensor values (``if
x.sum() > 0``) cannot be traced. :func:`trace_pieces` then records which module failed and why,
and traces each of its children instead: the result is a list of traced *pieces* (qualified name,
module, graph) that together cover every part of the model that could be traced, plus the
failures. Nothing here modifies the model.
"""
from __future__ import annotations

import contextlib
import inspect
import operator
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from workbench.graph.batchnorm import is_frozen_batchnorm
from workbench.graph.fx_guard import GuardedTracer
from workbench.graph.tree import is_quantized_module
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["QuantTracer", "TracedPiece", "TraceFailure", "explain_trace_error", "flag_constants", "trace_module",
           "trace_pieces", "trace_with_call",
           "is_leaf", "scalar_nodes", "ADD_FUNCTIONS", "ADD_METHODS", "CAT_FUNCTIONS", "MAXPOOL_FUNCTIONS"]

ADD_FUNCTIONS = {operator.add: False, torch.add: False, operator.iadd: True}  # target -> in place
ADD_METHODS = {"add": False, "add_": True}
CAT_FUNCTIONS = (torch.cat, torch.concat, torch.concatenate)
MAXPOOL_FUNCTIONS = (F.max_pool1d, F.max_pool2d, F.max_pool3d, torch.max_pool1d, torch.max_pool2d, torch.max_pool3d)
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def is_leaf(module: nn.Module) -> bool:
    """Whether tracing treats ``module`` as one opaque call.

    Quantizers and quantized modules always are (their flags must stay switchable after tracing),
    and so are torch.nn's own layers (fx's default), except the containers.
    """
    if isinstance(module, TensorQuantizer) or is_quantized_module(module) or is_frozen_batchnorm(module):
        return True  # a frozen BatchNorm (torchvision's, DETR's) is one affine, as BatchNorm2d is
    if isinstance(module, _CONTAINERS) or isinstance(module, fx.GraphModule):
        return False
    module_name = type(module).__module__
    return module_name.startswith("torch.nn") or module_name.startswith("torch.ao.nn")


class QuantTracer(GuardedTracer):
    """An fx tracer whose leaves are :func:`is_leaf` modules."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m)


@dataclass
class TracedPiece:
    """A module that traced: its qualified name in the model, the module itself, and the graph module."""

    name: str
    module: nn.Module
    graph_module: fx.GraphModule

    def qualified(self, target: str) -> str:
        """The model-level name of a submodule ``target`` of this piece."""
        if not self.name:
            return target
        return f"{self.name}.{target}" if target else self.name


@dataclass(frozen=True)
class TraceFailure:
    """A module whose forward could not be traced; its children were traced instead."""

    name: str
    type_name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name or '<model>'} ({self.type_name}): {self.reason}"


# what torch.fx's errors mean, in the words of the model's code: (pattern in the error, explanation)
_TRACE_ERRORS = (
    ("co_varnames is too small", "its forward takes *args/**kwargs or keyword-only arguments (as Hugging Face "
                                 "blocks do), which torch.fx cannot call symbolically"),
    ("does not support item assignment", "its forward writes into a tensor or a container by index "
                                         "(x[...] = ..., outputs[i] = ...), which torch.fx cannot record"),
    ("cannot be used as inputs to control flow", "its forward branches on a tensor (an if, a loop or an assert "
                                                 "on a value or a shape), which torch.fx cannot record"),
    ("cannot be iterated", "its forward loops over a tensor or unpacks one (for t in x, a, b = x), which "
                           "torch.fx cannot record without knowing its length"),
    ('missing the required "forward"', "it is a container without a forward of its own (a ModuleList or "
                                       "ModuleDict): its items are traced where they are called"),
    ("object is not iterable", "its forward unpacks or loops over a value torch.fx only knows symbolically"),
    ("len(", "its forward takes len() of a tensor, which torch.fx cannot know while tracing"),
)
_TRACE_CONSEQUENCE = ("its quantizable layers are still quantized; only the operations written in this forward "
                      "(adds, concatenations, products) stay in floating point, and placement rules do not see "
                      "across it")


def explain_trace_error(error: BaseException) -> str:
    """Why torch.fx could not trace a forward, in words a user can act on (the raw error after it)."""
    text = str(error).strip().splitlines()
    first = text[0][:200] if text else type(error).__name__
    for pattern, meaning in _TRACE_ERRORS:
        if pattern in str(error):
            return f"not traced: {meaning}; {_TRACE_CONSEQUENCE} (torch.fx {type(error).__name__}: {first})"
    return f"not traced: torch.fx stopped at '{first}' ({type(error).__name__}); {_TRACE_CONSEQUENCE}"


def _reason(error: BaseException) -> str:
    return explain_trace_error(error)


@contextlib.contextmanager
def attributes_kept(module: nn.Module) -> Iterator[None]:
    """Undo what tracing writes onto ``module`` and its submodules: a forward that stores a value on ``self``
    (transformers' Switch router: ``self.input_dtype = hidden_states.dtype``) stores an fx Proxy while traced, and
    the model then cannot be copied ("'node' not in new_dict during proxy unpickling")."""
    saved = [(m, dict(m.__dict__)) for m in module.modules()]
    try:
        yield
    finally:  # only proxies are undone: the tracer's own additions (``_tensor_constant0`` on the root) are kept
        for m, attributes in saved:
            for key in [k for k, v in m.__dict__.items() if isinstance(v, fx.Proxy)]:
                if key in attributes:
                    m.__dict__[key] = attributes[key]
                else:
                    del m.__dict__[key]


def trace_module(module: nn.Module) -> fx.GraphModule:
    """Trace ``module`` with :class:`QuantTracer` into a GraphModule that shares its submodules.

    Raises:
        Exception: whatever symbolic tracing raises (``TraceError``, ``TypeError`` on ``bool(proxy)``...).
    """
    with attributes_kept(module):
        return _trace_module(module)


def _trace_module(module: nn.Module) -> fx.GraphModule:
    tracer = QuantTracer()
    try:
        graph = tracer.trace(module)
    except Exception:
        flags = flag_constants(module)
        if not flags:
            raise
        # YOLOv5's forward(x, augment=False, profile=False, visualize=False): trace the path the default
        # flags take, with them bound as constants (the first error is the one to report if this fails too)
        tracer = QuantTracer()
        try:
            graph = tracer.trace(module, concrete_args=flags)
        except Exception:
            graph = None
        if graph is None:
            raise
    name = type(module).__name__ if not isinstance(module, fx.GraphModule) else module.__class__.__name__
    return fx.GraphModule(tracer.root, graph, name)


def flag_constants(module: nn.Module) -> dict[str, bool]:
    """The forward's flag parameters (a bool default: ``augment=False``) with their defaults, to bind as
    constants when the forward cannot be traced with them symbolic (``if augment:``)."""
    try:
        parameters = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return {}
    return {name: p.default for name, p in parameters.items()
            if isinstance(p.default, bool) and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def trace_pieces(model: nn.Module) -> tuple[list[TracedPiece], list[TraceFailure]]:
    """Trace ``model``; where a module cannot be traced, record why and trace its children instead.

    Returns:
        ``(pieces, failures)``: pieces in model order, and the modules that failed (their own
        forward's functional operations are not visible; their children's are).
    """
    pieces: list[TracedPiece] = []
    failures: list[TraceFailure] = []

    def visit(module: nn.Module, name: str) -> None:
        if is_leaf(module):
            return
        try:
            gm = trace_module(module)
        except Exception as error:  # tracing runs the user's forward: anything can be raised
            failures.append(TraceFailure(name, type(module).__name__, _reason(error)))
            for child_name, child in module._modules.items():
                if child is not None:
                    visit(child, f"{name}.{child_name}" if name else child_name)
            return
        pieces.append(TracedPiece(name, module, gm))

    visit(model, "")
    return pieces, failures


_SCALAR_METHODS = {"size", "dim", "numel", "item", "tolist", "nelement", "ndimension", "element_size",
                   "get_device", "is_contiguous", "stride"}
_SCALAR_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad", "T_dims"}


def scalar_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes that carry Python numbers, shapes or dtypes rather than tensors (best effort).

    ``x.size(0) + 1`` is an ``operator.add`` node too, but not one that moves activations: these
    nodes are what the size/shape queries produce, and arithmetic on them.
    """
    scalars: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "call_method" and node.target in _SCALAR_METHODS:
            scalars.add(node)
        elif node.op == "call_function" and node.target is getattr and len(node.args) > 1 \
                and node.args[1] in _SCALAR_ATTRS:
            scalars.add(node)
        elif node.op == "call_function" and node.target is len:
            scalars.add(node)
        elif node.op == "call_function" and getattr(node.target, "__module__", None) in ("_operator", "operator"):
            inputs = [a for a in node.all_input_nodes]
            if inputs and all(a in scalars for a in inputs):
                scalars.add(node)
    return scalars


def trace_with_call(tracer: fx.Tracer, module: nn.Module, args: tuple, kwargs: dict) -> fx.Graph:
    """Trace ``module``'s forward as it was called with ``args``/``kwargs``: one explicit parameter per
    argument of that call, ``**kwargs`` expanded to the names the call gave.

    fx cannot trace a forward that takes ``**kwargs`` (Hugging Face blocks: ``co_varnames is too
    small``, ``Proxy object cannot be iterated``). Tracing a forward whose parameters are the call's own
    argument names sidesteps that; the traced module then accepts exactly those arguments (the caller
    checks it against the original on this call). The instance's class is swapped for a subclass with
    that forward while tracing, and put back whatever happens.
    """
    original = type(module)
    signature = inspect.signature(original.forward)
    bound = signature.bind(module, *args, **kwargs)
    names: list[str] = []
    forwarded: list[str] = []
    for name, parameter in signature.parameters.items():
        if name == "self" or name not in bound.arguments:
            continue
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError("a forward called with extra positional arguments cannot be traced by name")
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            for key in bound.arguments[name]:
                names.append(key)
                forwarded.append(f"{key}={key}")
        else:
            names.append(name)
            forwarded.append(f"{name}={name}")
    if not all(n.isidentifier() for n in names):
        raise TypeError("the call passes keyword arguments that are not identifiers")
    source = (f"def forward(self, {', '.join(names)}):\n"
              f"    return _forward(self, {', '.join(forwarded)})\n")
    namespace: dict = {"_forward": original.forward}
    exec(compile(source, f"<workbench trace of {original.__name__}.forward>", "exec"), namespace)  # noqa: S102
    bound_class = type(original.__name__, (original,), {"forward": namespace["forward"],
                                                        "__module__": original.__module__})
    module.__class__ = bound_class
    try:
        return tracer.trace(module)
    finally:
        module.__class__ = original
