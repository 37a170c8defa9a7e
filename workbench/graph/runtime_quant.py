"""Quantize functional operations at run time, where torch.fx could not rewrite the forward that holds them.

:func:`attach_runtime_quantizers` gives a module (the *owner*) one quantizer module per recorded
operation of its own forward, registered as its child under the name the fx route would give it
(``<owner>.matmul``, ``<owner>.matmul_1``, ``<owner>.add``, ``<owner>.cat``, ``<owner>.sdpa``), and a
plan ``(kind, call site, occurrence) -> child``. While the owner's forward runs, a ``TorchFunctionMode``
finds the owner's own candidate calls with the recorder's test (:func:`workbench.graph.runtime_ops.candidate`),
counts the calls from each site (:func:`workbench.graph.runtime_ops.call_site`: the instruction of model code,
so a branch taken in one call and not another shifts nothing) and hands the planned ones to their child
(QuantAdd, QuantConcat, QuantMatMul, QuantSDPA: the same modules the fx route inserts), so the computation, the
calibration and the exported Q/DQ are theirs.
With every quantizer off, each child computes exactly the call it replaces.

Which module is running: forward pre/post hooks on the owner switch the mode on, and while it is on,
process-wide module hooks keep a stack of the modules whose forward is running, so a call made inside
a child module is never counted as the owner's. Both exporters run the forward in Python (TorchScript
tracing, and torch.export in non-strict mode), so the children's quantizers appear in the ONNX graph
as QuantizeLinear/DequantizeLinear pairs, as the fx route's do.

The owner's class is not changed and no code is patched: the hooks are bound methods of a small plan
object held by the module, so ``copy.deepcopy`` and ``state_dict`` carry the quantizers and the plan.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from workbench.graph.composites import expanded
from workbench.graph.runtime_ops import call_site, candidate

logger = logging.getLogger(__name__)

__all__ = ["RuntimePlan", "attach_runtime_quantizers", "runtime_plan"]

_PLAN_ATTR = "_workbench_runtime_plan"


@dataclass
class _Frame:
    module: nn.Module
    plan: RuntimePlan | None
    counts: dict[tuple[str, int, int], int]  # call site -> calls from it so far, in this call of the module
    # tensors computed from a quantized weight this call (the weight quantizer's output, views of it): their layer
    weights: dict[int, tuple[torch.Tensor, nn.Module]] = field(default_factory=dict)


class _State:
    """The modules whose forward is running, while some owner's is."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.activator: nn.Module | None = None
        self.handles: list[Any] = []
        self.mode: _QuantizingMode | None = None
        self.thread = 0

    def push(self, module: nn.Module) -> None:
        plan = getattr(module, _PLAN_ATTR, None)
        self.stack.append(_Frame(module, plan if isinstance(plan, RuntimePlan) else None, {}))

    def global_pre(self, module: nn.Module, args: tuple) -> None:
        # process-wide hooks: another thread's module calls are not this thread's
        if self.mode is not None and self.mode.busy == 0 and threading.get_ident() == self.thread:
            self.push(module)

    def global_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.mode is not None and self.mode.busy == 0 and threading.get_ident() == self.thread and \
                self.stack and self.stack[-1].module is module:
            self.stack.pop()

    def activate(self, owner: nn.Module) -> None:
        self.thread = threading.get_ident()
        self.activator = owner
        self.push(owner)  # the process-wide hooks are put in place after the owner's own call began
        self.mode = _QuantizingMode(self)
        self.handles = [nn.modules.module.register_module_forward_pre_hook(self.global_pre),
                        nn.modules.module.register_module_forward_hook(self.global_post, always_call=True)]
        self.mode.__enter__()

    def deactivate(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        mode, self.mode = self.mode, None
        self.stack.clear()
        self.activator = None
        if mode is not None and _on_torch_stack(mode):  # exiting pops the top mode, whichever it is
            mode.__exit__(None, None, None)

    def stale(self) -> bool:
        """The mode is set but torch no longer runs it: an exporter that failed inside an owner's forward
        (torch.export on ultralytics' Detect) dropped it from torch's mode stack without the owner's post
        hook, and every later call would go unquantized (the TorchScript file then had no Q/DQ there)."""
        return self.mode is not None and not _on_torch_stack(self.mode)


def _on_torch_stack(mode: TorchFunctionMode) -> bool:
    # torch has no public reader of its function-mode stack; this one is in every torch 2 release
    from torch.overrides import _get_current_function_mode_stack

    return any(m is mode for m in _get_current_function_mode_stack())


class _PerThread(threading.local):
    """One state per thread: torch's mode stack is per thread, and a GUI worker may run a model while another
    thread runs one too; the process-wide module hooks read the calling thread's state."""

    def __init__(self) -> None:
        self.state = _State()


_LOCAL = _PerThread()


class _QuantizingMode(TorchFunctionMode):
    """Hands the planned calls of the running owner to their quantizer modules."""

    def __init__(self, state: _State) -> None:
        super().__init__()
        self.state = state
        self.busy = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        stack = self.state.stack
        frame = stack[-1] if stack else None
        if frame is None or frame.plan is None or self.busy:
            return func(*args, **kwargs)
        body = expanded(func)
        if body is not None:  # the recorder saw the calls inside (workbench.graph.composites): so must the plan
            with self:
                return body(*args, **kwargs)
        if frame.plan.weights:  # layers whose weight the owner uses without calling them (Mamba's dt_proj)
            args, kwargs, result = self._quantize_weights(frame, func, args, kwargs)
            if result is not None:
                return result
        found = candidate(func, args, kwargs)
        if found is None:
            return func(*args, **kwargs)
        kind, layout, tensors, options = found
        site = call_site()
        occurrence = frame.counts.get(site, 0)
        frame.counts[site] = occurrence + 1
        child_name = frame.plan.children.get((kind, site, occurrence))
        if child_name is None:
            return func(*args, **kwargs)
        child = frame.module._modules.get(child_name)
        if child is None:
            return func(*args, **kwargs)
        self.busy += 1  # the child's own calls (and the module hooks they fire) are not the owner's
        try:
            return _run(child, kind, layout, tensors, options)
        finally:
            self.busy -= 1


    def _quantize_weights(self, frame: _Frame, func, args: tuple, kwargs: dict) -> tuple[tuple, dict, Any]:
        """``args`` and ``kwargs`` with a planned layer's weight fake-quantized by the layer's weight quantizer
        (where the owner's code first touches it: before a squeeze or a transpose, so per-channel amax fits),
        and, in the GEMM that takes it (or a view of it), the activation operand by the layer's input quantizer.
        The third item is the call's result when this computed it (a view of a quantized weight), else None."""
        leaves, spec = tree_flatten((args, kwargs))
        owners = {id(getattr(layer, name)): layer for layer, name in frame.plan.weights}
        used: nn.Module | None = None
        self.busy += 1
        try:
            for i, leaf in enumerate(leaves):
                if not isinstance(leaf, torch.Tensor):
                    continue
                layer = owners.get(id(leaf))
                if layer is not None:
                    leaves[i] = layer.weight_quantizer(leaf)
                    frame.weights[id(leaves[i])] = (leaves[i], layer)
                    used = layer
                elif id(leaf) in frame.weights and frame.weights[id(leaf)][0] is leaf:
                    used = frame.weights[id(leaf)][1]
            if used is None:
                return args, kwargs, None
            activation = _GEMM_INPUTS.get(func)
            if activation is not None:
                for i, leaf in enumerate(leaves):
                    if (isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and id(leaf) not in frame.weights
                            and not isinstance(leaf, nn.Parameter) and activation(i)):
                        leaves[i] = used.input_quantizer(leaf)
                        break
            args, kwargs = tree_unflatten(leaves, spec)
            if activation is None and getattr(func, "__name__", "") in _VIEWS:
                result = func(*args, **kwargs)
                frame.weights[id(result)] = (result, used)
                return args, kwargs, result
            return args, kwargs, None
        finally:
            self.busy -= 1


# the GEMMs a layer's weight reaches without its layer, and which flattened argument may be the activation
_GEMM_INPUTS = {F.linear: lambda i: i == 0, F.conv1d: lambda i: i == 0, F.conv2d: lambda i: i == 0,
                F.conv3d: lambda i: i == 0, torch.matmul: lambda i: i < 2, torch.Tensor.matmul: lambda i: i < 2,
                torch.Tensor.__matmul__: lambda i: i < 2, torch.Tensor.__rmatmul__: lambda i: i < 2}
# what only moves a weight's values (a view of a quantized weight is still that weight, for the GEMM after it)
_VIEWS = {"squeeze", "unsqueeze", "view", "reshape", "t", "transpose", "permute", "contiguous", "to", "float",
          "__getitem__", "flatten", "mT", "T", "type_as"}


def _run(child: nn.Module, kind: str, layout: str, tensors: list[torch.Tensor], options: dict[str, Any]) -> Any:
    if kind == "add":
        return child(tensors[0], tensors[1])
    if kind == "concat":
        return child(tensors, options.get("dim", 0))
    if kind == "matmul":
        if layout == "baddbmm":
            return child(tensors[0], tensors[1], options["bias"], options.get("beta", 1), options.get("alpha", 1))
        return child(tensors[0], tensors[1])
    extra = {k: v for k, v in options.items() if k in ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")}
    return child(tensors[0], tensors[1], tensors[2], **extra)


class RuntimePlan:
    """``(kind, call site, occurrence) -> child name`` for one owner (:attr:`RecordedOp.key
    <workbench.graph.runtime_ops.RecordedOp.key>`); its bound methods are the owner's hooks."""

    def __init__(self, children: dict[tuple, str], weights: list[tuple[nn.Module, str]] | None = None) -> None:
        self.children = dict(children)
        # (layer, parameter name): a quantized layer whose weight this owner's code uses without calling the layer
        self.weights = list(weights or [])

    def pre_hook(self, module: nn.Module, args: tuple) -> None:
        state = _LOCAL.state
        if state.stale():
            state.deactivate()
        if state.mode is None:
            state.activate(module)

    def post_hook(self, module: nn.Module, args: tuple, output: Any) -> None:
        state = _LOCAL.state
        if state.activator is module:
            state.deactivate()

    def __repr__(self) -> str:
        return f"RuntimePlan({self.children})"


def runtime_plan(module: nn.Module) -> RuntimePlan | None:
    """The run-time plan a module carries, if any."""
    plan = getattr(module, _PLAN_ATTR, None)
    return plan if isinstance(plan, RuntimePlan) else None


def attach_runtime_quantizers(owner: nn.Module, children: dict[tuple, tuple[str, nn.Module]],
                              weights: list[tuple[nn.Module, str]] | None = None) -> None:
    """Give ``owner`` the quantizer modules of its own functional operations, applied at run time.

    Args:
        owner: the module whose own forward calls the operations.
        children: ``(kind, call site, occurrence) -> (child name, quantizer module)``, the key of
            :class:`workbench.graph.runtime_ops.RecordedOp`.
    """
    plan = RuntimePlan({key: name for key, (name, _module) in children.items()}, weights)
    for name, module in children.values():
        owner.add_module(name, module)
    existing = runtime_plan(owner)
    if existing is not None:
        existing.children.update(plan.children)
        existing.weights.extend(w for w in plan.weights if w not in existing.weights)
        return
    setattr(owner, _PLAN_ATTR, plan)
    owner.register_forward_pre_hook(plan.pre_hook)
    owner.register_forward_hook(plan.post_hook, always_call=True)
