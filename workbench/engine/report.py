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

from workbench.engine.layers import EngineLayer, load_engine_layers
from workbench.export.lint import COMMUTING_OPS, COMPUTE_OPS
from workbench.export.naming import QDQ_OPS, module_of_node_name
from workbench.quant.tensorrt_rules import INT8_CHANNEL_ALIGNMENT, misaligned_channels

__all__ = ["HAZARD_KINDS", "ModuleOutcome", "EngineHazard", "EngineReport", "analyse_engine", "expand_regions",
           "import_engine_report"]

# one vocabulary for the CLI, the GUI and the JSON: kind -> what it means
HAZARD_KINDS = {
    "quantized_not_int8": "a layer the project quantizes ran in floating point",
    "unfused_qdq": "a Quantize/Dequantize left as a standalone Scale layer",
    "int8_reformat": "a Reformat layer converting between INT8 and floating point",
    "misaligned_int8_conv": f"an INT8 convolution whose channel counts are not multiples of {INT8_CHANNEL_ALIGNMENT}",
}

_FLOAT = ("FP32", "FP16", "BF16")


@dataclass
class ModuleOutcome:
    """What the engine did with one module."""

    module: str
    quantized: bool | None            # what the project asked (None: not a quantizable layer)
    engine_precision: str | None      # INT8 / FP16 / FP32 ...; None: not in the engine, or not reported
    engine_layer: str | None          # the engine layer its computation ended in
    time_ms: float | None             # that engine layer's average time per run
    time_share: float | None = None   # that engine layer's percent of the total

    @property
    def in_engine(self) -> bool:
        return self.engine_layer is not None


@dataclass
class EngineHazard:
    kind: str
    modules: list[str]
    engine_layer: str
    advice: str


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineReport:
        values = dict(data)
        values["layers"] = [ModuleOutcome(**entry) for entry in values.get("layers", [])]
        values["hazards"] = [EngineHazard(**entry) for entry in values.get("hazards", [])]
        return cls(**values)

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

    def text(self) -> str:
        lines = [f"Engine report {self.source}" + (f" with profile {self.profile}" if self.profile else "")
                 + f": {self.engine_layers} engine layers"
                 + (f", {self.total_time_ms:.3f} ms per run" if self.total_time_ms is not None else "")]
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
            lines.append(f"  {entry.module:<{width}}  asked {asked}  ran {ran:<5} {time}  "
                         f"{entry.engine_layer or 'not in engine'}")
        if any(e.in_engine and e.engine_precision is None and e.quantized is not None for e in self.layers) \
                and self.detailed:
            lines.append("  (ran ?: inside a Myelin region, whose formats are given only at its edges)")
        if self.hazards:
            lines.append(f"{len(self.hazards)} hazards:")
            for index, hazard in enumerate(self.hazards, start=1):
                lines.append(f"  {index}. [{hazard.kind}] {', '.join(hazard.modules) or '-'} in "
                             f"'{hazard.engine_layer}': {hazard.advice}")
        else:
            lines.append("No hazards found.")
        if self.unmapped:
            lines.append(f"{len(self.unmapped)} engine layers map to no module: " + ", ".join(self.unmapped[:5])
                         + (" ..." if len(self.unmapped) > 5 else ""))
        return "\n".join(lines)


def _is_qdq(part: str) -> bool:
    tail = part.rsplit("/", 1)[-1]
    return tail.split("_")[0] in QDQ_OPS + ("Clip",) and "_quantizer" in part


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


def _weight(part: str) -> int:
    """2 for the op holding a module's main arithmetic, 0 for data movement, 1 for the rest."""
    op = re.sub(r"_\d+$", "", part.rsplit("/", 1)[-1])
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


def _channels(layer: EngineLayer) -> tuple[int, int] | None:
    if not layer.inputs or not layer.outputs:
        return None
    dims_in, dims_out = layer.inputs[0].dims, layer.outputs[0].dims
    if not dims_in or not dims_out or len(dims_in) < 3 or len(dims_out) < 3:
        return None
    return dims_in[1], dims_out[1]


