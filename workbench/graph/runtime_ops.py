"""Find the functional operations of any forward that runs, by watching torch calls while the model runs.

torch.fx only sees a forward it can trace; Hugging Face SAM's vision attention, diffusers' attention
processors, MoE routing and data-dependent control flow are not. :func:`record_functional_ops` runs
the model once on a sample input under a ``torch.overrides.TorchFunctionMode`` and module forward
pre/post hooks, and records every candidate operation (adds of two tensors, concatenations, products
of two tensors, ``F.scaled_dot_product_attention``) with

* its calling module (the innermost module whose ``forward`` is running) and its index among that
  module's calls of the same kind (``matmul`` #0, #1... counted afresh at each call of the module),
* where each operand came from: a module's output, an earlier operation, a model input, a parameter
  (or a view of one), or a constant / integer / mask tensor, and whether it is a floating activation,
* the facts the one rule table (:mod:`workbench.graph.placement`) needs, and so its reason to stay in
  floating point, if any.

It also finds quantized layers whose weight is used without calling the layer (Hugging Face Mamba's
``conv1d.weight`` and ``dt_proj.weight`` in the torch path). :mod:`workbench.graph.runtime_quant`
applies the record at run time, keyed by (module, kind, index).

What is an activation: a floating tensor computed from a floating activation (a floating model input
to begin with), or looked up in a parameter with an index computed from the model's inputs (an
embedding). Masks computed from an integer ``attention_mask``, rotary tables computed from buffers
and position ids, ``arange`` grids and parameters are not.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from workbench.graph.composites import expanded
from workbench.graph.dataflow import FACTORIES, LIKE_OTHER, POINTWISE_FUNCTIONS, in_transformer_block
from workbench.graph.placement import IN_SCAN, OperationFacts, skip_reason
from workbench.graph.tree import is_quantized_module
from workbench.quant.nn.modules.einsum_product import einsum_operands, einsum_product
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.sources.shapes_only import shapes_mode

__all__ = ["Operand", "RecordedOp", "DirectWeightUse", "RuntimeRecord", "record_functional_ops", "classify",
           "NAME_BASES", "call_site", "Site"]

# functions (and Tensor methods/operators) per kind; the second item says how the operands are laid out
_ADDS = {torch.add: "add", torch.Tensor.add: "add", torch.Tensor.__add__: "add", torch.Tensor.__radd__: "radd",
         torch.Tensor.add_: "iadd", torch.Tensor.__iadd__: "iadd"}
_CATS = {torch.cat: "cat", torch.concat: "cat", torch.concatenate: "cat"}
_PRODUCTS = {torch.matmul: "matmul", torch.Tensor.matmul: "matmul", torch.Tensor.__matmul__: "matmul",
             torch.Tensor.__rmatmul__: "rmatmul", torch.bmm: "bmm", torch.Tensor.bmm: "bmm",
             torch.baddbmm: "baddbmm", torch.Tensor.baddbmm: "baddbmm",
             torch.einsum: "einsum"}  # a batched-product einsum only (see :func:`candidate`)
_SDPA = {F.scaled_dot_product_attention: "sdpa"}
# layers' own functions: a parameter of a quantized layer that reaches one of these without its layer
_WEIGHT_USERS = {F.linear, F.conv1d, F.conv2d, F.conv3d}
# the names given to the quantizers of each kind (as the fx route names them): <owner>.matmul, <owner>.matmul_1
NAME_BASES = {"add": "add", "concat": "cat", "matmul": "matmul", "attention": "sdpa"}
_SOFTMAX = {torch.softmax, torch.Tensor.softmax, F.softmax}
_PASS_SOFTMAX = {F.dropout, torch.Tensor.to, torch.Tensor.type_as, torch.Tensor.float, torch.Tensor.contiguous}


def classify(func: Callable) -> tuple[str, str] | None:
    """``(kind, layout)`` of a candidate functional operation, or None."""
    for table, kind in ((_ADDS, "add"), (_CATS, "concat"), (_PRODUCTS, "matmul"), (_SDPA, "attention")):
        layout = table.get(func)
        if layout is not None:
            return kind, layout
    return None


def operands(layout: str, args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, Any]]:
    """The tensors an operation combines, in the order its quantizer module takes them, and its options."""
    if layout in ("add", "iadd"):
        other = args[1] if len(args) > 1 else kwargs.get("other")
        return [args[0], other], {"alpha": kwargs.get("alpha", 1), "out": kwargs.get("out")}
    if layout == "radd":
        return [args[1], args[0]], {"alpha": 1, "out": None}
    if layout == "cat":
        tensors = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0))
        return list(tensors) if isinstance(tensors, (list, tuple)) else [tensors], {"dim": dim,
                                                                                  "out": kwargs.get("out")}
    if layout in ("matmul", "bmm"):
        other = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
        return [args[0], other], {"out": kwargs.get("out")}
    if layout == "rmatmul":
        return [args[1], args[0]], {"out": None}
    if layout == "einsum":
        equation, tensors = einsum_operands(args)
        return tensors, {"equation": equation, "out": None}
    if layout == "baddbmm":
        names = ("input", "batch1", "batch2")
        bound = dict(zip(names, args))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        return [bound.get("batch1"), bound.get("batch2")], {
            "bias": bound.get("input"), "beta": kwargs.get("beta", 1), "alpha": kwargs.get("alpha", 1),
            "out": kwargs.get("out")}
    names = ("query", "key", "value")  # sdpa
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    options = dict(zip(("attn_mask", "dropout_p", "is_causal"), args[3:]))
    options.update({k: v for k, v in kwargs.items() if k not in names})
    return [bound.get(n) for n in names], options


def candidate(func: Callable, args: tuple, kwargs: dict) -> tuple[str, str, list[Any], dict[str, Any]] | None:
    """``(kind, layout, operands, options)`` when ``func(*args, **kwargs)`` combines tensors only (``x + 1``
    and ``x.size(0) + 1`` are not candidates, and are not counted); the recorder and the run-time
    quantizers count an owner's calls with this one test, so their indices agree."""
    found = classify(func)
    if found is None:
        return None
    kind, layout = found
    tensors, options = operands(layout, args, kwargs)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    if layout == "einsum" and (len(tensors) != 2 or einsum_product(options["equation"]) is None):
        return None  # a trace, an outer product, three operands: no matrix product TensorRT runs as a GEMM
    return kind, layout, tensors, options


