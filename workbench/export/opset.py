"""Convert an exported ONNX model to an older opset (TensorRT 8.x reads opset 17 at most).

torch's torch.export-based exporter writes opset 18 or newer. ``onnx.version_converter`` brings the
graph down, but leaves attributes that the older opset does not define when they were introduced
later (``ReduceMean``'s ``noop_with_empty_axes`` in 18, for example). Such an attribute is removed
when it holds its default value, which is exactly the older opset's behaviour; any other leftover is
an error, so a conversion never silently changes what the graph computes. The result is checked by
``onnx.checker`` and onnxruntime afterwards like every export.
"""
from __future__ import annotations

import onnx
from onnx import defs, helper, version_converter

# the bounds live in workbench.opsets (below the settings, which check them without loading the exporter)
from workbench.opsets import (  # noqa: F401 - re-exported for the exporter's modules
    DEFAULT_OPSET,
    FORMAT_OPSET,
    MIN_OPSET,
    TENSORRT_8_MAX_OPSET,
    check_opset,
    newest_opset,
    opset_bounds_text,
)

__all__ = ["MIN_OPSET", "DEFAULT_OPSET", "TENSORRT_8_MAX_OPSET", "FORMAT_OPSET", "newest_opset", "opset_bounds_text",
           "check_opset", "default_opset", "convert_opset"]


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset version for the default ONNX domain."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ValueError("The model imports no default-domain opset.")


def _schema(op_type: str, version: int, domain: str):
    try:
        return defs.get_schema(op_type, version, domain)
    except defs.SchemaError:
        return None


def _clean_graph(graph: onnx.GraphProto, source: int, target: int, notes: list[str]) -> None:
    for node in graph.node:
        domain = node.domain if node.domain not in ("ai.onnx",) else ""
        if domain == "":
            new_schema = _schema(node.op_type, target, domain)
            old_schema = _schema(node.op_type, source, domain)
            if new_schema is not None:
                for attribute in list(node.attribute):
                    if attribute.name in new_schema.attributes:
                        continue
                    old = old_schema.attributes.get(attribute.name) if old_schema is not None else None
                    if old is not None and old.default_value.name and (
                            helper.get_attribute_value(old.default_value) == helper.get_attribute_value(attribute)):
                        node.attribute.remove(attribute)
                        notes.append(f"{node.op_type}: removed {attribute.name} (default value, unknown to opset "
                                     f"{target})")
                        continue
                    raise ValueError(f"{node.op_type} node {node.name!r} uses {attribute.name}="
                                     f"{helper.get_attribute_value(attribute)!r}, which opset {target} cannot express")
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _clean_graph(attribute.g, source, target, notes)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    _clean_graph(sub, source, target, notes)


def convert_opset(model: onnx.ModelProto, target: int) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` converted to default-domain opset ``target``, and notes on what was adjusted.

    Raises:
        ValueError: the conversion is not possible without changing the computation (the message says
            which node), or onnx's converter failed.
    """
    source = default_opset(model)
    if source == target:
        return model, []
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as error:  # the C++ converter raises RuntimeError or onnx's own errors
        raise ValueError(f"onnx.version_converter could not convert opset {source} to {target}: {error}") from error
    notes: list[str] = []
    _clean_graph(converted.graph, source, target, notes)
    _keep_metadata(model.graph, converted.graph)
    return converted, notes


def _keep_metadata(source: onnx.GraphProto, converted: onnx.GraphProto) -> None:
    """Copy node ``metadata_props`` (module scopes, see :mod:`workbench.export.naming`), which the converter
    drops, back onto the nodes of the same name."""
    by_name = {node.name: node for node in source.node if node.name and node.metadata_props}
    for node in converted.node:
        original = by_name.get(node.name)
        if original is not None and not node.metadata_props:
            node.metadata_props.extend(original.metadata_props)
