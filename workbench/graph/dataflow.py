"""What flows where in one module's forward: in-place aliasing, activations, transformer blocks.

* :func:`inplace_alias_risk` reads the forward's source: fx records ``x += y`` as ``x = x + y``, which
  only changes a result when the tensor ``x`` names is still visible elsewhere (a forward argument,
  or another name bound to it). Names are followed statement by statement, so ``shortcut = x;
  x = self.conv1(x); ...; x += shortcut`` (timm's and torchvision's BasicBlock) is safe: ``x`` was
  rebound before the in-place add.
* :func:`activation_nodes` marks the graph nodes that carry floating activations: those computed
  from a floating forward input, and the floating outputs of layers (an Embedding's lookup too). Integer and
  boolean tensors, masks, position ids and what is
  computed from them alone (rotary angles, ``arange`` grids, parameters) are not activations: an
  operation on them never gets a quantizer (TensorRT runs no INT8 kernel on them).
* :func:`pointwise_formula` says whether an add is a step of an elementwise formula (GELU's tanh
  approximation ``x + 0.044715 * x**3``): both operands come from one tensor through elementwise
  functions only, with no layer or product between. TensorRT fuses such a formula into one pointwise
  kernel, so a Q/DQ there only breaks the fusion and adds error.
* :func:`in_transformer_block` says whether a module is (or holds) a transformer block: its subtree
  has a LayerNorm/RMSNorm or an attention. Residual adds there stay float by default.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap

import torch
import torch.fx as fx
from torch import nn

from workbench.graph.trace import scalar_nodes
from workbench.quant.nn.modules.quant_attention import QuantMatMul, QuantSDPA

__all__ = ["inplace_alias_risk", "activation_nodes", "in_transformer_block", "NON_ACTIVATION_INPUT",
           "pointwise_formula", "POINTWISE_FUNCTIONS", "LIKE_OTHER", "FACTORIES", "value_inputs"]

_AUGMENTED = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
              ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}

# forward arguments that carry masks, positions or indices rather than activations (by name, for when
# no sample input says their dtype)
NON_ACTIVATION_INPUT = re.compile(r"(mask|position|(^|_)ids?$|_ids?_|(^|_)(cos|sin|freqs?|rope|rotary)(_|$)|"
                                  r"cache_position|past_key)", re.IGNORECASE)


class _Bindings:
    """name -> the set of tensors (binding ids) it may refer to, followed through the statements."""

    def __init__(self, params: list[str]) -> None:
        self.names: dict[str, frozenset[str]] = {p: frozenset({f"arg:{p}"}) for p in params}
        self.fresh = 0

    def copy(self) -> _Bindings:
        other = _Bindings([])
        other.names, other.fresh = dict(self.names), self.fresh
        return other

    def new(self) -> frozenset[str]:
        self.fresh += 1
        return frozenset({f"value:{self.fresh}"})

    def merge(self, *others: _Bindings) -> None:
        for other in others:
            self.fresh = max(self.fresh, other.fresh)
            for name, ids in other.names.items():
                self.names[name] = self.names.get(name, frozenset()) | ids


def _targets(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for element in target.elts for n in _targets(element)]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    return []


def _walk(statements: list[ast.stmt], state: _Bindings, found: list[tuple[ast.AugAssign, str]]) -> None:
    for statement in statements:
        if isinstance(statement, ast.Assign):
            value = state.names.get(statement.value.id) if isinstance(statement.value, ast.Name) else None
            for target in statement.targets:
                for name in _targets(target):
                    state.names[name] = value if value is not None and isinstance(target, ast.Name) else state.new()
        elif isinstance(statement, (ast.AnnAssign,)) and isinstance(statement.target, ast.Name):
            value = state.names.get(statement.value.id) if isinstance(statement.value, ast.Name) else None
            state.names[statement.target.id] = value if value is not None else state.new()
        elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
            name = statement.target.id
            ids = state.names.get(name, frozenset())
            if any(i.startswith("arg:") for i in ids):
                found.append((statement, "a forward argument"))
            elif any(ids & other for key, other in state.names.items() if key != name):
                found.append((statement, "a tensor another name refers to"))
        elif isinstance(statement, ast.If):
            body, orelse = state.copy(), state.copy()
            _walk(statement.body, body, found)
            _walk(statement.orelse, orelse, found)
            state.names = {}
            state.merge(body, orelse)
        elif isinstance(statement, (ast.For, ast.While)):
            for name in _targets(getattr(statement, "target", ast.Pass())):
                state.names[name] = state.new()
            loop = state.copy()
            _walk(statement.body, loop, found)
            _walk(statement.body, loop, found)  # a second pass sees what the first iteration rebound
            _walk(statement.orelse, loop, found)
            state.merge(loop)
        elif isinstance(statement, (ast.With, ast.Try)):
            _walk(statement.body, state, found)
            for handler in getattr(statement, "handlers", []):
                _walk(handler.body, state, found)
            _walk(getattr(statement, "orelse", []), state, found)
            _walk(getattr(statement, "finalbody", []), state, found)


def inplace_alias_risk(module: nn.Module) -> str | None:
    """Why tracing this forward would change its result through an in-place ``x op= y``, or None."""
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
    params = [a.arg for a in arguments.posonlyargs + arguments.args[1:] + arguments.kwonlyargs]
    found: list[tuple[ast.AugAssign, str]] = []
    _walk(function.body, _Bindings(params), found)
    if not found:
        return None
    node, where = found[0]
    op = _AUGMENTED.get(type(node.op), "?")
    return (f"`{node.target.id} {op}= ...` (line {node.lineno} of forward) changes {where} in place, which fx "
            "would record as a copy")


# functions whose other tensor arguments give the result only a dtype, shape or device, the first one its values
# (ultralytics' anchors: ``torch.arange(w).type_as(feats[0])`` is a grid, not an activation)
LIKE_OTHER = frozenset({"type_as", "view_as", "reshape_as", "expand_as", "to"})
# functions whose tensor arguments give the result no values at all (a constant of their shape or dtype: Detect's
# ``feats[0].new_full((h * w, 1), stride)``); not the empty ones, which a kernel torch does not see can fill (the
# fake-quant C extension writes its output into ``empty_like(x)``)
FACTORIES = frozenset({"new_full", "new_zeros", "new_ones", "new_tensor", "zeros_like", "ones_like", "full_like",
                       "rand_like", "randn_like", "randint_like"})


def value_inputs(name: str, inputs: list) -> list:
    """Those of a function's tensor ``inputs`` (in call order) whose values reach its result, by its ``name``."""
    if name in FACTORIES:
        return []
    return inputs[:1] if name in LIKE_OTHER else inputs


