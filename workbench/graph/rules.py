"""TensorRT placement rules: which quantizers share a scale, and which residual operand stays float.

TensorRT fuses a quantized graph like ``trtexec --best`` only where the Q/DQ placement allows it:

``concat``
    A Concat of INT8 tensors needs no re-quantization only when its inputs and its output share one
    scale. QuantConcat already quantizes all inputs with one quantizer; this rule makes the input
    quantizers of the layers that read the concatenation's output, and of other layers reading the
    same inputs, the same quantizer (the reference's ``find_quantizer_pairs`` /
    ``apply_custom_rules_to_quantizer``, done on the traced graph instead of a temporary ONNX file).
``maxpool``
    A MaxPool runs in INT8 when the quantizers of its output's readers and of its input's readers match.
``residual``
    ``conv(+bn) + identity``: TensorRT fuses the add into the convolution when only the identity
    operand is quantized, so the quantizer of the operand that comes straight from a convolution (or
    convolution + batch norm) is disabled. When both operands do, the one computed later is fused.
``pins``
    Pairs of names the user wants to share a quantizer (quantizer names, or layer names meaning their
    input quantizer(s)).

How sharing works, and why it lasts: the members of a group become *one* TensorQuantizer object,
registered under every member's name (what the reference scripts do by assignment). Calibration
then feeds that one quantizer with every member's inputs, so the shared amax covers all of them and
a later recalibration keeps them shared. If the members already had an amax, the shared one gets the
largest, so the rule can run before or after calibration. A state_dict keeps one entry per name, all
equal; loading it into a model prepared the same way restores the sharing, and loading it into a
model without the rules still gives every member the same amax (export produces equal scales).
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn

from workbench.graph.functional import FunctionalQuantReport
from workbench.graph.runtime_ops import RecordedOp
from workbench.graph.trace import MAXPOOL_FUNCTIONS, TracedPiece, TraceFailure, trace_pieces
from workbench.plurals import agree, count_text
from workbench.quant.algorithms.snapshot import is_quantizing, quantizer_names
from workbench.quant.nn.modules.quant_ops import QuantAdd, QuantConcat
from workbench.quant.nn.modules.quant_rnn import QuantLSTM, QuantLSTMCell
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

logger = logging.getLogger(__name__)

__all__ = ["PlacementRules", "RuleApplication", "SharedGroup", "PlacementReport", "apply_placement_rules",
           "share_quantizers"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_MAXPOOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)


@dataclass
class PlacementRules:
    """Which rules to apply; each can be switched off on its own."""

    concat: bool = True
    maxpool: bool = True
    residual: bool = True
    pins: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class RuleApplication:
    """One place a rule applied."""

    rule: str                      # "concat", "maxpool", "residual" or "pin"
    anchor: str                    # the concat / maxpool / add node or the pinned pair
    major: str | None = None       # the quantizer the others now share
    members: tuple[str, ...] = ()  # quantizers made to share ``major`` (sharing rules)
    disabled: tuple[str, ...] = () # quantizers switched off (residual rule)
    kept: tuple[str, ...] = ()     # quantizers left on (residual rule)
    note: str = ""


@dataclass(frozen=True)
class SharedGroup:
    """Quantizers that are now one object."""

    major: str
    members: tuple[str, ...]       # every name of the shared quantizer, major first
    amax: float | None             # the shared amax, None before calibration
    rules: tuple[str, ...]         # the rules that put them together


@dataclass
class PlacementReport:
    """What :func:`apply_placement_rules` did."""

    rules: PlacementRules
    applications: list[RuleApplication] = field(default_factory=list)
    groups: list[SharedGroup] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # groups not shared, with the reason
    notes: list[str] = field(default_factory=list)
    failures: list[TraceFailure] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)

    def by_rule(self, rule: str) -> list[RuleApplication]:
        return [a for a in self.applications if a.rule == rule]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """``(major, member)`` pairs, as the reference's ``find_quantizer_pairs`` lists them."""
        return [(g.major, m) for g in self.groups for m in g.members[1:]]

    @property
    def disabled(self) -> list[str]:
        return [name for a in self.applications for name in a.disabled]

    def summary(self) -> str:
        counts = {rule: len(self.by_rule(rule)) for rule in ("concat", "maxpool", "residual", "pin")}
        placements = sum(counts.values())
        text = (f"{counts['concat']} concat, {counts['maxpool']} maxpool, {counts['residual']} residual and "
                f"{counts['pin']} pinned {agree(placements, 'placement', 'placements')}; "
                f"{count_text(len(self.groups), 'shared quantizer group')}; "
                f"{count_text(len(self.disabled), 'quantizer')} disabled for fusion")
        if self.conflicts:
            text += f"; {count_text(len(self.conflicts), 'group')} not shared: " + "; ".join(self.conflicts[:3])
        if self.failures:
            text += (f"; {count_text(len(self.failures), 'module')} could not be traced, rules do not see across them: "
                     + "; ".join(str(f) for f in self.failures[:3]))
        return text


