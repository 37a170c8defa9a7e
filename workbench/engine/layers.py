"""Read what ``trtexec`` writes about an engine: its layers and, optionally, its per-layer profile.

Layer information (``trtexec --exportLayerInfo=layers.json``):

* built with ``--profilingVerbosity=detailed``: ``{"Layers": [{"Name", "LayerType", "Inputs": [{"Name",
  "Dimensions", "Format/Datatype"}], "Outputs": [...], "ParameterType", ..., "Metadata"}], "Bindings": [...]}``.
  ``Format/Datatype`` is a sentence such as "Thirty-two wide channel vectorized row major Int8 format."
  (TensorRT 8) or a type name such as "Half" (TensorRT 10 kernel generators). TensorRT 8.6+ adds
  ``Metadata``: the ONNX node names a layer was built from, as ``[ONNX Layer: name]`` records
  separated by the control characters 0x1E / 0x1F.
* the default verbosity (layer names only): ``{"Layers": ["name", ...], "Bindings": [...]}``, or a bare
  list of names.

Profile (``trtexec --exportProfile=profile.json``): a list whose first entry is ``{"count": N}`` (the
number of timed runs) and the rest ``{"name", "timeMs", "averageMs", "medianMs", "percentage"}``
(``medianMs`` from TensorRT 8.4 on); ``timeMs`` is the total over the runs, ``averageMs`` per run.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench import bounded_json
from workbench.export.naming import split_engine_layer_name

__all__ = ["PRECISIONS", "EngineReportError", "TensorInfo", "EngineLayer", "ProfileEntry", "precision_of_format",
           "read_layer_info", "read_profile", "load_engine_layers"]

# the precisions a layer can run in, most to least compact; the GUI colours and the CLI read this
PRECISIONS = ("INT8", "FP8", "FP16", "BF16", "FP32")

_FORMAT_WORDS = (  # checked in order: "BFloat16" before "Float", "UInt8" before "Int8"
    (r"bfloat16|bf16", "BF16"),
    (r"fp8|float8|e4m3", "FP8"),  # TensorRT 10 names FP8 tensors "FP8" or "Float8"
    (r"uint8", "UINT8"),
    (r"int8", "INT8"),
    (r"fp16|half", "FP16"),
    (r"fp32|float", "FP32"),
    (r"int32", "INT32"),
    (r"int64", "INT64"),
    (r"bool", "BOOL"),
)

LAYER_INFO_HINT = ("a JSON object with a \"Layers\" list, as `trtexec --exportLayerInfo=FILE "
                   "--profilingVerbosity=detailed` writes it (or a list of layer names)")
PROFILE_HINT = ("a JSON list whose first entry is {\"count\": N} and the rest {\"name\", \"timeMs\", \"averageMs\", "
                "\"percentage\"}, as `trtexec --exportProfile=FILE` writes it")


class EngineReportError(ValueError):
    """A file that is not the trtexec report it was given as; the message names the file and what was expected."""


@functools.lru_cache(maxsize=1024)  # an engine has a handful of formats, read again for every tensor of every layer
def precision_of_format(text: str | None) -> str | None:
    """``"Thirty-two wide channel vectorized row major Int8 format."`` -> ``"INT8"``; ``"Half"`` -> ``"FP16"``."""
    if not text:
        return None
    lowered = text.lower()
    for pattern, precision in _FORMAT_WORDS:
        if re.search(rf"(?<![a-z]){pattern}(?![a-z])", lowered):
            return precision
    return None


@dataclass
class TensorInfo:
    name: str
    dims: list[int] | None
    format: str | None

    @property
    def precision(self) -> str | None:
        return precision_of_format(self.format)


@dataclass
class ProfileEntry:
    name: str
    average_ms: float
    percentage: float | None


@dataclass
class EngineLayer:
    """One layer of the engine, with the ONNX nodes it was built from."""

    name: str
    onnx_nodes: list[str]
    layer_type: str | None = None       # "CaskConvolution", "Reformat", "Scale", "kgen", ...
    parameter_type: str | None = None   # "Convolution", "Reformat", "Scale", ...
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    time_ms: float | None = None        # average per run, from the profile
    time_share: float | None = None     # percent of the total, from the profile
    reads_input: bool = False           # one of its inputs is a network input (an engine binding)
    writes_output: bool = False         # one of its outputs is a network output (an engine binding)
    nodes_listed: bool = False          # onnx_nodes are TensorRT's own list (Metadata), not read from the name

    @property
    def kind(self) -> str:
        """The layer's kind as trex names it: ParameterType where given, else LayerType."""
        return self.parameter_type or self.layer_type or ""

    @property
    def is_region(self) -> bool:
        """A Myelin region (``{ForeignNode[...]}``): many ONNX nodes compiled together, whose formats are
        only those at the region's edges, so they say nothing of the precision of the layers inside."""
        return "ForeignNode[" in self.name or (self.layer_type or "").lower() == "myelin"

    @property
    def precision(self) -> str | None:
        """What the layer computes in, from every input: INT8 only when all its inputs are INT8, else the
        first floating-point input's precision (None: formats not reported).

        A fused ``conv + add`` layer reading ``[INT8, FP16]`` computes its add in FP16: it is not an INT8 layer.
        :meth:`precision_of_inputs` gives the precision of some of its inputs (one module's).
        """
        return self.precision_of_inputs(range(len(self.inputs)))

    def precision_of_inputs(self, indexes: Iterable[int]) -> str | None:
        """The precision of the inputs at ``indexes``: INT8 when all are INT8, else the first other one."""
        found = [self.inputs[i].precision for i in indexes if 0 <= i < len(self.inputs)]
        if not found or None in found:
            return None
        return next((p for p in found if p != "INT8"), "INT8")

    @property
    def output_precision(self) -> str | None:
        return self.outputs[0].precision if self.outputs else None

    @property
    def input_precisions(self) -> list[str | None]:
        return [tensor.precision for tensor in self.inputs]

    @property
    def output_precisions(self) -> list[str | None]:
        return [tensor.precision for tensor in self.outputs]

    def not_int8(self) -> list[str]:
        """Which inputs and outputs of an INT8 layer are not INT8 (``["input 1 FP16", "output FP16"]``); empty
        when none reads INT8 (a float layer is not mixed) or the formats are not reported."""
        if "INT8" not in self.input_precisions:
            return []
        several_out = len(self.outputs) > 1
        found = [f"input {i} {p}" for i, p in enumerate(self.input_precisions) if p not in ("INT8", None)]
        found += [f"output{f' {i}' if several_out else ''} {p}" for i, p in enumerate(self.output_precisions)
                  if p not in ("INT8", None)]
        return found

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _load_json(path: Path, what: str, hint: str) -> Any:
    if not path.is_file():
        raise EngineReportError(f"{path}: no such file (expected {hint}).")
    try:
        return bounded_json.read_json_file(path)
    except bounded_json.JSONTooLargeError as error:
        raise EngineReportError(f"{error}; nothing was read.") from error
    except (OSError, UnicodeDecodeError) as error:
        raise EngineReportError(f"{path} cannot be read as text ({error}); expected {hint}.") from error
    except json.JSONDecodeError as error:
        raise EngineReportError(f"{path} is not JSON (line {error.lineno}: {error.msg}); expected the {what}: "
                                f"{hint}.") from error


