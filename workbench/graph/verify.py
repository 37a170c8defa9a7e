"""Check that a traced forward computes what the original computed, on the module's real inputs.

Tracing runs ``forward`` on proxies: a branch on ``x is None`` is decided once, at trace time, and the
GraphModule keeps that branch for every later call (HF ``BertEmbeddings`` with ``token_type_ids``).
:func:`capture_calls` runs the float model once on a sample input and records each module's first
call (positional and keyword arguments, cloned); :func:`traced_differs` runs the traced module and
the original on that call, with the newly inserted quantizers bypassed, and says how they differ.
:func:`value_dtypes` runs the traced graph node by node on the same call and records each node's
dtype, so that integer and boolean tensors are never given quantizers: on meta tensors (the call, the weights and
the buffers of the module's subtree), on the values only where meta cannot follow the forward. On a run on shapes
only (a lazily opened model, :mod:`workbench.sources.shapes_only`) the calls are meta tensors and the check compares
shapes and dtypes.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.sources.shapes_only import on_shapes, plain_meta, shapes_mode

__all__ = ["ModuleCall", "capture_calls", "traced_differs", "value_dtypes"]


@dataclass
class ModuleCall:
    """The arguments of one call of a module (tensors cloned at the time of the call)."""

    args: tuple
    kwargs: dict[str, Any]


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        # a run on shapes only: a plain meta tensor, never a fake one that would outlive its mode
        return plain_meta(value) if value.is_meta else value.detach().clone()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict) and type(value) is dict:
        return {k: _clone(v) for k, v in value.items()}
    return value


def capture_calls(model: nn.Module, example_inputs: Any) -> dict[int, ModuleCall]:
    """Run ``model`` once on ``example_inputs`` (a tensor, a tuple of positional inputs, or a dict of
    keyword inputs) and return each module's first call, by ``id(module)``.

    Raises whatever the model raises on the input.
    """
    calls: dict[int, ModuleCall] = {}
    handles = []

    def hook(module, args, kwargs):
        if id(module) not in calls:
            calls[id(module)] = ModuleCall(_clone(tuple(args)), _clone(dict(kwargs)))

    try:
        for module in model.modules():
            if not isinstance(module, TensorQuantizer):
                handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        quantizers = [m for m in model.modules() if isinstance(m, TensorQuantizer)]
        with torch.no_grad(), _bypassed(quantizers), shapes_mode(example_inputs):  # a float forward: quantizers
            # may not be calibrated yet
            if isinstance(example_inputs, dict):
                model(**example_inputs)
            elif isinstance(example_inputs, (tuple, list)):
                model(*example_inputs)
            else:
                model(example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _difference(a: Any, b: Any, where: str = "output") -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} instead of {type(b).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{where}: shape/dtype {tuple(a.shape)}/{a.dtype} instead of {tuple(b.shape)}/{b.dtype}"
        if a.is_meta or b.is_meta:  # a run on shapes only (a lazily opened model): no values to compare
            return None
        if not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                          and torch.equal(a.nan_to_num(), b.nan_to_num())):
            diff = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "integer values"
            return f"{where}: values differ (max |difference| {diff})"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} instead of {list(b)}"
        for key in a:
            found = _difference(a[key], b[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items instead of {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} instead of {type(b).__name__}"
    if hasattr(a, "to_tuple") and hasattr(b, "to_tuple"):  # ModelOutput-like
        return _difference(a.to_tuple(), b.to_tuple(), where)
    try:
        return None if a == b else f"{where}: {a!r} instead of {b!r}"
    except Exception:  # objects without a usable ==: nothing more to compare
        return None


@contextlib.contextmanager
def _bypassed(quantizers: Iterable[TensorQuantizer]):
    saved = [(q, q.is_enabled) for q in quantizers]
    try:
        for q, _ in saved:
            q.disable()
        yield
    finally:
        for q, enabled in saved:
            q.set_enabled(enabled)


def traced_differs(traced: nn.Module, original: nn.Module, call: ModuleCall,
                   new_quantizers: Iterable[TensorQuantizer]) -> str | None:
    """Why ``traced`` (its new quantizers bypassed) does not compute exactly what ``original`` does on
    ``call``, or None when the outputs are equal."""
    try:  # the same random numbers for both runs, without touching the caller's generator
        with torch.no_grad(), _bypassed(new_quantizers), torch.random.fork_rng(devices=[]), \
                shapes_mode((call.args, call.kwargs)):
            torch.manual_seed(0)
            expected = original(*_clone(call.args), **_clone(call.kwargs))
            torch.manual_seed(0)
            actual = traced(*_clone(call.args), **_clone(call.kwargs))
    except Exception as error:  # the traced forward fails where the original ran
        text = str(error).strip().splitlines()
        return f"the traced forward fails on the sample input: {type(error).__name__}: {text[0] if text else ''}"
    found = _difference(actual, expected)
    return None if found is None else f"the traced forward differs from the original on the sample input ({found})"


class _DtypeRecorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.dtypes: dict[fx.Node, torch.dtype | None] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.dtypes[n] = result.dtype
        elif isinstance(result, (tuple, list)) and result and all(isinstance(r, torch.Tensor) for r in result):
            self.dtypes[n] = result[0].dtype  # unbind/chunk/split: the items are read through getitem
        elif not isinstance(result, (tuple, list, dict)) and not hasattr(result, "keys"):
            self.dtypes[n] = None  # a number, a shape, a dtype: never an activation
        return result


def value_dtypes(gm: fx.GraphModule, call: ModuleCall) -> dict[fx.Node, torch.dtype | None]:
    """Each node's result dtype (None for non-tensors) when ``gm`` runs on ``call``; {} if it cannot run.

    A call on real tensors runs on meta first (:func:`_meta_dtypes`: the same dtypes without computing a value,
    where the real run is a forward of the module's whole subtree: a decoder's every block, again per module);
    the real run is the fallback, and the only route when the forward reads a value."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        bound = inspect.signature(gm.forward).bind(*call.args, **call.kwargs)
        bound.apply_defaults()
        values = []
        for node in placeholders:
            name = str(node.target).lstrip("*")
            values.append(bound.arguments.get(name, node.args[0] if node.args else None))
    except Exception:  # best effort: without dtypes the name rules still apply
        return {}
    found = _meta_dtypes(gm, tuple(values))
    if found is not None:
        return found
    try:
        recorder = _DtypeRecorder(gm)
        with torch.no_grad(), shapes_mode(values):
            recorder.run(*_clone(tuple(values)))
    except Exception:  # best effort: without dtypes the name rules still apply
        return {}
    return recorder.dtypes


