"""ONNX node names after the PyTorch module they came from, so TensorRT's layer names map back.

TensorRT names each engine layer after the ONNX nodes it was built from (fused ones joined with
" + "). torch's exporters name compute nodes ``node_conv2d_2`` (torch.export-based) or
``/features/features.0/Conv`` (TorchScript), so an engine report says "node_conv2d_2 + node_relu_1
ran in FP32" and nobody can tell which layer that is. :func:`name_nodes_by_module` renames every
compute node ``<module path>/<OpType>`` (``stem.0/Conv``, ``blocks.0.attn/MatMul_1``; a node of the
top-level module's own forward is ``/<OpType>``) and records the module path in the node's
``metadata_props`` under :data:`MODULE_KEY`. Q/DQ (and their Clip) nodes keep their quantizer names.

Where the module path comes from, in order:

* ``workbench.module`` metadata (a graph that was named already keeps its names: the pass is stable);
* ``pkg.torch.onnx.name_scopes``, which torch's torch.export-based exporter writes on every node: the
  list of module paths from the root down, then the FX node's own name;
* a TorchScript-style name ``/a/a.b/Conv``: the last scope before the op is the module path.

A node with none of these (one the exporter or an optimiser made up) keeps its name.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only in annotations: the session names layers from quantizers without loading onnx
    import onnx

__all__ = ["MODULE_KEY", "QUANTIZER_KEY", "QDQ_OPS", "name_nodes_by_module", "node_module", "module_of_node_name",
           "tag_torchscript_modules",
           "layer_of_quantizer", "split_engine_layer_name", "module_of_engine_part"]

MODULE_KEY = "workbench.module"
QUANTIZER_KEY = "workbench.quantizer"
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
_TORCH_EXPORT_SCOPE = "_empty_nn_module_stack"
_SUFFIX = re.compile(r"_(\d+)$")
_QUANTIZER = re.compile(r"_quantizers?(\.\d+)?$")


def layer_of_quantizer(quantizer_name: str) -> tuple[str, str]:
    """``"conv1._input_quantizer"`` -> ``("conv1", "input")``; RNN quantizer lists map to their layer too."""
    parts = quantizer_name.split(".")
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        if part.endswith("_quantizer") or part.endswith("_quantizers"):
            role = "weight" if part.startswith("_weight") else "input"
            return ".".join(parts[:index]), role
    return ".".join(parts[:-1]), "input"


def _metadata(node: onnx.NodeProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in node.metadata_props}


def _set_metadata(node: onnx.NodeProto, key: str, value: str) -> None:
    for entry in node.metadata_props:
        if entry.key == key:
            entry.value = value
            return
    entry = node.metadata_props.add()
    entry.key, entry.value = key, value


def _quantizer_of(node: onnx.NodeProto) -> str | None:
    """The quantizer a Q/DQ/Clip node was named after by the export (``conv1._input_quantizer/QuantizeLinear``)."""
    if "/" not in node.name:
        return None
    head, tail = node.name.rsplit("/", 1)
    if _SUFFIX.sub("", tail) in QDQ_OPS + ("Clip",) and _QUANTIZER.search(head):
        return head
    return None


def module_of_node_name(name: str) -> str | None:
    """The module path in a node name written by this pass or by the TorchScript exporter, else None.

    ``"stem.0/Conv"`` -> ``"stem.0"``; ``"/features/features.0/Conv_1"`` -> ``"features.0"``;
    ``"/blocks/blocks.0/attn/Softmax"`` -> ``"blocks.0.attn"``;
    ``"/Reshape"`` -> ``""`` (the top-level module); ``"node_conv2d"`` -> None.
    Q/DQ names (``"conv1._input_quantizer/QuantizeLinear"``) give the quantizer's layer.
    """
    name = name.strip()
    if "/" not in name:
        return None
    head, tail = name.rsplit("/", 1)
    if not tail:
        return None
    op = _SUFFIX.sub("", tail)
    if op in QDQ_OPS + ("Clip",) and _QUANTIZER.search(head):
        return layer_of_quantizer(head)[0]
    if head.startswith("/"):  # TorchScript: "/blocks/blocks.0/attn/Op", one scope per module
        return _torchscript_module_path([s for s in head.split("/") if s])
    return head


def _torchscript_module_path(scopes: list[str], modules: set[str] | None = None) -> str:
    """The module path TorchScript's scopes stand for.

    Each scope is the module's path from its last non-numeric part on (torch.onnx's unqualified name):
    ``attn`` for ``blocks.0.attn``, ``blocks.0`` for ``blocks.0``, ``downsample.0`` for
    ``layer1.0.downsample.0``. A container that is never called (an ``nn.ModuleList``) has no scope of its
    own, so a scope's leading parts repeat the end of the path so far only where they overlap it:
    ``/encoder/layer.0/layer.0.0/Gemm`` is ``encoder.layer.0.0``.

    TorchScript names the scope of a module's second call ``relu_1``: with ``modules`` (the model's module
    paths), a scope whose path is no module but is one without that ``_N`` stands for that module.
    """
    path: list[str] = []
    for scope in scopes:
        atoms = scope.split(".")
        joined = _joined(path, atoms)
        if modules is not None and ".".join(joined) not in modules and _SUFFIX.search(atoms[-1]):
            called_again = _joined(path, atoms[:-1] + [_SUFFIX.sub("", atoms[-1])])
            if ".".join(called_again) in modules:
                joined = called_again
        path = joined
    return ".".join(path)


def _joined(path: list[str], atoms: list[str]) -> list[str]:
    overlap = next(j for j in range(len(atoms) - 1, -1, -1) if j == 0 or path[len(path) - j:] == atoms[:j])
    return path[:len(path) - overlap] + atoms


def tag_torchscript_modules(model: onnx.ModelProto, modules: Iterable[str], root: str = "") -> None:
    """Record in each compute node of a TorchScript graph the module it came from (:data:`MODULE_KEY`, which
    :func:`name_nodes_by_module` reads first), resolving the scopes against the traced module's paths
    (``modules``): a repeated call's scope (``relu_1``) is the module's, so both exporters name the second call
    of ``layer1.0.relu`` ``layer1.0.relu/Relu_1``; and ``root``, the attribute that holds the user's model in
    the traced wrapper, is taken off (``model.1`` of a wrapped ``nn.Sequential`` is its layer ``1``).

    Run it on the graph as TorchScript named it, before the wrapper's scope leaves the node names."""
    known = set(modules)
    prefix = root + "." if root else ""
    for node in model.graph.node:
        name = node.name.strip()
        if not name.startswith("/") or MODULE_KEY in _metadata(node) or QUANTIZER_KEY in _metadata(node):
            continue
        head = name.rsplit("/", 1)[0]
        module = _torchscript_module_path([s for s in head.split("/") if s], known)
        if _quantizer_of(node) is not None:
            # the quantizer whose stand-in wrote this Q/DQ (its scale may be another's equal one, shared)
            if module in known and module.startswith(prefix):
                _set_metadata(node, QUANTIZER_KEY, module[len(prefix):])
        elif module == root:
            _set_metadata(node, MODULE_KEY, "")
        elif module in known and module.startswith(prefix):
            _set_metadata(node, MODULE_KEY, module[len(prefix):])


