"""The engine's layers mapped onto the model's modules, and what went wrong with the quantization.

Every engine layer name is split into the ONNX nodes it was built from (see
:func:`workbench.export.naming.split_engine_layer_name`); the export names those nodes after their
module (``stem.0/Conv``) and Q/DQ nodes after their quantizer, so each part maps to a module. For every
module the report gives the engine layer its computation ended in, the precision that layer ran in and
its time, and it flags the hazards (:data:`HAZARD_KINDS`) a deployment engineer acts on.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from workbench.engine.costs import EngineCost, boundary_costs
from workbench.engine.graph import EngineGraph, MappedLayer, MappedPart
from workbench.engine.hazards import (
    FLOAT_PRECISIONS,
    HAZARD_KINDS,
    EngineHazard,
    cost_hazards,
    layer_hazards,
    quantized_ran_float,
)
from workbench.engine.layers import EngineLayer, EngineReportError, load_engine_layers
from workbench.engine.mapping import MAPPED_BY, NameResolver, OnnxNames, op_of_part, read_onnx_names
from workbench.export.lint import COMMUTING_OPS, COMPUTE_OPS
from workbench.export.naming import QDQ_OPS

__all__ = ["HAZARD_KINDS", "ModuleOutcome", "EngineHazard", "EngineReport", "EngineMismatchError", "analyse_engine",
           "expand_regions", "import_engine_report"]

@dataclass
class ModuleOutcome:
    """What the engine did with one module."""

    module: str
    quantized: bool | None            # what the project asked (None: not a quantizable layer)
    engine_precision: str | None      # INT8 / FP16 / FP32 ...; None: not in the engine, or not reported
    engine_layer: str | None          # the engine layer its computation ended in
    time_ms: float | None             # that engine layer's average time per run
    time_share: float | None = None   # that engine layer's percent of the total
    precision_note: str | None = None  # what of an INT8 layer is not INT8 ("input 1 FP16, output FP16")
    mapped_by: str | None = None      # how its engine layer was found (workbench.engine.mapping.MAPPED_BY)

    @property
    def in_engine(self) -> bool:
        return self.engine_layer is not None


@dataclass
class EngineReport:
    """An imported engine report: per module outcomes and hazards; ``to_dict`` is the ``--json`` shape."""

    source: str
    profile: str | None
    detailed: bool
    engine_layers: int
    total_time_ms: float | None
    layers: list[ModuleOutcome] = field(default_factory=list)
    hazards: list[EngineHazard] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)   # engine layers no module could be found for
    unmapped_why: dict[str, str] = field(default_factory=dict)   # engine layer -> why not
    mapped_by: dict[str, int] = field(default_factory=dict)      # how -> engine layers mapped that way
    costs: list[EngineCost] = field(default_factory=list)        # conversion layers' time, by cause
    quantized_found: int | None = None     # the project's quantized layers found in the engine ...
    quantized_total: int | None = None     # ... out of these
    onnx: str | None = None                # the ONNX file names were looked up in (--onnx)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mapped_layers": self.mapped_layers}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineReport:
        values = dict(data)
        values.pop("mapped_layers", None)  # derived (engine_layers - unmapped)
        values["layers"] = [ModuleOutcome(**entry) for entry in values.get("layers", [])]
        values["hazards"] = [EngineHazard(**entry) for entry in values.get("hazards", [])]
        values["costs"] = [EngineCost(**entry) for entry in values.get("costs", [])]
        return cls(**values)

    @property
    def mapped_layers(self) -> int:
        return self.engine_layers - len(self.unmapped)

    def outcome(self, module: str) -> ModuleOutcome | None:
        return next((entry for entry in self.layers if entry.module == module), None)

    def precision_counts(self) -> dict[str, int]:
        """Quantizable layers per engine precision ("not in engine" for those it does not show)."""
        counts: dict[str, int] = {}
        for entry in self.layers:
            if entry.quantized is None:
                continue
            key = entry.engine_precision or ("not in engine" if not entry.in_engine else "unknown")
            counts[key] = counts.get(key, 0) + 1
        return counts

    def mapping_text(self) -> str:
        """"31 of 37 engine layers mapped to modules (21 by weight names, ...); 6 not: ..." for CLI and GUI."""
        ways = ", ".join(f"{n} by {how}" if how != "engine graph" else f"{n} through the engine graph"
                         for how, n in self.mapped_by.items() if n)
        text = (f"{self.mapped_layers} of {self.engine_layers} engine layers mapped to modules"
                + (f" ({ways})" if ways else ""))
        if not self.unmapped:
            return text + "."
        reasons: dict[str, list[str]] = {}
        for name in self.unmapped:
            reasons.setdefault(self.unmapped_why.get(name, "no module name in it"), []).append(name)
        parts = [f"{len(names)} {why} ({', '.join(_short(n) for n in names[:3])}{' ...' if len(names) > 3 else ''})"
                 for why, names in reasons.items()]
        return f"{text}; {len(self.unmapped)} not: " + "; ".join(parts) + "."

    def cost_lines(self) -> list[str]:
        """The conversion layers' time by cause, for the CLI and the GUI: the re-quantizing in total (when it
        has several causes) and per cause (indented), then the rest."""
        lines: list[str] = []
        requantize = [cost for cost in self.costs if cost.kind == "requantize"]
        if len(requantize) > 1 and all(cost.share is not None for cost in requantize):
            count = sum(len(cost.layers) for cost in requantize)
            lines.append(f"{sum(cost.share or 0.0 for cost in requantize):.1f}% of the run re-quantizes float tensors "
                         f"for INT8 layers ({count} Quantize layers):")
            lines.extend(f"  {cost.text(with_fix=False)}" for cost in requantize)
        else:
            lines.extend(cost.text(with_fix=False) for cost in requantize)
        lines.extend(cost.text(with_fix=False) for cost in self.costs if cost.kind != "requantize")
        return lines

    def text(self) -> str:
        lines = [f"Engine report {self.source}" + (f" with profile {self.profile}" if self.profile else "")
                 + f": {self.engine_layers} engine layers"
                 + (f", {self.total_time_ms:.3f} ms per run" if self.total_time_ms is not None else "")]
        if self.onnx:
            lines.append(f"  names looked up in {self.onnx}")
        lines.append("  " + self.mapping_text())
        if self.quantized_total:
            lines.append(f"  {self.quantized_found} of {self.quantized_total} quantized layers found in the engine")
        if not self.detailed:
            lines.append("  (layer names only: build with --profilingVerbosity=detailed to see precisions)")
        counts = ", ".join(f"{n} {k}" for k, n in self.precision_counts().items())
        if counts:
            lines.append(f"  quantizable layers: {counts}")
        width = max((len(e.module) for e in self.layers), default=6)
        for entry in self.layers:
            if entry.quantized is None:
                continue
            asked = "int8 " if entry.quantized else "float"
            ran = entry.engine_precision or ("-" if not entry.in_engine else "?")
            time = f"{entry.time_ms:8.4f} ms" if entry.time_ms is not None else " " * 11
            where = entry.engine_layer or "not found in the engine"
            note = f"  [{entry.precision_note}]" if entry.precision_note else ""
            lines.append(f"  {entry.module:<{width}}  asked {asked}  ran {ran:<5} {time}  {_short(where, 90)}{note}")
        if any(e.in_engine and e.engine_precision is None and e.quantized is not None for e in self.layers) \
                and self.detailed:
            lines.append("  (ran ?: inside a Myelin region, whose formats are given only at its edges)")
        if self.costs:
            lines.append("Where the run goes at the quantization's boundaries:")
            lines.extend("  " + line for line in self.cost_lines())
        if self.hazards:
            lines.append(f"{len(self.hazards)} hazard{'s' if len(self.hazards) != 1 else ''}:")
            for index, hazard in enumerate(self.hazards, start=1):
                lines.append(f"  {index}. [{hazard.kind}] {', '.join(hazard.modules) or '-'} in "
                             f"'{_short(hazard.engine_layer, 90)}': {hazard.advice}")
        else:
            lines.append("No hazards found.")
        return "\n".join(lines)


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[:limit - 3] + "..."


def _is_qdq(part: str) -> bool:
    tail = part.rsplit("/", 1)[-1]
    op = tail.split("_")[0]
    return op in QDQ_OPS + ("Clip",) and ("_quantizer" in part or "/" not in part and op != "Clip")


def _owner(module: str, layers: Mapping[str, bool]) -> str:
    """The project layer ``module`` belongs to (itself or its closest listed parent), else the module."""
    candidate = module
    while candidate:
        if candidate in layers:
            return candidate
        if "." not in candidate:
            break
        candidate = candidate.rsplit(".", 1)[0]
    return module


# How much of a module's arithmetic an ONNX op holds: a Linear exported as Transpose (of its weight) +
# MatMul + Add ran where its MatMul ran, not where TensorRT put the Transpose
_MAIN_OPS = COMPUTE_OPS | {"Einsum", "Attention", "LSTM", "GRU", "RNN"}
_DATA_OPS = COMMUTING_OPS | {"Shape", "Cast", "Constant", "Tile"}


def _weight(part: str, how: str | None) -> int:
    """2 for the op holding a module's main arithmetic (or the weight TensorRT folded into the layer), 0 for
    data movement, 1 for the rest."""
    if how == "weight names":
        return 2
    op = op_of_part(part)
    return 2 if op in _MAIN_OPS else 0 if op in _DATA_OPS else 1


def expand_regions(layers: list[EngineLayer], node_orders: Sequence[Sequence[str]]) -> list[EngineLayer]:
    """Layers whose name gives only a Myelin region's ends (``{ForeignNode[first...last]}``, TensorRT 8.6
    without ``Metadata``) get the ONNX nodes between the two in the exported graph's order, but for those
    another layer of the engine names (a parallel branch that TensorRT built outside the region).

    ``node_orders``: the node names in order (ONNX keeps nodes topologically sorted) of the graphs the engine
    may have been built from, most likely first; a region takes the first that holds both its ends.
    """
    indexes = [{name: position for position, name in enumerate(order)} for order in node_orders]
    claimed = {node for layer in layers if not _spans(layer) for node in layer.onnx_nodes}
    expanded = []
    for layer in layers:
        ends = layer.onnx_nodes
        found = next(((order, index) for order, index in zip(node_orders, indexes) if all(e in index for e in ends)),
                     None) if _spans(layer) else None
        if found is not None:
            order, index = found
            first, last = sorted(index[end] for end in ends)
            inside = [node for node in order[first:last + 1] if node in ends or node not in claimed]
            layer = replace(layer, onnx_nodes=inside)
        expanded.append(layer)
    return expanded


def _spans(layer: EngineLayer) -> bool:
    """Whether the layer's name gives a region by its first and last node only."""
    return (layer.is_region and not layer.nodes_listed and len(layer.onnx_nodes) == 2
            and re.search(r"ForeignNode\[[^\]]*\.\.\.", layer.name) is not None)


