"""Passes over the exported graph's Q/DQ nodes: what the file must hold so that every runtime reads it as the
fake-quant model computes it, and what the report says about the quantizers.

* :func:`drop_constant_qdq`: a constant never gets a Q/DQ. A quantizer whose input is a ``ConstantOfShape``, or
  a constant expanded to a shape (DETR's zero queries, built at run time from an input's shape) saw one value during
  calibration; on zeros its amax is 0 and its scale ``2**100`` (1.27e30), a number TensorRT has to take as a
  dynamic range. Where Q/DQ gives back the constant itself (zero always does), the pair goes and the constant
  feeds its consumers directly: the same values, no scale.
* :func:`pin_propagated_qdq`: onnxruntime (1.32) cannot open some opset 21 Q/DQ graphs with its default
  optimizations: its QDQ propagation copies a Q/DQ pair past a Transpose, Reshape, Squeeze, Unsqueeze or MaxPool
  as a new QuantizeLinear with ``output_dtype=INT8`` (an attribute since opset 21), then its x86 int8-to-uint8
  conversion changes that node's zero point to uint8, and the session fails: "output_dtype INT8 does not match
  y_zero_point type UINT8". The file carries that copy itself (the same scale and zero point, so the same
  values: the data movement keeps every value on the grid), and onnxruntime has nothing left to propagate.
* :func:`quantizers_without_qdq`: the quantizers that ran in the reference pass and have no Q/DQ node in the
  graph, for the report to name.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from workbench.export.notes import ReportLog

__all__ = ["drop_constant_qdq", "pin_propagated_qdq", "quantizers_without_qdq", "prepare_qdq", "account_qdq",
           "PROPAGATED_OPS"]

# the operations onnxruntime's QDQPropagationTransformer moves a DequantizeLinear past
PROPAGATED_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "MaxPool")
# the first opset whose QuantizeLinear has ``output_dtype`` (what the propagated copy is written with)
OUTPUT_DTYPE_OPSET = 21


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _rename_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
    for output in graph.output:
        if output.name == old:  # a graph output keeps its name: an Identity carries the value there
            graph.node.append(helper.make_node("Identity", [new], [old], name=f"{old}/Identity"))


def _uniform_value(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto],
                   producers: dict[str, onnx.NodeProto]) -> np.ndarray | None:
    """The one value every element of ``node``'s output has, where the graph makes it from a constant whatever
    the inputs (``ConstantOfShape``; ``Expand`` or ``Tile`` of a constant whose elements are all equal: torch's
    ``zeros(x.shape[0], ...)``); else None."""
    if node.op_type == "ConstantOfShape":
        for attribute in node.attribute:
            if attribute.name == "value":
                return numpy_helper.to_array(attribute.t).reshape(-1)[:1]
        return np.zeros(1, dtype=np.float32)  # ConstantOfShape's default: a float 0
    if node.op_type not in ("Expand", "Tile") or not node.input:
        return None
    data: np.ndarray | None = None
    if node.input[0] in initializers:
        init = initializers[node.input[0]]
        if init.data_location == TensorProto.EXTERNAL or int(np.prod(init.dims)) > 4096:
            return None
        data = numpy_helper.to_array(init)
    elif node.input[0] in producers and producers[node.input[0]].op_type == "Constant":
        attribute = next((a for a in producers[node.input[0]].attribute if a.name == "value"), None)
        data = None if attribute is None else numpy_helper.to_array(attribute.t)
    if data is None or data.size == 0 or not np.issubdtype(data.dtype, np.floating):
        return None
    flat = data.reshape(-1)
    return flat[:1] if np.all(flat == flat[0]) else None


def _int_qdq(value: np.ndarray, scale: np.ndarray, zero: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    q = np.clip(np.rint(value.astype(np.float32) / scale) + zero, qmin, qmax)
    return ((q - zero) * scale).astype(np.float32)


def drop_constant_qdq(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str]) -> list[str]:
    """Remove the Q(/Clip)/DQ pairs on a ``ConstantOfShape`` whose value they give back unchanged (in place);
    one note per quantizer, naming it and the constant."""
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers = _consumers(graph)
    initializers = {init.name: init for init in graph.initializer}
    removed: list[onnx.NodeProto] = []
    notes: dict[str, str] = {}
    for q in list(graph.node):
        if q.op_type != "QuantizeLinear" or len(q.input) < 3:
            continue
        source = producers.get(q.input[0])
        value = None if source is None else _uniform_value(source, initializers, producers)
        if value is None:
            continue
        if q.input[1] not in initializers or q.input[2] not in initializers:
            continue
        zero_init = initializers[q.input[2]]
        if zero_init.data_type not in (TensorProto.INT8, TensorProto.UINT8):
            continue
        scale = numpy_helper.to_array(initializers[q.input[1]]).astype(np.float32)
        zero = numpy_helper.to_array(zero_init).astype(np.float32)
        if scale.size != 1:
            continue
        # the chain Q -> (Clip) -> DQ, each node read by the next alone
        chain, current = [q], q
        while True:
            after = consumers.get(current.output[0], [])
            if len(after) != 1 or after[0].op_type not in ("Clip", "DequantizeLinear"):
                chain = []
                break
            chain.append(after[0])
            current = after[0]
            if current.op_type == "DequantizeLinear":
                break
        if not chain:
            continue
        qmin, qmax = (0, 255) if zero_init.data_type == TensorProto.UINT8 else (-128, 127)
        if not np.array_equal(_int_qdq(value, scale.reshape(-1)[0], zero.reshape(-1)[0], qmin, qmax),
                              value.astype(np.float32)):
            continue  # Q/DQ changes the constant: the graph keeps computing what the model does
        removed.extend(chain)
        _rename_input(graph, chain[-1].output[0], q.input[0])
        quantizer = scale_to_quantizer.get(q.input[1], q.input[1].removesuffix(".scale"))
        notes[quantizer] = (f"{quantizer}: no Q/DQ on its input, the constant {source.name or source.output[0]} "
                            f"({source.op_type} of {value.reshape(-1)[0]:g}): Q/DQ gives it back unchanged, and a "
                            f"constant needs no scale (its calibrated one was {float(scale.reshape(-1)[0]):.3g})")
    if removed:
        ids = {id(node) for node in removed}
        kept = [node for node in graph.node if id(node) not in ids]
        del graph.node[:]
        graph.node.extend(kept)
        used = {name for node in graph.node for name in node.input}
        unused = [init for init in graph.initializer if init.name not in used]
        for init in unused:
            graph.initializer.remove(init)
    return list(notes.values())


def _opset(proto: onnx.ModelProto) -> int:
    return next((entry.version for entry in proto.opset_import if entry.domain in ("", "ai.onnx")), 0)


def pin_propagated_qdq(proto: onnx.ModelProto) -> int:
    """At opset 21 and later, repeat each integer per-tensor Q/DQ after the data movement onnxruntime would
    propagate it past (see the module docstring), in place; how many pairs were added."""
    if _opset(proto) < OUTPUT_DTYPE_OPSET:
        return 0
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    added = 0
    order = list(graph.node)
    position = {id(node): index for index, node in enumerate(order)}
    inserts: dict[int, list[onnx.NodeProto]] = {}
    consumers = _consumers(graph)
    pending = [node for node in order if node.op_type in PROPAGATED_OPS]
    names = {node.name for node in order}
    for node in pending:
        source = producers.get(node.input[0]) if node.input else None
        if source is None or source.op_type != "DequantizeLinear" or len(source.input) < 3:
            continue
        scale, zero = initializers.get(source.input[1]), initializers.get(source.input[2])
        if scale is None or zero is None or zero.data_type not in (TensorProto.INT8, TensorProto.UINT8):
            continue
        if int(np.prod(scale.dims)) != 1:
            continue  # per-channel: the axis moves with a Transpose; onnxruntime does not propagate those
        after = consumers.get(node.output[0], [])
        if not after or all(n.op_type == "QuantizeLinear" for n in after) or \
                any(output.name == node.output[0] for output in graph.output):
            continue  # already quantized after it, or a graph output (returned as the model computes it)
        value = node.output[0]
        quantized, restored = f"{value}/pinned_q", f"{value}/pinned_dq"
        base = f"{node.name or value}/pinned"
        q_name = base + "/QuantizeLinear" if base + "/QuantizeLinear" not in names else base + f"_{added}/Q"
        dq_name = base + "/DequantizeLinear" if base + "/DequantizeLinear" not in names else base + f"_{added}/DQ"
        pair = [helper.make_node("QuantizeLinear", [value, source.input[1], source.input[2]], [quantized],
                                 name=q_name),
                helper.make_node("DequantizeLinear", [quantized, source.input[1], source.input[2]], [restored],
                                 name=dq_name)]
        for consumer in after:
            for index, name in enumerate(consumer.input):
                if name == value:
                    consumer.input[index] = restored
        inserts.setdefault(position[id(node)], []).extend(pair)
        producers[restored] = pair[1]  # the next data movement (Transpose -> Reshape) finds a DQ before it too
        added += 1
    if inserts:
        rebuilt: list[onnx.NodeProto] = []
        for index, node in enumerate(order):
            rebuilt.append(node)
            rebuilt.extend(inserts.get(index, []))
        del graph.node[:]
        graph.node.extend(rebuilt)
    return added


def quantizers_without_qdq(proto: onnx.ModelProto, scales: dict[str, np.ndarray],
                           called: Iterable[str], base_dir: str = "") -> list[str]:
    """The quantizers in ``called`` (those that ran in the reference pass) with no Q/DQ node in the graph: no node
    reads their scale, nor a scale of the same value (equal scales may be merged into one initializer).
    ``base_dir``: where a streamed graph's external data lies (its scales may be there too)."""
    graph = proto.graph
    read = {node.input[1] for node in graph.node
            if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 1}
    initializers = {init.name: init for init in graph.initializer if init.name in read}
    values = [numpy_helper.to_array(init, base_dir).astype(np.float32) for init in initializers.values()]
    missing: list[str] = []
    for name in called:
        if f"{name}.scale" in read:
            continue
        scale = scales.get(name)
        if scale is not None and any(v.shape == scale.shape and np.array_equal(v, scale) for v in values):
            continue
        missing.append(name)
    return missing


