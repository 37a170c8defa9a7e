"""Start a forward pass part-way through the model, from cached activations.

In a sensitivity analysis every pass runs the model in a baseline configuration (all quantizers off
for ``one-on``, all on for ``one-off``) except for one unit; everything computed before that unit's
first quantizer is the same in every pass. A :class:`PrefixPlan` splits the model into a torch.fx
graph of calls, so a pass can start right before the node that first involves the unit, from the
values that cross that point (the *frontier*), instead of from the inputs.

How the graph is made, and when there is none:

* ``"fx"``: a symbolic trace in which every module holding quantizers, every TensorQuantizer, every
  module with hooks and torch's own layers are opaque calls; everything else (residual blocks,
  ``torch.cat``, ``x + y``, ``flatten``) is traced into individual operations, so cut points fall
  inside blocks too.
* ``"fx-coarse"``: when that trace fails (data-dependent control flow somewhere inside), only the
  model's own forward and ``nn.Sequential`` containers are traced; children are opaque. This covers
  sequential-style models whose blocks cannot be traced.
* neither works (the model's own forward cannot be traced): no plan; the caller runs the plain loop.

Tracing runs Python code of the user's modules with proxies; attributes it sets on modules are removed
again. Running a plan never changes the model: the frontier handed to a pass is a copy (aliasing
between its tensors is kept), so in-place operations such as ``ReLU(inplace=True)`` cannot spoil the
cache. The caller still checks that the plan reproduces the model's outputs before trusting it.

Assumption: a quantizer's flags are read only by the module holding it (true of every quantized module
of ``workbench.quant`` and of QuantAdd/QuantConcat). Those modules are opaque calls, so the graph
cannot have a flag baked in; a traced-through ``forward`` that branched on some quantizer's flags
would be specialised to the flags at trace time.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx.node import map_arg

from workbench.graph.fx_guard import GuardedTracer
from workbench.quant.algorithms.snapshot import holds_quantizers
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["PrefixPlan", "PassState", "build_plan"]


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks
                or getattr(module, "_forward_hooks_with_kwargs", None)
                or getattr(module, "_forward_pre_hooks_with_kwargs", None))


class _LayerTracer(GuardedTracer):
    """Opaque: quantized layers (their forward reads the quantizers' flags), quantizers, hooked modules."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (isinstance(m, TensorQuantizer) or holds_quantizers(m) or _has_hooks(m)
                or super().is_leaf_module(m, module_qualified_name))


class _CoarseTracer(GuardedTracer):
    """Opaque: every child except plain nn.Sequential containers."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return type(m) is not nn.Sequential or _has_hooks(m)


class _KeepAttributes:
    """Undo attributes that tracing sets on the user's modules (``self.x = proxy``, tensor constants)."""

    def __init__(self, model: nn.Module) -> None:
        self._saved = []
        for module in model.modules():
            self._saved.append((module, dict(module.__dict__), dict(module._parameters), dict(module._buffers),
                                dict(module._modules)))

    def __enter__(self) -> _KeepAttributes:
        return self

    def __exit__(self, *exc) -> None:
        for module, attributes, parameters, buffers, modules in self._saved:
            for key in [k for k in module.__dict__ if k not in attributes]:
                del module.__dict__[key]
            for key, value in attributes.items():
                if module.__dict__.get(key, object()) is not value:
                    module.__dict__[key] = value
            for current, saved in ((module._parameters, parameters), (module._buffers, buffers),
                                   (module._modules, modules)):
                if current.keys() != saved.keys() or any(current[k] is not v for k, v in saved.items()):
                    current.clear()
                    current.update(saved)


def _fetch(root: nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _subtree_quantizer_ids(module: nn.Module) -> frozenset[int]:
    ids: set[int] = set()
    stack, seen = [module], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, TensorQuantizer):
            ids.add(id(current))
        stack.extend(child for child in current._modules.values() if child is not None)
    return frozenset(ids)


