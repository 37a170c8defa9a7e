"""Post-processing and validation of an exported graph: Q/DQ node names, onnxruntime parity with
PyTorch, the amax table."""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from workbench.export.errors import ExportValidationError
from workbench.export.memory import release_freed_memory
from workbench.export.naming import name_nodes_by_module
from workbench.export.provenance import mark_onnx
from workbench.export.qdq import ExportParams, QDQStandIn, export_params
from workbench.export.report import OutputParity
from workbench.quant.algorithms.snapshot import all_quantizers, quantizer_names

__all__ = ["post_process", "name_qdq_nodes", "compare", "range_inputs", "ort_session", "model_weights",
           "shared_weights", "feeds", "amax_table", "amax_table_of", "per_channel_activations", "qdq_clips", "amax_of"]


# ----- post-processing and validation -----------------------------------------------------------


def post_process(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str]) -> None:
    """The passes over the exported graph before it is validated and written (in place). One place, so a
    new pass is one more call here."""
    name_qdq_nodes(proto, scale_to_quantizer)
    name_nodes_by_module(proto)  # engine layer names then read "stem.0/Conv + stem.2/Relu"
    drop_stack_traces(proto)
    mark_onnx(proto)  # so a later export can tell this file from one it must not replace


# the exporter records each node's Python stack: paths and source lines of the user's machine, in a file
# that is shipped to deployment; half the size of a small graph. The module path stays (workbench.module).
_STACK_TRACE = "pkg.torch.onnx.stack_trace"


def drop_stack_traces(proto: onnx.ModelProto) -> None:
    """Remove the exporter's per-node Python stack traces from the graph's metadata (in place)."""
    for node in proto.graph.node:
        kept = [entry for entry in node.metadata_props if entry.key != _STACK_TRACE]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)


def name_qdq_nodes(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str]) -> None:
    """Name Q/Clip/DQ nodes after their quantizer ("conv1._input_quantizer/QuantizeLinear"), for viewers."""
    used = {n.name for n in proto.graph.node}
    producers = {out: n for n in proto.graph.node for out in n.output}
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 2:
            continue
        quantizer = scale_to_quantizer.get(node.input[1])
        if quantizer is None:
            continue
        key = f"{quantizer}/{node.op_type}"
        index = counts.get(key, 0)
        counts[key] = index + 1
        name = key if index == 0 else f"{key}_{index}"
        if name in used:
            continue
        used.discard(node.name)
        node.name = name
        used.add(name)
        if node.op_type == "DequantizeLinear":
            clip = producers.get(node.input[0])
            if clip is not None and clip.op_type == "Clip":
                clip_name = name.replace("DequantizeLinear", "Clip")
                if clip_name not in used:
                    clip.name = clip_name
                    used.add(clip_name)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a64)), float(np.linalg.norm(b64))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a64, b64) / (na * nb))


def range_inputs(inputs: tuple[torch.Tensor, ...], seed: int = 0) -> tuple[torch.Tensor, ...] | None:
    """Random inputs shaped like ``inputs``, uniform over each floating-point input's own finite range
    (a constant input gets [value - 1, value + 1]); other inputs unchanged. None without a float input."""
    if not any(t.is_floating_point() for t in inputs):
        return None
    generator = torch.Generator().manual_seed(seed)
    ranged = []
    for tensor in inputs:
        if not tensor.is_floating_point():
            ranged.append(tensor)
            continue
        finite = tensor[torch.isfinite(tensor)]
        low, high = (float(finite.min()), float(finite.max())) if finite.numel() else (-1.0, 1.0)
        if low == high:
            low, high = low - 1.0, high + 1.0
        uniform = torch.rand(tuple(tensor.shape), generator=generator, dtype=torch.float32)
        ranged.append((low + (high - low) * uniform).to(device=tensor.device, dtype=tensor.dtype))
    return tuple(ranged)


def _nonfinite_inputs(sample: dict[str, torch.Tensor] | None) -> list[str]:
    found = []
    for name, tensor in (sample or {}).items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                found.append(f"{name!r} ({bad} of {tensor.numel()} values)")
    return found