def _scoped_module(node: onnx.NodeProto) -> str | None:
    """The innermost module in torch.export's ``name_scopes`` metadata, else None."""
    scopes = _metadata(node).get(_NAME_SCOPES)
    if not scopes:
        return None
    try:
        parsed = ast.literal_eval(scopes)
    except (ValueError, SyntaxError):
        return None
    # [root "", outer module, ..., innermost module, the FX node's own name]; torch.export puts a scope of
    # its own (``_empty_nn_module_stack_from_metadata_hook``) on shape computations it adds: not a module
    if isinstance(parsed, list) and all(isinstance(s, str) for s in parsed):
        parsed = [s for s in parsed if not s.startswith(_TORCH_EXPORT_SCOPE)]
        if len(parsed) >= 2:
            return parsed[-2]
    return None


def node_module(node: onnx.NodeProto) -> str | None:
    """The module path ``node`` came from, or None when the graph does not say."""
    metadata = _metadata(node)
    if MODULE_KEY in metadata:
        return metadata[MODULE_KEY]
    scoped = _scoped_module(node)
    if scoped is not None:
        return scoped
    return module_of_node_name(node.name)


def name_nodes_by_module(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rename compute nodes ``<module>/<OpType>[_N]`` and record the module in ``metadata_props``; in place.

    Names are unique within the graph and depend only on the graph (running the pass twice gives the
    same names). Q/DQ nodes and their Clip keep their quantizer names (a name the export took from a
    merged scale initializer is corrected from the node's scope) and get the quantizer and its layer as
    metadata. Returns ``model``.
    """
    graph = model.graph
    nodes = list(graph.node)
    plan: list[tuple[onnx.NodeProto, str]] = []
    keep: set[str] = set()
    qdq_plan: list[tuple[onnx.NodeProto, str]] = []
    for node in nodes:
        quantizer = _quantizer_of(node)
        if node.op_type in QDQ_OPS + ("Clip",) and quantizer is not None:
            # the scope is the quantizer the node came from; a name given through a scale initializer can be
            # another quantizer's when the optimiser merged equal scales
            scoped = _metadata(node).get(QUANTIZER_KEY) or _scoped_module(node)
            if scoped is not None and _QUANTIZER.search(scoped) and scoped != quantizer:
                qdq_plan.append((node, scoped))
                quantizer = scoped
            else:
                keep.add(node.name)
            _set_metadata(node, QUANTIZER_KEY, quantizer)
            _set_metadata(node, MODULE_KEY, layer_of_quantizer(quantizer)[0])
            continue
        module = node_module(node)
        if module is None:
            if node.name:
                keep.add(node.name)
            continue
        plan.append((node, module))
    plan = qdq_plan + plan
    used = set(keep)
    counts: dict[str, int] = {}
    for node, module in plan:
        base = f"{module}/{node.op_type}"
        index = counts.get(base, 0)
        name = base if index == 0 else f"{base}_{index}"
        while name in used:
            index += 1
            name = f"{base}_{index}"
        counts[base] = index + 1
        used.add(name)
        node.name = name
        if node.op_type not in QDQ_OPS + ("Clip",) or _quantizer_of(node) is None:
            _set_metadata(node, MODULE_KEY, module)
    return model


# ----- engine layer names ------------------------------------------------------------------------

# TensorRT wraps the names of nodes it fused in these (trtexec, TensorRT 8.x and 10.x):
# "PWN(PWN(a, b), c)" pointwise fusions, "{ForeignNode[first...last]}" Myelin regions,
# "Reformatting CopyNode for Input Tensor 0 to <layer>" reformat layers it inserted.
_REFORMAT = re.compile(r"^Reformatting CopyNode for (?:Input|Output) Tensor \d+ to ")
_WRAPPERS = re.compile(r"PWN\(|\{ForeignNode\[|\]\}|\)")


def split_engine_layer_name(name: str) -> list[str]:
    """The ONNX node names in an engine layer's name: fused parts split on " + ", wrappers removed.

    A Myelin region ``{ForeignNode[a...b]}`` gives its first and last node; a layer TensorRT made up
    gives its own name. ``[profile N]`` suffixes of multi-profile engines are dropped.
    """
    text = re.sub(r"\s*\[profile \d+\]\s*$", "", name.strip())
    text = _REFORMAT.sub("", text)
    parts: list[str] = []
    for chunk in text.split(" + "):
        chunk = _WRAPPERS.sub(" ", chunk)
        for piece in re.split(r"\.\.\.|,\s*|\s{2,}", chunk):
            piece = piece.strip()
            if piece:
                parts.append(piece)
    return parts or [name]


def module_of_engine_part(part: str, modules: Iterable[str] | None = None) -> str | None:
    """The module an engine layer name part (an ONNX node name) belongs to.

    With ``modules`` (the model's module paths) the answer is the longest known module that is the
    part's module or contains it, so a part from a child the project does not list still maps to its
    layer; None when nothing fits.
    """
    module = module_of_node_name(part)
    if module is None:
        return None
    if modules is None:
        return module
    known = set(modules)
    candidate = module
    while True:
        if candidate in known:
            return candidate
        if "." not in candidate:
            return None
        candidate = candidate.rsplit(".", 1)[0]