def _looks_like_profile(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "count" in data[0]


_OTHER_PROFILE = re.compile(r"\[profile +[1-9]\d*\]")
_METADATA = re.compile(r"\[ONNX Layer: (.*?)\](?=[\x1e\x1f+\[]|$)", re.S)


def _listed_nodes(metadata: Any) -> list[str]:
    """The ONNX nodes TensorRT lists in a layer's ``Metadata`` (TensorRT 8.6+), else none."""
    if isinstance(metadata, str):
        return [n.strip() for n in _METADATA.findall(metadata) if n.strip()]
    return []


def _tensors(values: Any, path: Path, layer: str, key: str) -> list[TensorInfo]:
    if values is None:
        return []
    if not isinstance(values, list):
        raise EngineReportError(f"{path}: layer {layer!r} has {key} of type {type(values).__name__}, expected a list "
                                "of tensors.")
    tensors = []
    for value in values:
        if isinstance(value, dict):
            dims = value.get("Dimensions")
            tensors.append(TensorInfo(str(value.get("Name", "")),
                                      [int(d) for d in dims] if isinstance(dims, list) else None,
                                      value.get("Format/Datatype")))
        elif isinstance(value, str):
            tensors.append(TensorInfo(value, None, None))
    return tensors


def read_layer_info(path: str | Path) -> tuple[list[EngineLayer], bool]:
    """The engine's layers from a ``--exportLayerInfo`` file, and whether it is the detailed form.

    Raises:
        EngineReportError: the file is missing, not JSON, or not layer information (a profile given
            in its place is recognised and named).
    """
    path = Path(path)
    data = _load_json(path, "engine's layer information", LAYER_INFO_HINT)
    if _looks_like_profile(data):
        raise EngineReportError(f"{path} is a trtexec profile (--exportProfile), not layer information; expected "
                                f"{LAYER_INFO_HINT}. Pass the profile with --profile.")
    if isinstance(data, dict):
        raw = data.get("Layers")
        if not isinstance(raw, list):
            keys = ", ".join(sorted(map(str, data))[:8]) or "none"
            raise EngineReportError(f"{path} has no \"Layers\" list (keys: {keys}); expected {LAYER_INFO_HINT}.")
    elif isinstance(data, list):
        raw = data
    else:
        raise EngineReportError(f"{path} holds a JSON {type(data).__name__}; expected {LAYER_INFO_HINT}.")
    bindings = {b for b in (data.get("Bindings") or []) if isinstance(b, str)} if isinstance(data, dict) else set()
    layers: list[EngineLayer] = []
    detailed = bool(raw) and all(isinstance(entry, dict) for entry in raw)
    for index, entry in enumerate(raw):
        entry_name = entry if isinstance(entry, str) else entry.get("Name") if isinstance(entry, dict) else None
        if isinstance(entry_name, str) and _OTHER_PROFILE.search(entry_name):
            continue  # an engine with several shape profiles repeats its layers per profile: keep the first
        if isinstance(entry, str):
            layers.append(EngineLayer(entry, split_engine_layer_name(entry)))
        elif isinstance(entry, dict) and isinstance(entry.get("Name"), str):
            name = entry["Name"]
            if entry.get("LayerType") in ("signal", "wait"):  # stream synchronisation, not computation
                continue
            listed = _listed_nodes(entry.get("Metadata"))
            layers.append(EngineLayer(
                name, listed or split_engine_layer_name(name), entry.get("LayerType"), entry.get("ParameterType"),
                _tensors(entry.get("Inputs"), path, name, "Inputs"),
                _tensors(entry.get("Outputs"), path, name, "Outputs")))
            layers[-1].reads_input = any(t.name in bindings for t in layers[-1].inputs)
            layers[-1].writes_output = any(t.name in bindings for t in layers[-1].outputs)
            layers[-1].nodes_listed = bool(listed)
        else:
            raise EngineReportError(f"{path}: entry {index} of \"Layers\" is {json.dumps(entry)[:80]}; expected a "
                                    "layer name or an object with a \"Name\".")
    if not layers:
        raise EngineReportError(f"{path} lists no layers; expected {LAYER_INFO_HINT}.")
    return layers, detailed


def read_profile(path: str | Path) -> dict[str, ProfileEntry]:
    """``{engine layer name: average time per run}`` from a ``--exportProfile`` file."""
    path = Path(path)
    data = _load_json(path, "engine's profile", PROFILE_HINT)
    if isinstance(data, dict) and "Layers" in data:
        raise EngineReportError(f"{path} is layer information (--exportLayerInfo), not a profile; expected "
                                f"{PROFILE_HINT}.")
    if not _looks_like_profile(data):
        raise EngineReportError(f"{path} is not a trtexec profile; expected {PROFILE_HINT}.")
    runs = data[0].get("count")
    entries: dict[str, ProfileEntry] = {}
    for index, record in enumerate(data[1:], start=1):
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            raise EngineReportError(f"{path}: entry {index} is {json.dumps(record)[:80]}; expected {PROFILE_HINT}.")
        average = record.get("averageMs")
        if average is None and record.get("timeMs") is not None and runs:
            average = float(record["timeMs"]) / float(runs)
        if not isinstance(average, (int, float)):
            raise EngineReportError(f"{path}: layer {record['name']!r} has no averageMs/timeMs time; expected "
                                    f"{PROFILE_HINT}.")
        share = record.get("percentage")
        previous = entries.get(record["name"])
        if previous is not None:  # one layer run several times (loops) adds up
            average += previous.average_ms
            share = (share or 0.0) + (previous.percentage or 0.0)
        entries[record["name"]] = ProfileEntry(record["name"], float(average),
                                               float(share) if isinstance(share, (int, float)) else None)
    return entries


def load_engine_layers(layer_info: str | Path, profile: str | Path | None = None) -> tuple[list[EngineLayer], bool]:
    """The engine's layers with their times (when a profile is given), and whether the info is detailed.

    Raises:
        EngineReportError: a file is not what it should be, or the profile names layers the layer
            information does not have (the two files come from different engines).
    """
    layers, detailed = read_layer_info(layer_info)
    if profile is not None:
        times = read_profile(profile)
        by_name = {layer.name: layer for layer in layers}
        unknown = [name for name in times if name not in by_name]
        if unknown and len(unknown) == len(times):
            raise EngineReportError(f"{profile} times layers that {layer_info} does not have ({', '.join(unknown[:3])}"
                                    "...): the two files come from different engines.")
        for name, entry in times.items():
            layer = by_name.get(name)
            if layer is not None:
                layer.time_ms = entry.average_ms
                layer.time_share = entry.percentage
    return layers, detailed