def compare(names: list[str], reference: list[torch.Tensor], actual: list[np.ndarray],
            sample: dict[str, torch.Tensor] | None = None) -> list[OutputParity]:
    """Per-output parity of onnxruntime with PyTorch; ``sample`` (the inputs by name) explains NaN/Inf. An output
    of another shape than PyTorch's parts entirely: cosine 0, max abs diff inf."""
    if len(reference) != len(actual):
        raise ExportValidationError("parity", f"onnxruntime returned {len(actual)} outputs, PyTorch {len(reference)}.")
    results = []
    for name, ref, out in zip(names, reference, actual):
        # numpy has no bfloat16: a bf16 network's outputs compare as float32 (exact: every bf16 is a float32)
        ref_np = ref.detach().cpu().float().numpy() if ref.dtype == torch.bfloat16 else ref.detach().cpu().numpy()
        if getattr(out, "dtype", None) is not None and out.dtype.kind == "V":  # bfloat16 (reference evaluator)
            out = np.asarray(out, dtype=np.float32)
        if tuple(ref_np.shape) != tuple(out.shape):
            # not the same tensor: parity fails (cosine 0), and the diagnosis says why (a detector's selection keeps
            # another number of boxes; a size fixed in the graph) rather than an error that explains nothing
            results.append(OutputParity(name, tuple(out.shape), math.inf, 0.0))
            continue
        if ref_np.dtype.kind not in "fc":
            equal = np.array_equal(ref_np, out)
            results.append(OutputParity(name, tuple(out.shape), 0.0 if equal else math.inf, 1.0 if equal else 0.0))
            continue
        finite_ref, finite_out = np.isfinite(ref_np), np.isfinite(out)
        if not np.array_equal(finite_ref, finite_out):
            holding = _nonfinite_inputs(sample)
            if holding:
                raise ExportValidationError("parity", f"output {name!r}: onnxruntime and PyTorch disagree on which "
                                                      "values are NaN/Inf because the validation sample itself holds "
                                                      f"NaN/Inf: input {', '.join(holding)}. Export with finite "
                                                      "sample inputs (check the calibration data).")
            raise ExportValidationError("parity", f"output {name!r}: onnxruntime and PyTorch disagree on which "
                                                  "values are NaN/Inf.")
        diff = np.abs(ref_np[finite_ref].astype(np.float64) - out[finite_out].astype(np.float64))
        results.append(OutputParity(name, tuple(out.shape), float(diff.max()) if diff.size else 0.0,
                                    _cosine(ref_np[finite_ref], out[finite_out])))
    return results


def ort_session(path: str, weights: Mapping[str, torch.Tensor] | None = None):
    """A CPU session that runs the graph as written and holds the weights once (see the comments).

    ``weights`` (tensor name -> the model's tensor; see :func:`model_weights`): the graph's external
    initializers whose bytes in the data file equal one of these tensors' (checked, see
    :func:`shared_weights`) are handed to onnxruntime over the tensor's memory instead of being read from
    the file, so the session does not hold a second copy of the model's weights (a 16 MB layer's export
    peaked at 3.3x its size with one, 2.3x without).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    # run the graph as written: no fusion into integer kernels, so parity checks the graph's semantics
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Without constant folding each weight's QuantizeLinear -> DequantizeLinear runs at run time, and
    # the default order runs every weight-only node first: the float copies of all the weights were
    # alive together (1x the model again; a 600M model's export peaked at 3.25x its fp32 size). The
    # priority-based order runs them next to the layers that read them (the same kernels, so the same
    # outputs bit for bit), and without the arena their buffers go back as soon as they are read
    # instead of staying in power-of-two chunks.
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 3
    shared = shared_weights(path, weights) if weights else {}
    for name, (_, value) in shared.items():
        options.add_initializer(name, value)  # onnxruntime keeps a pointer: the value must outlive the session
    session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
    # the arrays and OrtValues live as long as the session that reads their memory
    session.workbench_shared_weights = shared
    return session


def model_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name (a shared tensor under each of its names): the names an
    exported graph gives its initializers (the export wrapper's prefix removed, see ``unwrap_names``)."""
    found: dict[str, torch.Tensor] = {}
    for name, tensor in list(model.named_parameters(remove_duplicate=False)) + \
            list(model.named_buffers(remove_duplicate=False)):
        found.setdefault(name, tensor)
    return found


# numpy dtypes of the ONNX element types onnxruntime can take from a numpy array as they are
_SHAREABLE = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
              onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8,
              onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64,
              onnx.TensorProto.BOOL: np.bool_}
_COMPARE_CHUNK = 1024 ** 2  # the comparison's buffers are all it allocates: small beside a 16 MB model


def shared_weights(path: str, weights: Mapping[str, torch.Tensor]) -> dict[str, tuple[np.ndarray, Any]]:
    """The external initializers of the graph at ``path`` that onnxruntime can read from ``weights`` instead of
    the data file: name -> (a numpy view of the tensor, an OrtValue over it), neither a copy.

    A tensor qualifies when it is on the CPU, contiguous, of the initializer's element type and shape, and
    its bytes equal the initializer's bytes in the data file (read in chunks and compared, so the session
    still runs exactly what the file holds). The others, and every weight held inside the graph file, are
    left to onnxruntime to read as usual.
    """
    import onnxruntime as ort

    graph = onnx.load(path, load_external_data=False)
    folder = Path(path).parent
    shared: dict[str, tuple[np.ndarray, Any]] = {}
    opened: dict[str, Any] = {}
    try:
        for initializer in graph.graph.initializer:
            if initializer.data_location != onnx.TensorProto.EXTERNAL or initializer.name not in weights:
                continue
            array = _numpy_view(weights[initializer.name], initializer)
            info = {entry.key: entry.value for entry in initializer.external_data}
            location = info.get("location", "")
            if array is None or not location or "/" in location or "\\" in location:
                continue
            if location not in opened:
                opened[location] = open(folder / location, "rb")
            offset = int(info.get("offset", 0))
            length = int(info.get("length", array.nbytes))
            if length == array.nbytes and _file_holds(opened[location], offset, array):
                shared[initializer.name] = (array, ort.OrtValue.ortvalue_from_numpy(array))
    finally:
        for handle in opened.values():
            handle.close()
        release_freed_memory()  # the comparison's buffers, before onnxruntime allocates
    return shared


