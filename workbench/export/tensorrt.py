"""TensorRT side files: the amax table as JSON, an implicit-quantization calibration cache, and the
float graph that cache belongs to.

A TensorRT calibration cache is text: a header ``TRT-<version>-EntropyCalibration2`` and one line per
tensor, ``<tensor name>: <scale>`` where the scale (``amax / 127``, TensorRT's symmetric INT8) is
written as the 8 hex digits of its IEEE float32 bits, big-endian (``1.0`` is ``3f800000``). The
version is TensorRT's ``NV_TENSORRT_VERSION`` (8.6.1: ``8601``; 10.x: ``major*10000 + minor*100 +
patch``); TensorRT skips calibration only when the header matches the version and calibrator it runs.

The names are the ONNX tensor names at the inputs of the exported activation Q nodes. TensorRT uses
a cache only in implicit quantization, that is when building a graph *without* Q/DQ nodes:
:func:`strip_qdq` removes them from the exported graph and keeps every tensor name, so the stripped
model and the cache go together.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import onnx
from onnx import numpy_helper

__all__ = ["calibration_cache_text", "scale_hex", "activation_scales", "strip_qdq", "write_text_atomic",
           "DEFAULT_TRT_VERSION"]

DEFAULT_TRT_VERSION = 8601  # TensorRT 8.6.1, the last release line whose parser stops at opset 17


def scale_hex(scale: float) -> str:
    """The 8 hex digits TensorRT writes for a float32 scale."""
    return struct.pack(">f", float(scale)).hex()


def calibration_cache_text(scales: Mapping[str, float], trt_version: int = DEFAULT_TRT_VERSION,
                           algorithm: str = "EntropyCalibration2") -> str:
    """The text of a calibration cache for ``{tensor name: scale}``."""
    if not isinstance(trt_version, int) or trt_version <= 0:
        raise ValueError(f"trt_version must be a positive integer such as 8601, got {trt_version!r}.")
    lines = [f"TRT-{trt_version}-{algorithm}"]
    lines += [f"{name}: {scale_hex(scale)}" for name, scale in scales.items()]
    return "\n".join(lines) + "\n"


def _initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {init.name: init for init in graph.initializer}


def activation_scales(model: onnx.ModelProto, amax_by_scale: Mapping[str, float]) -> dict[str, float]:
    """``{activation tensor name: amax / 127}`` for each per-tensor activation QuantizeLinear.

    ``amax_by_scale`` maps a Q node's scale initializer name to its quantizer's amax, so that
    unsigned quantizers (scale ``amax / 255`` in the graph) get TensorRT's signed ``amax / 127``.
    Weight quantizers (Q of an initializer) are left out: TensorRT computes weight scales itself.
    """
    inits = _initializers(model.graph)
    scales: dict[str, float] = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in inits:
            continue
        scale_name = node.input[1]
        if scale_name in amax_by_scale:
            scales.setdefault(node.input[0], float(amax_by_scale[scale_name]) / 127.0)
            continue
        init = inits.get(scale_name)
        if init is not None and init.data_location != onnx.TensorProto.EXTERNAL and \
                numpy_helper.to_array(init).size == 1:
            scales.setdefault(node.input[0], float(numpy_helper.to_array(init).reshape(())))
    return scales


def strip_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without QuantizeLinear / Clip / DequantizeLinear chains, tensor names kept.

    Every reader of a DequantizeLinear output reads the QuantizeLinear's input instead; a graph
    output that was a DQ output gets an Identity so that output names do not change.
    """
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    graph = stripped.graph
    producers = {out: node for node in graph.node for out in node.output}
    replace: dict[str, str] = {}
    drop: set[int] = set()
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        chain = [node]
        source = producers.get(node.input[0])
        if source is not None and source.op_type == "Clip":
            chain.append(source)
            source = producers.get(source.input[0])
        if source is None or source.op_type != "QuantizeLinear":
            continue
        chain.append(source)
        replace[node.output[0]] = source.input[0]
        drop.update(id(n) for n in chain)
    outputs = {o.name for o in graph.output}
    kept = [n for n in graph.node if id(n) not in drop]
    for node in kept:
        for i, name in enumerate(node.input):
            if name in replace:
                node.input[i] = replace[name]
    extra = [onnx.helper.make_node("Identity", [replace[name]], [name], name=f"{name}/identity")
             for name in outputs if name in replace]
    del graph.node[:]
    graph.node.extend(kept + extra)
    used = {name for node in graph.node for name in node.input}
    for init in list(graph.initializer):
        if init.name not in used:
            graph.initializer.remove(init)
    return stripped


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError:  # a full disk: no half-written file stays behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