def _map_layers(layers: list[EngineLayer], project_layers: Mapping[str, bool], resolver: NameResolver,
                ) -> list[MappedLayer]:
    """Every engine layer with the modules its name parts lead to, then those with none through the graph."""
    mapped_layers: list[MappedLayer] = []
    for layer in layers:
        mapped = MappedLayer(layer)
        for part in layer.onnx_nodes:
            module, how = resolver.direct(part)
            owner = _owner(module, project_layers) if module else module
            mapped.parts.append(MappedPart(part, owner, how, _is_qdq(part), _weight(part, how)))
        anchor = mapped.main
        if anchor is not None:  # scope-less ops fused with a known module: the ones of their kind in its block
            for entry in mapped.parts:
                if entry.module is None:
                    module = resolver.in_block(entry.part, anchor)
                    if module is not None:
                        entry.module, entry.how = _owner(module, project_layers), "fused block"
                        entry.weight = _weight(entry.part, None)
        mapped_layers.append(mapped)
    graph = EngineGraph(mapped_layers)
    for _ in range(3):  # chains of layers without modules (reformat -> quantize -> ...) resolve in a few passes
        changed = False
        for index, mapped in enumerate(mapped_layers):
            # only a layer that computes nothing of the model (a Reformat, a standalone Quantize, a shuffle
            # TensorRT made) takes its neighbour's module: a convolution named Conv_3 is not its neighbour's
            if mapped.modules or not (mapped.data_only or mapped.quantizes or _made_by_tensorrt(mapped.layer)):
                continue
            if mapped.quantizes:  # a Quantize belongs to the layer it feeds: it quantizes that layer's input
                neighbours, role = graph.readers_of(index), "quantizes the input of"
            else:
                neighbours, role = graph.producers_of(index) or graph.readers_of(index), "follows"
            found = [m for n in neighbours for m in ([mapped_layers[n].main] if mapped_layers[n].main
                                                     else mapped_layers[n].modules)]
            if found:
                mapped.via_graph, mapped.graph_role, changed = list(dict.fromkeys(found)), role, True
        if not changed:
            break
    return mapped_layers