class _Run(nn.Module):
    """Holds ``gm`` as its only child so that :func:`torch.func.functional_call` swaps the weights of ``gm``'s
    whole subtree while the recorder interprets it node by node."""

    def __init__(self, gm: fx.GraphModule, recorder: _DtypeRecorder) -> None:
        super().__init__()
        self.gm = gm
        self.recorder = recorder

    def forward(self, *values: Any) -> Any:
        return self.recorder.run(*values)


def _meta_dtypes(gm: fx.GraphModule, values: tuple) -> dict[fx.Node, torch.dtype | None] | None:
    """``gm``'s node dtypes from a run on plain meta tensors (its inputs, weights and buffers), or None where that
    run is not the real run's twin and the caller runs it on the values.

    Plain meta tensors, not fake ones: code that reads a value (``.item()``, ``if mask.all()``) raises on them
    instead of taking another branch, as it does on fake tensors, which transformers takes for tracing (it then
    builds masks it skips on real inputs). So a run that ends went the real run's way and computed the same
    dtypes (the quantizers return their input's dtype, on meta as on values). Not tried on a run on shapes
    only (inputs already on meta: the caller's route), nor under a torch function mode (a lazily opened
    checkpoint paging weights in as operations read them: the real run's business)."""
    if on_shapes(values) or torch.overrides._get_current_function_mode_stack():
        return None
    twins = _meta_twins(values)
    if twins is None:
        return None
    # torch.empty from shape and dtype only: those read no lazily held weight (strides would); a weight held under
    # two names (tied embeddings) is named once, and functional_call gives the other name the same twin
    state = {name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
             for name, tensor in itertools.chain(gm.named_parameters(), gm.named_buffers())}
    recorder = _DtypeRecorder(gm)
    run = _Run(gm, recorder)
    # a forward that keeps something on its modules (a cache of cos/sin) or updates a buffer in place must not
    # keep meta tensors, and does on the real run what it did before: compared after the run
    attributes = {module: dict(vars(module)) for module in gm.modules()}
    try:
        with torch.no_grad():
            torch.func.functional_call(run, {f"gm.{name}": tensor for name, tensor in state.items()},
                                       twins, tie_weights=True, strict=False)
    except Exception:  # a forward that needs values (or a real tensor made inside it): run it on them
        return None
    finally:
        changed = _restore_attributes(attributes)
    if changed or any(tensor._version for tensor in state.values()):
        return None
    return recorder.dtypes


def _meta_twins(values: tuple) -> tuple | None:
    """A deep copy of ``values`` with every tensor on meta, objects that hold tensors (a transformers cache, which
    the forward extends) copied with meta ones: the run on meta leaves the caller's objects as they were. None
    where the copy cannot be made (or would copy a module)."""
    twins: dict[int, Any] = {}
    seen: set[int] = set()
    pending: list[Any] = [values]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            twins[id(item)] = item.detach().to("meta")
        elif isinstance(item, nn.Module):
            return None
        elif isinstance(item, (tuple, list, set, frozenset)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif hasattr(item, "__dict__") and not isinstance(item, type) and not callable(item):
            pending.extend(vars(item).values())
    try:  # the memo hands deepcopy each tensor's twin; a tensor it finds that the walk did not stays real, and
        # the run, mixing devices, fails and falls back to the values
        return copy.deepcopy(values, dict(twins))
    except Exception:
        return None


def _restore_attributes(attributes: dict[nn.Module, dict[str, Any]]) -> bool:
    """Give each module the plain attributes it had before a run (``attributes``, by module); whether any
    differed."""
    changed = False
    for module, before in attributes.items():
        now = vars(module)
        if now.keys() != before.keys() or any(now[key] is not value for key, value in before.items()):
            changed = True
            now.clear()
            now.update(before)
    return changed