def analyse_engine(layers: list[EngineLayer], detailed: bool, project_layers: Mapping[str, bool], *,
                   source: str = "", profile: str | None = None) -> EngineReport:
    """Map engine layers to modules and find the hazards.

    Args:
        layers: the engine's layers (:func:`workbench.engine.load_engine_layers`).
        detailed: whether they carry formats (``--profilingVerbosity=detailed``).
        project_layers: every quantizable layer of the project, in model order, -> whether it is quantized.
    """
    # module -> the engine layer holding its main op, ranked by the op's weight, then a layer of its own over a
    # Myelin region (whose inside is inferred)
    compute: dict[str, tuple[tuple[int, bool], EngineLayer]] = {}
    qdq_only: dict[str, EngineLayer] = {}    # module -> an engine layer holding only its Q/DQ
    order: list[str] = []
    unmapped: list[str] = []
    hazards: list[EngineHazard] = []
    for layer in layers:
        reformat = "reformat" in layer.kind.lower()  # named after the layer it feeds, computes nothing of it
        found = False
        qdq_modules: list[str] = []
        all_qdq = True
        for part in layer.onnx_nodes:
            module = module_of_node_name(part)
            if module is None:
                all_qdq = False
                continue
            found = True
            owner = _owner(module, project_layers)
            if owner not in order:
                order.append(owner)
            if _is_qdq(part):
                qdq_modules.append(owner)
                qdq_only.setdefault(owner, layer)
            else:
                all_qdq = False
                weight = (_weight(part), not layer.is_region)
                if not reformat and (owner not in compute or weight > compute[owner][0]):
                    compute[owner] = (weight, layer)
        if not found:
            unmapped.append(layer.name)
        hazards.extend(_layer_hazards(layer, qdq_modules, all_qdq and bool(qdq_modules), detailed, project_layers))

    outcomes: list[ModuleOutcome] = []
    # module "" is the top-level model's own forward (a flatten, say): no tree row to put it on
    for module in list(project_layers) + [m for m in order if m not in project_layers and m]:
        ran = compute[module][1] if module in compute else None
        layer = ran or qdq_only.get(module)
        quantized = project_layers.get(module)
        precision = layer.precision if layer is not None and not layer.is_region else None
        outcome = ModuleOutcome(module, quantized, precision,
                                layer.name if layer is not None else None,
                                layer.time_ms if layer is not None else None,
                                layer.time_share if layer is not None else None)
        outcomes.append(outcome)
        if quantized and ran is not None and not ran.is_region and ran.precision in _FLOAT:
            hazards.append(EngineHazard(
                "quantized_not_int8", [module], ran.name,
                f"TensorRT ran {module} in {ran.precision} although the project quantizes it: check that the engine "
                "was built with INT8 allowed (--int8, --best or --stronglyTyped) and that the layer's input and weight "
                "have Q/DQ (`workbench lint`); if INT8 is slower here, leave the layer in float."))
    total = sum(layer.time_ms for layer in layers if layer.time_ms is not None) if any(
        layer.time_ms is not None for layer in layers) else None
    return EngineReport(source, profile, detailed, len(layers), total, outcomes, hazards, unmapped)


def _layer_hazards(layer: EngineLayer, qdq_modules: list[str], only_qdq: bool, detailed: bool,
                   project_layers: Mapping[str, bool]) -> list[EngineHazard]:
    found: list[EngineHazard] = []
    kind = layer.kind.lower()
    mapped = (module_of_node_name(part) for part in layer.onnx_nodes)
    modules = list(dict.fromkeys(qdq_modules or [_owner(m, project_layers) for m in mapped if m is not None]))
    precision_in, precision_out = layer.precision, layer.output_precision
    int8_in, int8_out = precision_in == "INT8", precision_out == "INT8"
    if "reformat" in kind:
        if int8_in != int8_out and None not in (precision_in, precision_out):
            found.append(EngineHazard(
                "int8_reformat", modules, layer.name,
                f"TensorRT converts {precision_in} to {precision_out} here: an INT8 tensor meets a float layer. "
                "Quantize the float neighbour too, or leave the INT8 one in float, so both sides agree."))
        return found
    # a Quantize of the network input is needed (the first layer's input arrives in float)
    quantizes_input = layer.reads_input and int8_out and not int8_in
    # without formats, only a layer of nothing but Dequantize nodes is surely standalone
    plain_dq = not detailed and only_qdq and all("DequantizeLinear" in part for part in layer.onnx_nodes
                                                 if module_of_node_name(part) is not None)
    if plain_dq or (detailed and (only_qdq or "scale" in kind) and not quantizes_input and int8_in != int8_out):
        role = "Dequantize" if int8_in else "Quantize" if int8_out else "Quantize/Dequantize"
        found.append(EngineHazard(
            "unfused_qdq", modules, layer.name,
            f"a standalone {role} costs a pass over the tensor without INT8 compute: its neighbour has no INT8 "
            "kernel, or the scales around it differ. `workbench lint` names the fix (share the scale, or leave "
            "the layer in float)."))
    if int8_in and ("convolution" in kind or "deconvolution" in kind):
        channels = _channels(layer)
        why = misaligned_channels(*channels) if channels is not None else None
        if why is not None:
            found.append(EngineHazard(
                "misaligned_int8_conv", modules, layer.name,
                f"{why}. Round the channel counts up, or leave a small layer in float."))
    return found


def import_engine_report(layer_info: str, profile: str | None, project_layers: Mapping[str, bool],
                         node_orders: Sequence[Sequence[str]] = ()) -> EngineReport:
    """Read trtexec's files and analyse them against the project's layers (the session's entry point).

    ``node_orders``: the node names of the ONNX graphs the engine may have been built from (newest export
    first), so that the inside of Myelin regions maps to modules too (:func:`expand_regions`).
    """
    layers, detailed = load_engine_layers(layer_info, profile)
    if node_orders:
        layers = expand_regions(layers, node_orders)
    return analyse_engine(layers, detailed, project_layers, source=str(layer_info),
                          profile=str(profile) if profile is not None else None)
