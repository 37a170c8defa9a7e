"""Which module each part of an engine layer's name comes from, whatever exporter wrote the ONNX file.

TensorRT names an engine layer after the ONNX nodes (and, for fused weights, the initializers) it was
built from. How those names lead to a module depends on the exporter:

* ``"module names"``: this workbench's export (``stem.0/Conv``) and TorchScript's scoped names
  (``/layer1/layer1.0/conv1/Conv``) carry the module path (:func:`workbench.export.naming.module_of_node_name`);
* ``"weight names"``: an older TorchScript export names its nodes without scope (``Conv_34``), but
  TensorRT puts the weight it folded into the layer's name (``layer1.0.conv2.weight + QuantizeLinear_32 +
  Conv_34``), and the weight's name is its module's path;
* ``"ONNX file"``: with the ONNX file the engine was built from (``--onnx FILE``), a node's module comes from
  its metadata, its scope, or the weight it reads (:func:`modules_of_onnx_nodes`);
* ``"fused block"``: a scope-less op fused with a module's op (``Add_36`` and ``Relu_37`` fused into
  ``layer1.0.conv2``) is the one module of its kind in that module's block (``layer1.0.add``, ``layer1.0.relu``);
* ``"layer type"``: a scope-less op whose kind only one module of the model has (``MaxPool_12`` -> ``maxpool``);
* ``"engine graph"``: a layer with no module of its own (a standalone ``QuantizeLinear_40``, a shuffle
  TensorRT added) belongs to the layer it feeds (a Quantize: that layer's input) or the one that feeds it.

:class:`NameResolver` holds what the project and the user gave and answers ``(module, how)`` per part.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from workbench.export.naming import QDQ_OPS, module_of_node_name, node_module

__all__ = ["MAPPED_BY", "NameResolver", "modules_of_onnx_nodes", "op_of_part", "read_onnx_names", "scopeless"]

# how a module was found, most direct first; the report counts engine layers per way
MAPPED_BY = ("module names", "weight names", "ONNX file", "fused block", "layer type", "engine graph")

_SUFFIX = re.compile(r"_\d+$")
_SCOPELESS = re.compile(r"^[A-Z][A-Za-z0-9]*_\d+$")            # TorchScript without scope: Conv_9, Add_36
_PARAMETER = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)\.(?:weight|bias)$")
# an ONNX op -> the module types (without a "Quant" prefix) that export to it
_OP_MODULES = {
    "Conv": ("Conv1d", "Conv2d", "Conv3d"),
    "ConvTranspose": ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"),
    "Gemm": ("Linear",), "MatMul": ("Linear", "MatMul"),
    "Add": ("Add",), "Concat": ("Concat",),
    "Relu": ("ReLU",), "Sigmoid": ("Sigmoid",), "Clip": ("ReLU6", "Hardtanh"),
    "BatchNormalization": ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"),
    "MaxPool": ("MaxPool1d", "MaxPool2d", "MaxPool3d"),
    "AveragePool": ("AvgPool1d", "AvgPool2d", "AvgPool3d"),
    "GlobalAveragePool": ("AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"),
    "ReduceMean": ("AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"),
    "GlobalMaxPool": ("AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d"),
}


def op_of_part(part: str) -> str:
    """``"layer1.0/Conv_1"`` -> ``"Conv"``; ``"Add_36"`` -> ``"Add"``; a weight name gives ""."""
    if _PARAMETER.match(part) and "/" not in part:
        return ""
    return _SUFFIX.sub("", part.rsplit("/", 1)[-1])


def scopeless(part: str) -> bool:
    """Whether ``part`` is a node name without scope, as older TorchScript exports wrote (``Conv_9``)."""
    return _SCOPELESS.match(part) is not None


def _type_matches(module_type: str, op: str) -> bool:
    return module_type.removeprefix("Quant") in _OP_MODULES.get(op, ())


@dataclass
class OnnxNames:
    """What an ONNX file says about its nodes: node name -> module, and the node names in graph order."""

    path: str
    modules: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def modules_of_onnx_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> module path, for every node of ``model`` whose module can be told.

    From the node's metadata or scope (:func:`workbench.export.naming.node_module`), else from the weight it
    reads (``Conv_9`` reading ``conv1.weight``, directly or through DequantizeLinear(QuantizeLinear(...)));
    a Quantize/Dequantize of a weight belongs to the weight's module, one of an activation to the layer its
    Dequantize feeds (it is that layer's input quantizer).
    """
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    initializers |= {node.output[0] for node in graph.node if node.op_type == "Constant" and node.output}
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def parameter_module(tensor: str, depth: int = 0) -> str | None:
        match = _PARAMETER.match(tensor)
        if match and tensor in initializers:
            return match["module"]
        node = producer.get(tensor)
        if node is None or depth > 3 or node.op_type not in QDQ_OPS + ("Clip", "Identity", "Cast", "Transpose"):
            return None
        return parameter_module(node.input[0], depth + 1) if node.input else None

    found: dict[str, str] = {}
    for node in graph.node:
        if not node.name:
            continue
        module = node_module(node)
        if module is None and node.op_type in QDQ_OPS + ("Clip",) and node.input:
            module = parameter_module(node.input[0])
        if module is None:
            module = next((m for m in map(parameter_module, node.input[1:]) if m is not None), None)
        if module is not None:
            found[node.name] = module
    # an activation's Quantize/Dequantize: the layer its Dequantize feeds
    for node in graph.node:
        if node.name in found or node.op_type != "QuantizeLinear":
            continue
        readers = [r for dq in consumers.get(node.output[0], []) for r in consumers.get(dq.output[0], [])
                   if dq.op_type in ("DequantizeLinear", "Clip")]
        modules = {found.get(r.name) for r in readers} - {None}
        if len(modules) == 1:
            module = modules.pop()
            found[node.name] = module
            for dq in consumers.get(node.output[0], []):
                found.setdefault(dq.name, module)
    return found