@dataclass(frozen=True)
class _QRef:
    """A quantizer as one module's attribute: ``owner.attr``."""

    name: str
    owner: nn.Module
    attr: str

    @property
    def quantizer(self) -> TensorQuantizer:
        return getattr(self.owner, self.attr)


def _input_refs(piece: TracedPiece, node: fx.Node) -> list[tuple[fx.Node, _QRef]]:
    """``(operand, quantizer)`` for each input of ``node`` that a quantizer of the called module reads."""
    if node.op != "call_module":
        return []
    module = piece.module.get_submodule(str(node.target))
    base = piece.qualified(str(node.target))
    refs = []
    if isinstance(module, QuantAdd):
        for i in (0, 1):
            if i < len(node.args) and isinstance(node.args[i], fx.Node):
                refs.append((node.args[i], _QRef(f"{base}._input{i}_quantizer", module, f"_input{i}_quantizer")))
    elif isinstance(module, QuantConcat):
        tensors = node.args[0] if node.args else ()
        if isinstance(tensors, (list, tuple)):
            ref = _QRef(f"{base}._input_quantizer", module, "_input_quantizer")
            refs.extend((t, ref) for t in tensors if isinstance(t, fx.Node))
    elif isinstance(module, (QuantLSTM, QuantLSTMCell)):
        return []  # the quantizer reads cat([x_t, h_t]) inside the module, not the operand itself
    elif isinstance(module._modules.get("_input_quantizer"), TensorQuantizer):
        if node.args and isinstance(node.args[0], fx.Node):
            refs.append((node.args[0], _QRef(f"{base}._input_quantizer", module, "_input_quantizer")))
    return refs