def _numpy_view(tensor: torch.Tensor, initializer: onnx.TensorProto) -> np.ndarray | None:
    """``tensor`` as a numpy array over its own memory, if it is one onnxruntime can take for ``initializer``."""
    dtype = _SHAREABLE.get(initializer.data_type)
    if dtype is None or tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.is_sparse:
        return None
    if tuple(tensor.shape) != tuple(initializer.dims):
        return None
    try:
        array = tensor.detach().numpy()
    except (RuntimeError, TypeError):  # a tensor subclass, a dtype numpy has no view of
        return None
    return array if array.dtype == dtype else None


def _file_holds(handle, offset: int, array: np.ndarray) -> bool:
    """Whether the bytes of ``handle`` at ``offset`` equal ``array``'s."""
    flat = array.reshape(-1).view(np.uint8)
    chunk = bytearray(min(_COMPARE_CHUNK, flat.size))
    handle.seek(offset)
    done = 0
    while done < flat.size:
        count = handle.readinto(memoryview(chunk)[:min(len(chunk), flat.size - done)])
        if not count or not np.array_equal(np.frombuffer(chunk, np.uint8, count), flat[done:done + count]):
            return False
        done += count
    return True


def feeds(session, inputs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(inputs):
        raise ExportValidationError("onnxruntime", f"the ONNX graph takes {len(names)} inputs ({names}), the sample "
                                                   f"has {len(inputs)}.")
    return {name: t.detach().cpu().numpy() for name, t in zip(names, inputs)}


def amax_table(model: nn.Module) -> dict[str, Any]:
    """Every quantizer's state as JSON-ready data: ``{name: {amax, scale, axis, bits, ...}}``."""
    return amax_table_of(model, {})


def amax_table_of(model: nn.Module, known: dict[int, ExportParams]) -> dict[str, Any]:
    """:func:`amax_table`, reusing the ONNX parameters an export already computed (``known``, by quantizer id)."""
    table: dict[str, Any] = {}
    paths: dict[int, list[str]] = {}
    for name, module in quantizer_names(model).items():
        paths.setdefault(id(module), []).append(name)
    for q in all_quantizers(model):
        name = paths[id(q)][0]
        entry: dict[str, Any] = {
            "enabled": q.is_enabled, "quant": bool(q.is_quant_enabled), "num_bits": q.num_bits, "axis": q.axis,
            "unsigned": bool(q.unsigned), "narrow_range": bool(q.narrow_range),
            "shared_with": [p for p in paths[id(q)] if p != name]}
        amax = q.amax
        entry["amax"] = None if amax is None else amax.detach().cpu().float().reshape(-1).tolist()
        entry["amax_shape"] = None if amax is None else list(amax.shape)
        try:
            params = known[id(q)] if id(q) in known else export_params(q)
            entry["scale"] = params.scale.detach().cpu().reshape(-1).tolist()
            entry["zero_point_type"] = "uint8" if q.unsigned else "int8"
        except (LookupError, ValueError):
            entry["scale"] = None
        table[name] = entry
    return table



def per_channel_activations(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str]) -> list[str]:
    inits = {i.name: i for i in proto.graph.initializer}
    found: list[str] = []
    for node in proto.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in inits:
            continue
        scale = inits.get(node.input[1])
        if scale is not None and len(scale.dims) == 1:
            name = scale_to_quantizer.get(node.input[1], node.input[1])
            if name not in found:
                found.append(name)
    return found


def qdq_clips(proto: onnx.ModelProto) -> int:
    producers = {out: n for n in proto.graph.node for out in n.output}
    clips = 0
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear":
            source = producers.get(node.input[0])
            if source is not None and source.op_type == "Clip":
                clips += 1
    return clips


def amax_of(stand_in: QDQStandIn) -> float:
    # scale = amax / max_bound, and the cache wants the dynamic range amax
    max_bound = 255.0 if stand_in.params.qmin == 0 else 127.0
    return float(stand_in.scale.reshape(())) * max_bound