@dataclass(frozen=True)
class Operand:
    """Where one operand of a recorded operation came from."""

    origin: str        # "module", "op", "input", "parameter", "constant" or "integer"
    name: str          # the module / operation / parameter, "" for constants and inputs
    activation: bool   # a floating activation (what TensorRT quantizes)
    value: int         # the tensor's id within the recording (equal ids: the same tensor)
    root: int = 0      # the value it comes from through elementwise and shape steps only

    def describe(self) -> str:
        return {"module": f"output of {self.name}", "op": f"result of {self.name}", "input": "a model input",
                "parameter": f"parameter {self.name}", "constant": "a constant or mask",
                "integer": "an integer or boolean tensor"}[self.origin]


@dataclass(frozen=True)
class RecordedOp:
    """One candidate functional operation, as it ran."""

    owner: str                       # the calling module ("" for the model's own forward)
    kind: str                        # "add", "concat", "matmul" or "attention"
    layout: str                      # the function called: "add", "radd", "iadd", "cat", "matmul", "bmm"...
    index: int                       # its index among the owner's calls of this kind, in one call of the owner
    operation: str                   # the function, e.g. "Tensor.__matmul__"
    operands: tuple[Operand, ...]
    output: int                      # the result's value id
    facts: OperationFacts
    options: tuple[tuple[str, Any], ...] = ()
    roles: tuple[str, ...] = ()      # ("probabilities", "value") for P @ V
    blocked: str | None = None       # a reason of this route to leave it float (an in-place add)
    mask: int | None = None          # an attention's attn_mask: the value it comes from (its root)
    site: Site = ("", 0, 0)          # the instruction of model code that called it (see :func:`call_site`)
    occurrence: int = 0              # its index among the calls from that site, in one call of the owner

    @property
    def key(self) -> tuple[str, Site, int]:
        """What identifies it in every call of its owner, whichever branches the owner takes: (kind, call site,
        occurrence). Its ``index`` does not: a branch taken in one call only (ultralytics' Detect builds its
        anchors with two concatenations when the input's shape changes) shifts the indices after it."""
        return self.kind, self.site, self.occurrence

    def reason(self, residual_adds_in_transformer_blocks: bool = False) -> str | None:
        """Why it stays in floating point (None: it gets a quantizer), by the one rule table."""
        return self.blocked or skip_reason(
            self.facts, residual_adds_in_transformer_blocks=residual_adds_in_transformer_blocks)

    def describe(self) -> str:
        sources = ", ".join(o.describe() for o in self.operands)
        return f"{self.operation}({sources})"