def _made_by_tensorrt(layer: EngineLayer) -> bool:
    return all("Unnamed Layer" in p or p.startswith(_TENSORRT_MADE) for p in layer.onnx_nodes)


_TENSORRT_MADE = ("copied_", "reshape_after_", "reshape_before_", "unsqueeze_node_after_", "squeeze_after_")


def analyse_engine(layers: list[EngineLayer], detailed: bool, project_layers: Mapping[str, bool], *,
                   source: str = "", profile: str | None = None, module_types: Mapping[str, str] | None = None,
                   onnx_names: OnnxNames | None = None) -> EngineReport:
    """Map engine layers to modules, read what precision each module ran in, and find the hazards and costs.

    Args:
        layers: the engine's layers (:func:`workbench.engine.load_engine_layers`).
        detailed: whether they carry formats (``--profilingVerbosity=detailed``).
        project_layers: every quantizable layer of the project, in model order, -> whether it is quantized.
        module_types: every module of the model (and functional layer of the project) -> its type, so that
            names of modules the model does not have are not taken, and scope-less names map by kind.
        onnx_names: the ONNX file the engine was built from (``--onnx``), to look node names up in.
    """
    resolver = NameResolver(project_layers, module_types, onnx_names,
                            parts=[part for layer in layers for part in layer.onnx_nodes])
    mapped_layers = _map_layers(layers, project_layers, resolver)
    graph = EngineGraph(mapped_layers)
    # module -> the engine layer holding its main op, ranked by the op's weight, then a layer of its own over a
    # Myelin region (whose inside is inferred)
    compute: dict[str, tuple[tuple[int, bool], MappedLayer]] = {}
    qdq_only: dict[str, MappedLayer] = {}    # module -> an engine layer holding only its Q/DQ
    order: dict[str, None] = {}  # modules in the order met (a dict: membership in O(1), thousands of layers)
    unmapped: list[str] = []
    why: dict[str, str] = {}
    ways: dict[str, int] = {how: 0 for how in MAPPED_BY}
    for mapped in mapped_layers:
        layer = mapped.layer
        if not mapped.modules:
            unmapped.append(layer.name)
            why[layer.name] = resolver.why_not(layer.onnx_nodes)
            continue
        ways[mapped.how or "engine graph"] += 1
        order.update(dict.fromkeys(mapped.modules))
        # a Reformat is named after the layer it feeds and computes nothing of it; a layer found through the
        # graph (a standalone Quantize) holds only the Q/DQ of the module it feeds
        for entry in mapped.parts:
            if entry.module is None:
                continue
            if entry.qdq or mapped.data_only:
                qdq_only.setdefault(entry.module, mapped)
                continue
            weight = (entry.weight, not layer.is_region)
            if entry.module not in compute or weight > compute[entry.module][0]:
                compute[entry.module] = (weight, mapped)
        for module in mapped.via_graph:
            qdq_only.setdefault(module, mapped)

    outcomes: list[ModuleOutcome] = []
    hazards: list[EngineHazard] = []
    # module "" is the top-level model's own forward (a flatten, say): no tree row to put it on
    for module in list(project_layers) + [m for m in order if m not in project_layers and m]:
        ran = compute[module][1] if module in compute else None
        mapped = ran or qdq_only.get(module)
        quantized = project_layers.get(module)
        precision, note = _module_precision(mapped, module) if mapped is not None else (None, None)
        layer = mapped.layer if mapped is not None else None
        outcomes.append(ModuleOutcome(module, quantized, precision, layer.name if layer is not None else None,
                                      layer.time_ms if layer is not None else None,
                                      layer.time_share if layer is not None else None, note,
                                      mapped.how if mapped is not None else None))
        if quantized and ran is not None and not ran.layer.is_region and precision in FLOAT_PRECISIONS:
            hazards.append(quantized_ran_float(module, ran, precision))
    for index in range(len(mapped_layers)):
        hazards.extend(layer_hazards(index, graph, detailed))
    total = sum(layer.time_ms for layer in layers if layer.time_ms is not None) if any(
        layer.time_ms is not None for layer in layers) else None
    costs = boundary_costs(graph, total) if detailed else []
    hazards.extend(cost_hazards(costs))
    expected = {m for m, q in project_layers.items() if q} or set(project_layers)
    found = sum(1 for o in outcomes if o.module in expected and o.in_engine)
    return EngineReport(source, profile, detailed, len(layers), total, outcomes, hazards, unmapped, why,
                        {how: n for how, n in ways.items() if n}, costs, found, len(expected),
                        onnx_names.path if onnx_names is not None else None)