class _Graph:
    """Quantizer readers of every node of one traced piece."""

    def __init__(self, piece: TracedPiece) -> None:
        self.piece = piece
        self.nodes = list(piece.graph_module.graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.readers: dict[fx.Node, list[tuple[fx.Node, _QRef]]] = {}
        for node in self.nodes:
            for operand, ref in _input_refs(piece, node):
                self.readers.setdefault(operand, []).append((node, ref))

    def module(self, node: fx.Node) -> nn.Module | None:
        if node.op != "call_module":
            return None
        return self.piece.module.get_submodule(str(node.target))

    def name(self, node: fx.Node) -> str:
        if node.op == "call_module":
            return self.piece.qualified(str(node.target))
        return self.piece.qualified(node.name)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.rank: dict[int, int] = {}  # lower wins the root: 0 concat quantizer, 1 other, by first seen
        self.seen: dict[int, int] = {}
        self.refs: dict[int, list[_QRef]] = {}
        self.rules: dict[int, set[str]] = {}

    def add(self, ref: _QRef, priority: int) -> int:
        key = id(ref.quantizer)
        if key not in self.parent:
            self.parent[key] = key
            self.rank[key] = priority
            self.seen[key] = len(self.seen)
            self.refs[key] = []
        else:
            self.rank[key] = min(self.rank[key], priority)
        if all(r.name != ref.name for r in self.refs[key]):
            self.refs[key].append(ref)
        return key

    def find(self, key: int) -> int:
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: int, b: int, rule: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if (self.rank[rb], self.seen[rb]) < (self.rank[ra], self.seen[ra]):
                ra, rb = rb, ra
            self.parent[rb] = ra
            self.rules.setdefault(ra, set()).update(self.rules.pop(rb, set()))
        self.rules.setdefault(ra, set()).add(rule)


def _is_conv_output(graph: _Graph, node: fx.Node) -> fx.Node | None:
    """The convolution node whose output ``node`` is (directly, or through a BatchNorm), if TensorRT
    can fuse an add into it (the output has no other reader)."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return None
    module = graph.module(node)
    if isinstance(module, _CONVS):
        return node
    # a BatchNorm folded into the convolution (workbench.graph.fold) is an nn.Identity under its old name
    if isinstance(module, _BATCHNORMS + (nn.Identity,)) and node.args and isinstance(node.args[0], fx.Node):
        conv = node.args[0]
        if isinstance(graph.module(conv), _CONVS) and len(conv.users) == 1:
            return conv
    return None


def _concat_operands(node: fx.Node) -> list[fx.Node]:
    """The tensors a QuantConcat node concatenates, as nodes of this piece.

    ``torch.cat(x, self.d)`` in a module whose ``forward(x)`` receives the list (YOLOv5/v8's ``Concat``,
    traced as its own piece because the model's loop over layers cannot be) has one placeholder Node as
    its first argument, not a list: the tensors are built by the caller, outside this graph, so only the
    concatenation's readers are seen here.
    """
    tensors = node.args[0] if node.args else node.kwargs.get("tensors", ())
    if isinstance(tensors, fx.Node):
        return []
    return [t for t in tensors if isinstance(t, fx.Node)] if isinstance(tensors, (list, tuple)) else []


def _is_maxpool(graph: _Graph, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(graph.module(node), _MAXPOOLS)
    return node.op == "call_function" and node.target in MAXPOOL_FUNCTIONS


def _reference_counts(model: nn.Module) -> dict[int, int]:
    """How many names each quantizer object is reachable under (more than one: shared)."""
    return dict(Counter(id(q) for q in quantizer_names(model).values()))


def _resolve_pin(model: nn.Module, name: str) -> list[_QRef]:
    owner_name, _, attr = name.rpartition(".")
    try:
        target = model.get_submodule(name)
    except AttributeError:
        target = None
    if isinstance(target, TensorQuantizer):
        owner = model.get_submodule(owner_name) if owner_name else model
        return [_QRef(name, owner, attr)]
    if target is not None:
        attrs = [a for a in ("_input_quantizer", "_input0_quantizer", "_input1_quantizer")
                 if isinstance(target._modules.get(a), TensorQuantizer)]
        if attrs:
            return [_QRef(f"{name}.{a}", target, a) for a in attrs]
        raise ValueError(f"Pinned name {name!r} is a {type(target).__name__} without an input quantizer; "
                         "pin quantizers (e.g. 'layer.conv._input_quantizer') or quantized layers.")
    raise ValueError(f"Pinned name {name!r} is neither a quantizer nor a layer of the model.")


def _compatible(quantizers: list[TensorQuantizer]) -> str | None:
    first = quantizers[0]
    for q in quantizers:
        if q.axis is not None:
            return "a member is per-channel"
        if (q.num_bits, q.unsigned, q.narrow_range) != (first.num_bits, first.unsigned, first.narrow_range):
            return "members differ in bits, signedness or range"
        if q.learn_amax:
            return "a member learns its amax"
    return None


def _merged_amax(quantizers: list[TensorQuantizer]) -> torch.Tensor | None:
    amaxes = [q.amax for q in quantizers if q.has_amax]
    amaxes = [a for a in amaxes if a.numel() == 1 and not torch.isnan(a).any()]
    if not amaxes:
        return None
    device = amaxes[0].device
    return torch.stack([a.detach().reshape(()).to(device).float() for a in amaxes]).max()


def share_quantizers(major: TensorQuantizer, refs: list[tuple[nn.Module, str]]) -> None:
    """Make every ``owner.attr`` in ``refs`` the ``major`` quantizer, whose amax becomes the group's max."""
    members = [major] + [getattr(owner, attr) for owner, attr in refs]
    amax = _merged_amax(members)
    if amax is not None:
        current = major.amax
        if current is not None:
            current.data.copy_(amax.reshape(current.shape).to(current.device))
        else:
            major.amax = amax
    for owner, attr in refs:
        setattr(owner, attr, major)


def apply_placement_rules(model: nn.Module, rules: PlacementRules | None = None, *,
                          runtime: FunctionalQuantReport | None = None) -> PlacementReport:
    """Apply TensorRT placement rules to a quantized model, in place.

    Run it after :func:`workbench.quant.replace_to_quantization_module` and
    :func:`workbench.graph.insert_functional_quantizers`, before or after calibration. The model is
    traced (with the same fallback as everywhere: a module that cannot be traced is reported and its
    children are traced instead); rules see data flow only within what traced.

    Args:
        model: the quantized model.
        rules: which rules to apply (default: all) and the user's pinned pairs.
        runtime: the functional rewrite's report; the concatenations it quantized at run time (in forwards
            torch.fx cannot trace) share their scale with the layers its recorded run saw reading their
            inputs and output, as the traced ones do.

    Returns:
        A :class:`PlacementReport` listing every application, every shared group and any conflict.

    Raises:
        ValueError: a pinned name is not a quantizer or a quantized layer of the model.
    """
    rules = rules or PlacementRules()
    report = PlacementReport(rules=rules)
    pins = [(_resolve_pin(model, a), _resolve_pin(model, b)) for a, b in rules.pins]  # fail before changing
    pieces, failures = trace_pieces(model)
    report.failures = failures
    report.pieces = [p.name or "<model>" for p in pieces]
    graphs = [_Graph(p) for p in pieces]
    references = _reference_counts(model)

    if rules.residual:
        for graph in graphs:
            _residual_rule(graph, references, report)

    groups = _UnionFind()

    def enabled(ref: _QRef) -> bool:
        return is_quantizing(ref.quantizer)

    def join(rule: str, anchor: str, major: _QRef, members: list[_QRef], priority: int) -> None:
        if not enabled(major):
            report.notes.append(f"{rule} {anchor}: {major.name} is disabled; rule not applied")
            return
        members = [m for m in members if m.name != major.name]
        skipped = [m.name for m in members if not enabled(m)]
        members = [m for m in members if enabled(m)]
        if not members:
            return
        root = groups.add(major, priority)
        for m in members:
            groups.union(root, groups.add(m, 1), rule)
        note = f"left alone (disabled): {', '.join(skipped)}" if skipped else ""
        report.applications.append(RuleApplication(rule, anchor, major.name, tuple(m.name for m in members),
                                                   note=note))

    for graph in graphs:
        for node in graph.nodes:
            module = graph.module(node)
            if rules.concat and isinstance(module, QuantConcat):
                major = _QRef(f"{graph.name(node)}._input_quantizer", module, "_input_quantizer")
                members = [ref for t in _concat_operands(node)
                           for reader, ref in graph.readers.get(t, []) if reader is not node]
                members += [ref for _reader, ref in graph.readers.get(node, [])]
                join("concat", graph.name(node), major, members, 0)
            elif rules.maxpool and _is_maxpool(graph, node):
                outputs = [ref for _reader, ref in graph.readers.get(node, [])]
                source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
                inputs = [ref for _reader, ref in graph.readers.get(source, [])] if source is not None else []
                candidates = [r for r in outputs + inputs if enabled(r)]
                if len(candidates) < 2:
                    continue
                join("maxpool", graph.name(node), candidates[0], candidates[1:], 1)

    if rules.concat and runtime is not None and runtime.record is not None:
        for anchor, major, members in _runtime_concats(model, runtime):
            # a traced concatenation already shares with the readers in its piece: add the others only
            known = {name for a in report.applications if a.anchor == anchor for name in a.members}
            join("concat", anchor, major, [m for m in members if m.name not in known], 0)

    for (a_refs, b_refs), (a_name, b_name) in zip(pins, rules.pins):
        join("pin", f"{a_name} <-> {b_name}", a_refs[0], a_refs[1:] + b_refs, 1)

    _materialize(groups, report)
    logger.info("Placement rules: %s", report.summary())
    return report


def _runtime_concats(model: nn.Module, functional: FunctionalQuantReport) -> list[tuple[str, _QRef, list[_QRef]]]:
    """``(anchor, concat quantizer, readers' input quantizers)`` for each concatenation quantized at run time:
    the layers the recorded run saw reading the concatenation's output, or one of its inputs."""
    readers: dict[int, list[str]] = {}
    for read in functional.record.reads:
        readers.setdefault(read.value, []).append(read.layer)

    def input_ref(layer: str) -> _QRef | None:
        try:
            module = model.get_submodule(layer)
        except AttributeError:
            return None
        quantizer = module._modules.get("_input_quantizer")
        return _QRef(f"{layer}._input_quantizer", module, "_input_quantizer") if isinstance(
            quantizer, TensorQuantizer) else None

    found = []
    for name, op in _recorded_concats(functional):
        module = model.get_submodule(name)
        major = _QRef(f"{name}._input_quantizer", module, "_input_quantizer")
        values = [operand.value for operand in op.operands] + [op.output]
        members = [ref for value in values for layer in dict.fromkeys(readers.get(value, []))
                   if (ref := input_ref(layer)) is not None]
        found.append((name, major, members))
    return found


def _recorded_concats(functional: FunctionalQuantReport) -> list[tuple[str, RecordedOp]]:
    """Each quantized concatenation with its recorded run: the run-time ones, and the traced ones whose
    module's recorded concatenations match them one for one (same count, same number of inputs), so that a
    concatenation traced in one piece still shares its scale with readers the trace of that piece cannot see."""
    pairs = [(item.name, item.op) for item in functional.runtime_ops if item.op.kind == "concat" and item.name]
    traced: dict[str, list] = {}
    for item in functional.inserted:
        if item.kind == "concat" and "found at run time" not in item.operation:
            traced.setdefault(item.owner, []).append(item)
    skipped = {s.owner for s in functional.skipped if s.operation.startswith("torch.cat")}
    for owner, items in traced.items():
        recorded = [op for op in functional.record.by_owner(owner) if op.kind == "concat"]
        if owner in skipped or len(recorded) != len(items):
            continue
        if all(item.num_inputs in (0, len(op.operands)) for item, op in zip(items, recorded)):
            pairs.extend((item.name, op) for item, op in zip(items, recorded))
    return pairs


def _residual_rule(graph: _Graph, references: dict[int, int], report: PlacementReport) -> None:
    for node in graph.nodes:
        module = graph.module(node)
        if not isinstance(module, QuantAdd) or len(node.args) < 2:
            continue
        name = graph.name(node)
        convs = [_is_conv_output(graph, node.args[i]) for i in (0, 1)]
        fused = [i for i in (0, 1) if convs[i] is not None]
        if not fused:
            report.notes.append(f"residual {name}: no operand comes straight from a convolution; both stay quantized")
            continue
        # the later convolution runs last, with the other operand ready: TensorRT fuses the add into it
        index = max(fused, key=lambda i: graph.order[convs[i]])
        attr = f"_input{index}_quantizer"
        quantizer = getattr(module, attr)
        quantizer_name = f"{name}.{attr}"
        other = f"{name}._input{1 - index}_quantizer"
        conv_name = graph.name(convs[index])
        if references.get(id(quantizer), 1) > 1:
            report.notes.append(f"residual {name}: {quantizer_name} is shared with other layers; left on")
            continue
        if not quantizer.is_enabled:
            report.applications.append(RuleApplication("residual", name, disabled=(quantizer_name,), kept=(other,),
                                                       note=f"already off; operand {index} comes from {conv_name}"))
            continue
        quantizer.disable()
        report.applications.append(RuleApplication(
            "residual", name, disabled=(quantizer_name,), kept=(other,),
            note=f"operand {index} comes from {conv_name}: the add fuses into that convolution"))


def _materialize(groups: _UnionFind, report: PlacementReport) -> None:
    members_of: dict[int, list[int]] = {}
    for key in groups.parent:
        members_of.setdefault(groups.find(key), []).append(key)
    for root, keys in sorted(members_of.items(), key=lambda item: groups.seen[item[0]]):
        refs = [ref for key in sorted(keys, key=lambda k: groups.seen[k]) for ref in groups.refs[key]]
        if len(refs) < 2:
            continue
        major_ref = groups.refs[root][0]
        major = major_ref.quantizer
        quantizers = [groups.refs[key][0].quantizer for key in keys]
        problem = _compatible(quantizers)
        rules = tuple(sorted(groups.rules.get(root, set())))
        names = [major_ref.name] + [r.name for r in refs if r.name != major_ref.name]
        if problem is not None:
            report.conflicts.append(f"{', '.join(names)}: {problem}")
            continue
        share_quantizers(major, [(r.owner, r.attr) for r in refs if r.quantizer is not major])
        amax = major.amax
        report.groups.append(SharedGroup(major_ref.name, tuple(names),
                                         None if amax is None else float(amax.reshape(-1)[0]), rules))