@dataclass(frozen=True)
class DirectWeightUse:
    """A quantized layer whose weight was used by another module's code, without calling the layer."""

    layer: str          # the layer, e.g. "backbone.layers.0.mixer.dt_proj"
    parameter: str      # "weight"
    owner: str          # the module whose forward used it
    operation: str      # the function that read it


@dataclass(frozen=True)
class LayerRead:
    """A quantized layer's call, and which recorded value its first input was (for the placement rules)."""

    layer: str
    value: int


@dataclass
class RuntimeRecord:
    """Every candidate operation of one run of the model, with the modules that ran."""

    ops: list[RecordedOp] = field(default_factory=list)
    direct_weights: list[DirectWeightUse] = field(default_factory=list)
    reads: list[LayerRead] = field(default_factory=list)
    called: set[str] = field(default_factory=set)

    def by_owner(self, owner: str) -> list[RecordedOp]:
        """The owner's operations, each :attr:`RecordedOp.key` once (a module called twice records it twice)."""
        seen: dict[tuple[str, Site, int], RecordedOp] = {}
        for op in self.ops:
            if op.owner == owner:
                seen.setdefault(op.key, op)
        return list(seen.values())

    @property
    def owners(self) -> list[str]:
        return list(dict.fromkeys(op.owner for op in self.ops))


@dataclass
class _Tag:
    value: int
    origin: str
    name: str
    activation: bool
    from_input: bool           # depends on a model input (integer ones too)
    root: int                  # the value this one comes from through elementwise steps only
    parameter: str | None = None  # a parameter, or a view of one: its qualified name
    softmax: bool = False


@dataclass
class _Frame:
    module: nn.Module
    name: str | None            # None: not a module of the model, or a quantized module (its ops are its own)
    first_value: int
    counts: dict[str, int] = field(default_factory=dict)
    children: int = 0           # layers called so far by this call of the module
    sites: dict[tuple[str, int, int], int] = field(default_factory=dict)  # call site -> ``children`` when last seen
    occurrences: dict[tuple[str, int, int], int] = field(default_factory=dict)  # call site -> calls from it so far


_TORCH_DIR = os.path.dirname(torch.__file__)


_GRAPH_DIR = os.path.dirname(__file__)
Site = tuple[str, int, int]


def call_site() -> Site:
    """The instruction of model code that made the current torch call (torch's own frames and this package's
    skipped): file, line and bytecode offset, so ``a + b + c`` on one line is two sites and a loop's step one.
    The recorder and the run-time quantizers (:mod:`workbench.graph.runtime_quant`) key operations by it."""
    frame = sys._getframe(1)
    # directories end with a separator: torchvision's files (Swin's shifted_window_attention) are model code, not
    # torch's, though their path starts with torch's directory's; skipped, every call inside took its caller's line
    skipped = (os.path.join(_TORCH_DIR, ""), os.path.join(_GRAPH_DIR, ""))
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_lasti) if frame is not None else ("", 0, 0)


_IN_PLACE = ("an in-place add (x += y, x.add_(y)) found at run time: a quantized add returns a new tensor and cannot "
             "write into its first operand")
_SHAPE_ONLY = {"view", "reshape", "squeeze", "unsqueeze", "transpose", "permute", "t", "contiguous", "flatten",
               "expand", "__getitem__", "narrow", "unflatten", "mT", "T", "detach", "clone", "to", "float", "type_as",
               "reshape_as", "view_as", "expand_as", "movedim", "swapaxes", "select", "repeat", "dropout"}