def _module_precision(mapped: MappedLayer, module: str) -> tuple[str | None, str | None]:
    """The precision ``module`` ran in (from the inputs of its engine layer it reads) and, for an INT8 layer,
    which of the layer's inputs and outputs are not INT8."""
    layer = mapped.layer
    if layer.is_region:
        return None, None
    if mapped.data_only or module not in {p.module for p in mapped.parts if not p.qdq}:
        return layer.precision, None  # only its Quantize/Dequantize, a Reformat, or found through the graph
    indexes = mapped.inputs_of(module)
    precision = layer.precision_of_inputs(indexes)
    if precision == "INT8":
        others = layer.not_int8()
        return precision, ", ".join(others) or None
    floats = [f"input {i} {layer.inputs[i].precision}" for i in indexes
              if layer.inputs[i].precision not in ("INT8", None)]
    return precision, (", ".join(floats) if floats and "INT8" in layer.input_precisions else None)


class EngineMismatchError(EngineReportError):
    """The engine report is not of this project's model (too few of its quantized layers are in it)."""


def import_engine_report(layer_info: str, profile: str | None, project_layers: Mapping[str, bool],
                         node_orders: Sequence[Sequence[str]] = (), *, module_types: Mapping[str, str] | None = None,
                         onnx: str | None = None, force: bool = False) -> EngineReport:
    """Read trtexec's files and analyse them against the project's layers (the session's entry point).

    ``node_orders``: the node names of the ONNX graphs the engine may have been built from (newest export
    first), so that the inside of Myelin regions maps to modules too (:func:`expand_regions`). ``onnx``: the
    ONNX file the engine was built from, to look its node names up in (and its order first).

    Raises:
        EngineReportError: a file is not what it should be.
        EngineMismatchError: fewer than half of the project's quantized layers are found in the engine (it is
            another model's, or its names cannot be read without ``onnx``), unless ``force``.
    """
    layers, detailed = load_engine_layers(layer_info, profile)
    onnx_names = None
    if onnx is not None:
        try:
            onnx_names = read_onnx_names(onnx)
        except ValueError as error:
            raise EngineReportError(str(error)) from error
        node_orders = [onnx_names.order, *node_orders]
    if node_orders:
        layers = expand_regions(layers, node_orders)
    report = analyse_engine(layers, detailed, project_layers, source=str(layer_info),
                            profile=str(profile) if profile is not None else None, module_types=module_types,
                            onnx_names=onnx_names)
    found, total = report.quantized_found or 0, report.quantized_total or 0
    if total and found * 2 < total and not force:
        what = "quantized layers" if any(project_layers.values()) else "quantizable layers"
        examples = sorted(report.unmapped_why.items(), key=lambda item: item[0].startswith("Reformatting"))
        example = examples[0] if examples else None
        reason = f" Its names: {example[1]} (e.g. '{_short(example[0])}')." if example else ""
        how = ("" if onnx is not None or "--onnx" in reason else
               " If it is this model's engine, map its names with --onnx FILE (the ONNX file it was built from);")
        raise EngineMismatchError(
            f"{layer_info} does not look like an engine of this model: only {found} of the project's {total} {what} "
            f"were found among its {len(layers)} layers ({report.mapped_layers} mapped to modules).{reason}{how} "
            "--force reports it anyway. Nothing was stored.")
    return report