def read_onnx_names(path: str | Path) -> OnnxNames:
    """The node names and their modules of the ONNX file at ``path`` (its weights are not loaded).

    Raises:
        ValueError: the file is missing or not an ONNX model (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such ONNX file (--onnx takes the ONNX file the engine was built from).")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError, OSError, ...: all mean "not an ONNX model"
        raise ValueError(f"{path} is not an ONNX model ({type(error).__name__}: {error}); --onnx takes the ONNX "
                         "file the engine was built from.") from error
    if not model.graph.node:
        raise ValueError(f"{path} is an ONNX file without nodes; --onnx takes the ONNX file the engine was built "
                         "from.")
    return OnnxNames(str(path), modules_of_onnx_nodes(model), [node.name for node in model.graph.node])


class NameResolver:
    """Answers, for a part of an engine layer's name, the module it comes from and how that was found.

    Args:
        project_layers: the project's quantizable layers (in model order).
        module_types: every module path of the model (and the project's functional layers) -> its type;
            empty: any module path a name gives is taken as it is.
        onnx: what the ONNX file the engine was built from says (``--onnx``), if given.
        parts: every name part of the engine, so that an op kind found once in the engine and once in
            the model maps by type.
    """

    def __init__(self, project_layers: Mapping[str, bool], module_types: Mapping[str, str] | None = None,
                 onnx_names: OnnxNames | None = None, parts: Iterable[str] = ()) -> None:
        self.project_layers = project_layers
        self.module_types = dict(module_types or {})
        self.onnx = onnx_names
        # an op kind the engine holds once, and the model has one module of: map it by type
        ops: dict[str, set[str]] = {}
        for part in parts:
            if scopeless(part):
                ops.setdefault(op_of_part(part), set()).add(part)
        self._by_type: dict[str, str] = {}
        for op, names in ops.items():
            candidates = [m for m, t in self.module_types.items() if _type_matches(t, op)]
            if len(names) == 1 and len(candidates) == 1:
                self._by_type[next(iter(names))] = candidates[0]

    def known(self, module: str) -> str | None:
        """``module`` or its closest parent that the model has; None when the model has neither."""
        if not self.module_types:  # nothing known of the model: take the name's module as it is
            return module
        candidate = module
        while True:
            if candidate in self.project_layers or candidate in self.module_types:
                return candidate
            if "." not in candidate:
                return None
            candidate = candidate.rsplit(".", 1)[0]

    def direct(self, part: str) -> tuple[str | None, str | None]:
        """``(module, how)`` from the part alone (its name, the ONNX file or the model's types)."""
        module = module_of_node_name(part)
        if module is not None:
            if module == "":
                return "", "module names"
            known = self.known(module)
            return (known, "module names") if known is not None else (None, None)
        match = _PARAMETER.match(part)
        if match:
            known = self.known(match["module"])
            if known is not None and known == match["module"]:
                return known, "weight names"
        if self.onnx is not None and part in self.onnx.modules:
            known = self.known(self.onnx.modules[part])
            if known is not None:
                return known, "ONNX file"
        if part in self._by_type:
            return self._by_type[part], "layer type"
        return None, None

    def in_block(self, part: str, anchor: str) -> str | None:
        """The module of a scope-less op fused with module ``anchor``'s op: ``anchor`` itself when it is of
        the op's kind, else the one module of that kind in ``anchor``'s closest enclosing block."""
        op = op_of_part(part)
        if not op or op not in _OP_MODULES or not scopeless(part):
            return None
        if _type_matches(self.module_types.get(anchor, ""), op):
            return anchor
        block = anchor
        while "." in block:
            block = block.rsplit(".", 1)[0]
            children = [m for m, t in self.module_types.items()
                        if m.rpartition(".")[0] == block and _type_matches(t, op)]
            if len(children) == 1:
                return children[0]
            if children:
                return None
        return None

    def why_not(self, parts: list[str]) -> str:
        """Why no part of an engine layer's name led to a module, in words a user can act on."""
        if all(p.startswith("(Unnamed Layer") or "Unnamed Layer" in p or p.startswith(("copied_", "reshape_after_",
                                                                                          "unsqueeze_node_after_"))
               for p in parts):
            return "made by TensorRT (no ONNX node)"
        if any(scopeless(p) for p in parts):
            if self.onnx is None:
                return ("scope-less ONNX node names (an older TorchScript export): pass --onnx FILE, the ONNX file "
                        "the engine was built from")
            if not any(p in self.onnx.modules or p in self.onnx.order for p in parts):
                return f"its ONNX nodes are not in {self.onnx.path}: was the engine built from another ONNX file?"
            return f"{self.onnx.path} does not say which module its nodes come from (no scope, no weight)"
        named = [p for p in parts if module_of_node_name(p)]
        if named:
            return f"names modules this model does not have ({module_of_node_name(named[0])})"
        return "no module name in it"