class _Recorder(TorchFunctionMode):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.names = {id(m): n for n, m in model.named_modules()}
        self.modules = {id(m): m for m in model.modules()}
        self.modules_by_name = dict(model.named_modules())
        self.parameters = {id(p): n for n, p in itertools.chain(model.named_parameters(), model.named_buffers())}
        self.owner_of_parameter = {}
        for name, module in model.named_modules():
            for pname, param in itertools.chain(module.named_parameters(recurse=False),
                                                module.named_buffers(recurse=False)):
                self.owner_of_parameter.setdefault(id(param), (name, module, pname))
        self.tags = WeakTensorKeyDictionary()
        self.parameter_tags: dict[int, _Tag] = {}
        self.counter = itertools.count(1)
        self.stack: list[_Frame] = []
        self.record = RuntimeRecord()
        self.busy = False
        self.thread = threading.get_ident()
        self.scans: set[tuple[int, tuple[str, int, int]]] = set()
        self.sites: list[tuple[int, tuple[str, int, int]]] = []  # per recorded op: (owner call, call site)

    # ----- tags -----------------------------------------------------------------------------

    def tag(self, tensor: torch.Tensor) -> _Tag:
        pname = self.parameters.get(id(tensor))
        if pname is not None:
            # the model's own tensors are tagged by id, never weakly referenced: a lazily opened checkpoint swaps
            # their data in place while this forward runs (torch.utils.swap_tensors refuses a weakly held tensor)
            tag = self.parameter_tags.get(id(tensor))
            if tag is None:
                value = next(self.counter)
                tag = self.parameter_tags[id(tensor)] = _Tag(value, "parameter", pname, False, False, value,
                                                             parameter=pname)
            return tag
        tag = self.tags.get(tensor)
        if tag is None:
            value = next(self.counter)
            tag = _Tag(value, "constant" if tensor.is_floating_point() else "integer", "", False, False, value)
            self.tags[tensor] = tag
        return tag

    def set_tag(self, tensor: torch.Tensor, tag: _Tag) -> None:
        if id(tensor) in self.parameters:  # an op that returned a parameter itself (``w.to(w.dtype)``)
            self.parameter_tags[id(tensor)] = tag
        else:
            self.tags[tensor] = tag

    def tag_input(self, tensor: torch.Tensor) -> None:
        value = next(self.counter)
        floating = tensor.is_floating_point()
        self.tags[tensor] = _Tag(value, "input" if floating else "integer", "", floating, True, value)

    def operand(self, tensor: Any) -> Operand | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        tag = self.tag(tensor)
        return Operand(tag.origin, tag.name, tag.activation and tensor.is_floating_point(), tag.value, tag.root)

    # ----- the mode ---------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.busy:
            return func(*args, **kwargs)
        body = expanded(func)
        if body is not None and self.stack and self.stack[-1].name is not None:
            with self:  # torch's body of F.multi_head_attention_forward, its GEMMs and products seen one by one
                return body(*args, **kwargs)
        self.busy = True
        try:
            frame = self.stack[-1] if self.stack else None
            recording = frame is not None and frame.name is not None
            found = candidate(func, args, kwargs) if recording else None
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            tags = [self.tag(t) for t in inputs]
            if recording and (func in _WEIGHT_USERS or found is not None):
                self.note_direct_weights(frame, func, inputs, tags)
            self.busy = False
            result = func(*args, **kwargs)
            self.busy = True
            outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            if found is not None:
                self.note_op(frame, func, found, args, kwargs, outputs)
            else:
                self.propagate(func, inputs, tags, outputs)
            return result
        finally:
            self.busy = False

    def propagate(self, func: Callable, inputs: list[torch.Tensor], tags: list[_Tag],
                  outputs: list[torch.Tensor]) -> None:
        name = getattr(func, "__name__", "").strip("_")
        if name in LIKE_OTHER:  # x.type_as(y): y gives only its dtype, shape or device, x the values
            inputs, tags = inputs[:1], tags[:1]
        # a factory follows its inputs' shapes (an embedding looked up with ones_like(ids) is per input), not values
        from_input = any(g.from_input for g in tags)
        if name in FACTORIES:  # y.new_full(...), zeros_like(y): no value of y reaches the result
            inputs, tags = [], []
        floating = [(t, g) for t, g in zip(inputs, tags) if t.is_floating_point()]
        activation = any(g.activation for _, g in floating) or (
            from_input and any(g.parameter for _, g in floating))
        active = [g for _, g in floating if g.activation]
        softmax = func in _SOFTMAX or (func in _PASS_SOFTMAX and bool(tags) and tags[0].softmax)
        for out in outputs:
            if out in self.tags and any(out is t for t in inputs) and (self.tags[out].activation or not activation):
                continue  # an in-place function returns its input: it keeps its tag, unless it writes an activation
            value = next(self.counter)
            if name in _SHAPE_ONLY and tags and tags[0].activation:  # x.reshape_as(y) is x's
                root = tags[0].root
            elif name in POINTWISE_FUNCTIONS and len({g.root for g in active}) == 1:
                root = active[0].root
            else:
                root = value
            parameter = tags[0].parameter if (len(tags) == 1 and name in _SHAPE_ONLY) else None
            first = active[0] if active else (tags[0] if tags else None)
            origin, source = (first.origin, first.name) if first is not None else ("constant", "")
            if not out.is_floating_point():
                origin = "integer"
            elif origin == "integer":  # a float computed from integers only (an arange grid)
                origin = "constant"
            elif not activation and origin in ("input", "module", "op"):
                origin = "constant"
            self.set_tag(out, _Tag(value, origin, source, activation and out.is_floating_point(), from_input,
                                   root, parameter=parameter, softmax=softmax))

    def note_op(self, frame: _Frame, func: Callable, found: tuple[str, str, list[Any], dict[str, Any]],
                args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> None:
        kind, layout, tensors, options = found
        index = frame.counts.get(kind, 0)
        frame.counts[kind] = index + 1
        # the same line again with no layer called since: a loop of tensor operations (a scan over the sequence),
        # whose number of steps follows the input's length
        site = call_site()
        scan = frame.sites.get(site) == frame.children
        frame.sites[site] = frame.children
        occurrence = frame.occurrences.get(site, 0)
        frame.occurrences[site] = occurrence + 1
        if scan:
            self.scans.add((frame.first_value, site))
        sources = tuple(self.operand(t) for t in tensors)
        qualified = f"{frame.name}.{NAME_BASES[kind]}#{index}" if frame.name else f"{NAME_BASES[kind]}#{index}"
        roles: tuple[str, ...] = ()
        if kind == "matmul" and isinstance(tensors[0], torch.Tensor) and self.tag(tensors[0]).softmax:
            roles = ("probabilities", "value")
        tags = [self.tag(t) for t in tensors]
        facts = OperationFacts(
            kind, parameter=any(t.parameter is not None for t in tags),
            activations=all(s.activation for s in sources), has_out=options.get("out") is not None,
            alpha=options.get("alpha", 1), dim_known=isinstance(options.get("dim", 0), int),
            formula=kind == "add" and len(tags) == 2 and tags[0].value != tags[1].value
            and tags[0].root == tags[1].root and (tags[0].root != tags[0].value or tags[1].root != tags[1].value),
            in_block=kind == "add" and in_transformer_block(frame.module))
        # x += y: the quantized add would return a new tensor, not write into x
        blocked = _IN_PLACE if layout == "iadd" else None
        value = next(self.counter)
        activation = any(s.activation for s in sources)
        for out in outputs:
            self.set_tag(out, _Tag(value, "op", qualified, activation and out.is_floating_point(), True, value))
        kept = tuple((k, v) for k, v in options.items() if k not in ("out",) and not isinstance(v, torch.Tensor))
        mask = options.get("attn_mask")
        mask_root = self.tag(mask).root if isinstance(mask, torch.Tensor) else None
        self.record.ops.append(RecordedOp(frame.name or "", kind, layout, index, _func_name(func), sources, value,
                                          facts, kept, roles, blocked, mask_root, site, occurrence))
        self.sites.append((frame.first_value, site))

    def note_direct_weights(self, frame: _Frame, func: Callable, inputs: list[torch.Tensor],
                            tags: list[_Tag]) -> None:
        for tag in tags:
            if tag.parameter is None or not tag.parameter.endswith("weight"):
                continue
            layer, _, pname = tag.parameter.rpartition(".")
            module = self.modules_by_name.get(layer)
            if module is None or module is frame.module or not is_quantized_module(module):
                continue
            use = DirectWeightUse(layer, pname, frame.name or "", _func_name(func))
            if use not in self.record.direct_weights:
                self.record.direct_weights.append(use)

    # ----- module hooks -------------------------------------------------------------------------

    def pre_hook(self, module: nn.Module, args: tuple) -> None:
        if self.busy or threading.get_ident() != self.thread:  # process-wide hooks: this run's thread only
            return
        name = self.names.get(id(module))
        if name is not None:
            self.record.called.add(name)
            if is_quantized_module(module) and module._modules.get("_input_quantizer") is not None:
                first = args[0] if args else None
                if isinstance(first, torch.Tensor):
                    self.busy = True
                    try:
                        self.record.reads.append(LayerRead(name, self.tag(first).value))
                    finally:
                        self.busy = False
        if self.stack:
            self.stack[-1].children += 1
        own = name is not None and not isinstance(module, TensorQuantizer) and not is_quantized_module(module)
        self.stack.append(_Frame(module, name if own else None, next(self.counter)))

    def post_hook(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.busy or not self.stack or threading.get_ident() != self.thread:
            return
        frame = self.stack.pop()
        if frame.name is None and self.names.get(id(module)) is None:
            return
        name = self.names.get(id(module), "")
        self.busy = True
        try:
            # a quantized layer or quantizer (its steps are not recorded) passes an activation on, whatever its
            # kernel's steps looked like (an all-zero output of a collapsed amax is still the layer's output)
            opaque = frame.name is None and any(
                isinstance(a, torch.Tensor) and a.is_floating_point() and self.tag(a).activation
                for a in tree_flatten(args)[0])
            for out in tree_flatten(output)[0]:
                if not isinstance(out, torch.Tensor):
                    continue
                tag = self.tags.get(out)
                if tag is not None and tag.value >= frame.first_value and tag.origin != "parameter":
                    tag.origin, tag.name, tag.root = "module", name, tag.value  # computed by this module
                    tag.activation = tag.activation or (opaque and out.is_floating_point())
        finally:
            self.busy = False


def _func_name(func: Callable) -> str:
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    module = getattr(func, "__module__", "") or ""
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return "Tensor." + qualname.split(".", 1)[1]
    if module.startswith("torch.nn.functional"):
        return f"F.{qualname}"
    return f"torch.{qualname.rpartition('.')[2]}"  # torch._VariableFunctionsClass.cat is torch.cat


def _call(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs)
    return model(example_inputs)


def record_functional_ops(model: nn.Module, example_inputs: Any) -> RuntimeRecord:
    """Run ``model`` once on ``example_inputs`` and record every candidate functional operation.

    Args:
        model: the (quantized) model; it is not changed.
        example_inputs: a tensor, a tuple of positional inputs or a dict of keyword inputs (one small batch).

    Returns:
        A :class:`RuntimeRecord`.

    Raises:
        Whatever the model raises on the input (the caller words it).
    """
    recorder = _Recorder(model)
    leaves = [t for t in tree_flatten(example_inputs)[0] if isinstance(t, torch.Tensor)]
    for tensor in leaves:
        recorder.tag_input(tensor)
    pre = nn.modules.module.register_module_forward_pre_hook(recorder.pre_hook)
    post = nn.modules.module.register_module_forward_hook(recorder.post_hook, always_call=True)
    try:
        with torch.no_grad(), recorder, shapes_mode(example_inputs):
            _call(model, example_inputs)
    finally:
        pre.remove()
        post.remove()
    record = recorder.record
    # a layer that also ran as a layer is quantized there; one that never ran is only used through its weight
    record.direct_weights = [use for use in record.direct_weights if use.layer not in record.called]
    record.ops = [dataclasses.replace(op, blocked=op.blocked or IN_SCAN) if site in recorder.scans else op
                  for op, site in zip(record.ops, recorder.sites)]
    inside = _attention_adds(record.ops)
    record.ops = [dataclasses.replace(op, facts=dataclasses.replace(op.facts, in_attention=True))
                  if i in inside else op for i, op in enumerate(record.ops)]
    return record


def _attention_adds(ops: list[RecordedOp]) -> set[int]:
    """Indices of the adds that belong to an attention's scores: an operand comes (through elementwise and
    shape steps) from a product of two activations (``q @ k^T + bias``), or the result goes into such an add
    or into an attention's ``attn_mask`` (a relative-position bias computed beforehand)."""
    products = {op.output for op in ops if op.kind == "matmul" and op.blocked is None
                and op.facts.activations and not op.facts.parameter}
    sinks = {op.mask for op in ops if op.kind == "attention" and op.mask is not None}
    inside: set[int] = set()
    for i, op in enumerate(ops):
        if op.kind == "add" and any(o.root in products for o in op.operands):
            inside.add(i)
            sinks.update(o.root for o in op.operands)
    for i in range(len(ops) - 1, -1, -1):  # backwards: a bias feeds a later add of the scores
        op = ops[i]
        if op.kind == "add" and op.output in sinks:
            inside.add(i)
            sinks.update(o.root for o in op.operands)
    return inside