def prepare_qdq(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str], log: ReportLog) -> None:
    """The passes above that change the graph, before its nodes are named and counted; each says what it did."""
    log.extend("constant_qdq", drop_constant_qdq(proto, scale_to_quantizer))
    pinned = pin_propagated_qdq(proto)
    if pinned:
        log.add("pinned_qdq", f"{pinned} Q/DQ pair(s) repeated after the Transpose/Reshape/Squeeze/Unsqueeze/"
                "MaxPool they feed (same scale, same values): onnxruntime's default optimizations otherwise copy "
                "them there as opset 21 QuantizeLinear nodes with output_dtype INT8 and then give those a uint8 "
                "zero point, and cannot open the file")


def account_qdq(proto: onnx.ModelProto, stand_ins: Iterable, calls: Mapping[str, int], log: ReportLog,
                base_dir: str = "") -> list[str]:
    """The quantizers that ran (``calls``) and have no Q/DQ in the file (:func:`quantizers_without_qdq`); a warning
    names those whose absence no note explains (a constant's is)."""
    scales = {s.quantizer_name: s.params.scale.detach().cpu().numpy().astype(np.float32) for s in stand_ins}
    missing = quantizers_without_qdq(proto, scales, [name for name, count in calls.items() if count], base_dir)
    explained = {entry.split(":", 1)[0] for entry in log.notes if log.kinds.get(entry) == "constant_qdq"}
    unexplained = [name for name in missing if name not in explained]
    if unexplained:
        log.add("quantizers_without_qdq", f"{len(unexplained)} quantizer(s) ran in PyTorch but have no Q/DQ in the "
                "file (the exporter folded their input to a constant, or they share another's): "
                + ", ".join(unexplained[:10]) + (" ..." if len(unexplained) > 10 else ""))
    return missing