def _function_name(node: fx.Node) -> str:
    target = node.target
    return (target if isinstance(target, str) else getattr(target, "__name__", "")).strip("_")


def activation_nodes(graph: fx.Graph, dtypes: dict[fx.Node, torch.dtype | None] | None = None) -> set[fx.Node]:
    """The nodes of ``graph`` that carry floating activations (see the module docstring).

    ``dtypes`` (from a run on a sample input) decides for tensors whose dtype is known; without it,
    forward arguments named like masks, ids or positions are not activations.
    """
    dtypes = dtypes or {}
    scalars = scalar_nodes(graph)
    active: set[fx.Node] = set()
    for node in graph.nodes:
        dtype = dtypes.get(node)
        if node in scalars or node.op in ("get_attr", "output"):
            continue
        if dtypes and node in dtypes and (dtype is None or not dtype.is_floating_point):
            continue  # an integer, boolean or non-tensor value
        if node.op == "placeholder":
            if not NON_ACTIVATION_INPUT.search(str(node.target).lstrip("*")):
                active.add(node)
            continue
        # a layer's floating output is a feature (an Embedding's too); elsewhere activations flow from inputs
        if node.op == "call_module":
            active.add(node)
            continue
        if node.op in ("call_function", "call_method"):
            first = [a for a in node.args if isinstance(a, fx.Node)]
            sources = value_inputs(_function_name(node), first + [i for i in node.all_input_nodes if i not in first])
        else:
            sources = node.all_input_nodes
        if any(i in active for i in sources):
            active.add(node)
    return active


_NORM_NAMES = ("LayerNorm", "RMSNorm", "GroupNorm1")


def _is_attention(module: nn.Module) -> bool:
    from workbench.graph.hf_attention import is_hf_attention_module

    return isinstance(module, (nn.MultiheadAttention, QuantSDPA, QuantMatMul)) or is_hf_attention_module(module)


def in_transformer_block(module: nn.Module) -> bool:
    """Whether ``module``'s subtree holds a LayerNorm-like layer or an attention (a transformer block)."""
    for sub in module.modules():
        if isinstance(sub, nn.LayerNorm) or type(sub).__name__.endswith(_NORM_NAMES) or _is_attention(sub):
            return True
    return False


# elementwise math an activation or a norm is written with (functions, methods and operators by name): a formula
# is followed through these only; slicing, concatenation, layers and products end it
_POINTWISE = frozenset({"add", "sub", "mul", "truediv", "div", "pow", "neg", "tanh", "sigmoid", "exp", "log",
                        "sqrt", "rsqrt", "erf", "abs", "clamp", "clip", "relu", "relu6", "hardtanh", "reciprocal",
                        "square", "minimum", "maximum", "where", "float", "to", "type_as", "contiguous",
                        "iadd", "imul", "isub", "itruediv", "softplus", "gelu", "silu", "hardsigmoid", "hardswish"})
POINTWISE_FUNCTIONS = _POINTWISE  # the run-time recorder follows formulas through the same functions


def _elementwise_sources(node: fx.Node, limit: int = 64) -> set[fx.Node]:
    """The nodes ``node`` is computed from through elementwise functions/methods only (the first node
    on each path that is not one: a placeholder, a layer's output, a product, a parameter)."""
    sources: set[fx.Node] = set()
    stack, seen = [node], set()
    while stack and len(seen) < limit:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        name = getattr(current.target, "__name__", str(current.target)).strip("_")
        if current.op in ("call_function", "call_method") and name in _POINTWISE:
            operands = [a for a in current.all_input_nodes if a.op != "get_attr"]
            if operands:
                stack.extend(operands)
                continue
        sources.add(current)
    return sources


def pointwise_formula(a: fx.Node, b: fx.Node) -> bool:
    """Whether ``a + b`` is a step inside an elementwise formula: one operand is computed from the other's
    source through elementwise operations alone (``x + 0.044715 * x**3``), and at least one operand is
    such a computation (``x + x`` is not a formula step but a doubling)."""
    if a is b:
        return False
    computed = [n for n in (a, b) if n.op in ("call_function", "call_method")
                and getattr(n.target, "__name__", str(n.target)).strip("_") in _POINTWISE]
    if not computed:
        return False
    return bool(_elementwise_sources(a) & _elementwise_sources(b))