def _copy_value(value: Any, storages: dict) -> Any:
    """A copy of a frontier value; tensors sharing storage still share it in the copy."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested or value.is_quantized:
            return value.clone()
        storage = value.untyped_storage()
        if storage.nbytes() == 0:
            return value.clone()
        key = (storage.device, storage.data_ptr())
        copied = storages.get(key)
        if copied is None:
            copied = storages[key] = storage.clone()
        out = torch.empty(0, dtype=value.dtype, device=value.device)
        return out.set_(copied, value.storage_offset(), value.size(), value.stride())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_copy_value(v, storages) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_copy_value(v, storages) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _copy_value(v, storages)) for k, v in value.items())
    return value


class PassState:
    """The live values of one batch at a cut point of a plan."""

    __slots__ = ("cut", "env")

    def __init__(self, cut: int, env: dict[fx.Node, Any]) -> None:
        self.cut = cut
        self.env = env


class PrefixPlan:
    """A model as a list of fx nodes that a pass can start at any position of.

    Attributes:
        strategy: ``"fx"`` or ``"fx-coarse"`` (see the module docstring).
    """

    def __init__(self, model: nn.Module, graph: fx.Graph, constants: dict[fx.Node, Any], strategy: str) -> None:
        self.model = model
        self.strategy = strategy
        self.nodes = list(graph.nodes)
        self._index = {node: i for i, node in enumerate(self.nodes)}
        self._constants = constants
        self._placeholders = [n for n in self.nodes if n.op == "placeholder"]
        if any(str(n.target).startswith("*") for n in self._placeholders):
            raise ValueError("forward(*args/**kwargs) cannot be bound to a traced graph")
        self._output = self.nodes[-1]
        if self._output.op != "output":
            raise ValueError("the traced graph does not end with its output")
        self.first_cut = len(self._placeholders)
        # last position at which each value is read: values read after a cut form its frontier
        self._last_use = {node: max((self._index[u] for u in node.users), default=-1) for node in self.nodes}
        self._free_after: list[list[fx.Node]] = [[] for _ in self.nodes]
        for node, last in self._last_use.items():
            if last >= 0 and node.op != "get_attr":
                self._free_after[last].append(node)
        self._modules = {n.target: model.get_submodule(str(n.target)) for n in self.nodes if n.op == "call_module"}
        self._quantizers_at = {i: _subtree_quantizer_ids(self._modules[n.target])
                               for i, n in enumerate(self.nodes) if n.op == "call_module"}

    @property
    def output_index(self) -> int:
        return len(self.nodes) - 1

    def cut_before(self, quantizers: Iterable[TensorQuantizer]) -> int:
        """The position of the first node whose computation involves any of ``quantizers``.

        Everything before it is unaffected by them; a quantizer no node calls (an unused layer) gives
        the output's position.
        """
        wanted = {id(q) for q in quantizers}
        for i in sorted(self._quantizers_at):
            if self._quantizers_at[i] & wanted:
                return i
        return self.output_index

    def start(self, args: tuple, kwargs: dict) -> PassState:
        """The state before the first operation: the inputs bound to the graph's placeholders."""
        env: dict[fx.Node, Any] = {}
        for i, node in enumerate(self._placeholders):
            name = str(node.target)
            if i < len(args):
                env[node] = args[i]
            elif name in kwargs:
                env[node] = kwargs[name]
            elif node.args:
                env[node] = node.args[0]  # the parameter's default value
            else:
                raise TypeError(f"forward() missing argument {name!r}")
        unknown = set(kwargs) - {str(n.target) for n in self._placeholders}
        if unknown or len(args) > len(self._placeholders):
            raise TypeError(f"forward() got unexpected arguments: {sorted(unknown) or len(args)}")
        return PassState(self.first_cut, env)

    def _value(self, env: dict[fx.Node, Any], node: fx.Node) -> Any:
        return env[node] if node in env else self._constants[node]

    def _execute(self, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
        args = map_arg(node.args, lambda n: self._value(env, n))
        kwargs = map_arg(node.kwargs, lambda n: self._value(env, n))
        if node.op == "call_module":
            return self._modules[node.target](*args, **kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            obj, *rest = args
            return getattr(obj, node.target)(*rest, **kwargs)
        raise RuntimeError(f"unexpected node {node.op} in the traced graph")

    def _run(self, env: dict[fx.Node, Any], begin: int, end: int) -> None:
        for i in range(begin, end):
            node = self.nodes[i]
            if node.op in ("placeholder", "get_attr"):
                continue
            env[node] = self._execute(node, env)
            for done in self._free_after[i]:  # keep memory at what a normal forward holds
                env.pop(done, None)

    def advance(self, state: PassState, cut: int) -> None:
        """Run the nodes from ``state.cut`` up to ``cut`` (in the model's current configuration) in place."""
        if cut < state.cut:
            raise ValueError(f"cannot go back from position {state.cut} to {cut}")
        self._run(state.env, state.cut, cut)
        state.env = {n: v for n, v in state.env.items() if self._last_use[n] >= cut}
        state.cut = cut

    def finish(self, state: PassState) -> Any:
        """The model's output, computed from ``state`` onwards on a copy (``state`` is left as it was)."""
        storages: dict = {}
        env = {node: _copy_value(value, storages) for node, value in state.env.items()}
        self._run(env, state.cut, self.output_index)
        return map_arg(self._output.args[0], lambda n: self._value(env, n))

    def run(self, args: tuple, kwargs: dict) -> Any:
        """A whole forward pass through the plan."""
        return self.finish(self.start(args, kwargs))


def build_plan(model: nn.Module) -> tuple[PrefixPlan | None, str]:
    """A plan for ``model``, or None with the reason none could be made.

    The model should be in eval mode: branches on ``self.training`` are fixed at trace time.
    """
    failures = []
    for strategy, tracer in (("fx", _LayerTracer()), ("fx-coarse", _CoarseTracer())):
        try:
            with _KeepAttributes(model):
                graph = tracer.trace(model)
                # tensor constants are stowed on the model by the tracer: take them before they are removed
                constants = {n: _fetch(model, str(n.target)) for n in graph.nodes if n.op == "get_attr"}
            return PrefixPlan(model, graph, constants, strategy), f"activations reused ({strategy} graph)"
        except Exception as error:  # tracing arbitrary user code: any failure means "no plan this way"
            failures.append(f"{strategy}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    return None, "plain loop: the model could not be traced (" + "; ".join(failures) + ")"
