"""One-click QDQ ONNX export, validated before the file appears.

:func:`export_qdq_onnx` turns a calibrated fake-quant model into an ONNX graph with
QuantizeLinear / DequantizeLinear pairs that TensorRT builds into an INT8 engine:

* int8 Q/DQ with int8 zero points of 0 (uint8 for unsigned quantizers), ``scale = amax / 127``
  (``amax / 255`` unsigned); weights per channel with their axis (ConvTranspose: 1), activations
  per tensor; a narrow-range quantizer gets an int8 Clip(-127, 127) between Q and DQ.
* Disabled quantizers, and layers left unquantized, export without Q/DQ.
* The exporter is torch's default, torch.export-based one. It writes opset 18 or newer, so for an
  older opset (17 is the default: TensorRT 8.6's parser stops there) the graph is converted with
  ``onnx.version_converter``. Where that is impossible, or where torch.export cannot capture the
  model (Python control flow on tensor values), the TorchScript exporter takes over and the report
  says so and why.
* Validation, on a temporary file next to the target: ``onnx.checker`` (full check), an onnxruntime
  CPU session on the sample inputs, and the outputs compared with the fake-quant PyTorch model (max
  abs diff, cosine). During that comparison the quantizers compute ONNX's rounding
  (``round(x / scale)``; see :mod:`workbench.quant.kernels`) so a single layer matches to float
  rounding; their rounding is restored afterwards. Only a valid file is renamed to ``path``.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import torch
from torch import nn

from workbench.export.errors import (
    ExportError,
    ExportValidationError,
    QuantizerStateError,
    SampleInputError,
    UnsupportedOperationError,
)
from workbench.export.opset import convert_opset, default_opset
from workbench.export.qdq import (
    ExportParams,
    QDQStandIn,
    export_params,
    onnx_translation,
    register_torchscript_symbolic,
)
from workbench.export.tensorrt import (
    DEFAULT_TRT_VERSION,
    activation_scales,
    calibration_cache_text,
    strip_qdq,
    write_json_atomic,
    write_text_atomic,
)
from workbench.quant.batches import flat_tensors, model_device
from workbench.quant.nn.modules.quant_rnn import QuantLSTM
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.snapshot import ModelSnapshot, all_quantizers, is_quantizing, quantizer_names
from workbench.quant.tensorrt_rules import tensorrt_check

logger = logging.getLogger(__name__)

__all__ = ["export_qdq_onnx", "ExportReport", "OutputParity", "Exporter", "amax_table"]

Exporter = Literal["auto", "dynamo", "torchscript"]
DYNAMO_MIN_OPSET = 18


@dataclass(frozen=True)
class OutputParity:
    """onnxruntime against the fake-quant PyTorch model, for one output."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    cosine: float


@dataclass
class ExportReport:
    """What :func:`export_qdq_onnx` wrote and how well it matches PyTorch."""

    path: str
    exporter: str                    # "dynamo" (torch.export-based) or "torchscript"
    exporter_note: str               # why that exporter
    opset: int                       # the file's opset
    requested_opset: int
    input_names: list[str]
    output_names: list[str]
    dynamic_batch: bool
    quantize_nodes: int
    dequantize_nodes: int
    clip_nodes: int                  # narrow-range clips between Q and DQ
    expected_qdq: int                # distinct (tensor, scale) pairs quantized in one forward pass
    quantizer_calls_total: int       # active quantizer calls in one forward pass (>= expected_qdq)
    quantizers: int                  # distinct quantizers exported
    per_channel: int
    per_tensor: int
    unsigned: int
    narrow_range: int
    outputs: list[OutputParity]
    max_abs_diff: float
    cosine: float                    # the lowest over outputs
    dynamic_batch_check: OutputParity | None  # the same comparison at another batch size
    file_size: int
    export_time_s: float
    validation_time_s: float
    total_time_s: float
    quantizer_calls: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    amax_json_path: str | None = None
    calibration_cache_path: str | None = None
    float_onnx_path: str | None = None

    @property
    def qdq_pairs(self) -> int:
        return min(self.quantize_nodes, self.dequantize_nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        text = (f"{Path(self.path).name}: {self.quantize_nodes} Q / {self.dequantize_nodes} DQ nodes "
                f"({self.quantizers} quantizers: {self.per_channel} per-channel, {self.per_tensor} per-tensor), "
                f"opset {self.opset}, {self.file_size / 1024:.1f} KiB, exporter {self.exporter}; onnxruntime vs "
                f"PyTorch: max abs diff {self.max_abs_diff:.3g}, cosine {self.cosine:.6f}")
        if self.dynamic_batch_check is not None:
            text += f"; dynamic batch checked at {self.dynamic_batch_check.shape[0]}"
        text += f"; {self.total_time_s:.2f} s"
        return text


# ----- inputs and outputs -----------------------------------------------------------------------


def _as_tuple(sample_inputs: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(sample_inputs, torch.Tensor):
        return (sample_inputs,)
    if isinstance(sample_inputs, (tuple, list)) and sample_inputs and all(
            isinstance(t, torch.Tensor) for t in sample_inputs):
        return tuple(sample_inputs)
    raise TypeError("sample_inputs must be a tensor or a non-empty tuple of tensors (the model's positional "
                    f"inputs), got {type(sample_inputs).__name__}.")


def _grow_batch(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The inputs with one more sample (the first repeated at the end, so values stay realistic)."""
    return tuple(torch.cat([t, t[:1]], 0) if t.dim() > 0 else t for t in inputs)


# ----- quantizer bookkeeping --------------------------------------------------------------------


def _quantizer_names(model: nn.Module) -> dict[int, str]:
    """First qualified name of every TensorQuantizer object (a shared one keeps its first name)."""
    names: dict[int, str] = {}
    for name, q in quantizer_names(model).items():
        names.setdefault(id(q), name)
    return names


def _check_quantizers(model: nn.Module, names: dict[int, str],
                      ) -> tuple[dict[int, TensorQuantizer], dict[int, ExportParams]]:
    """The quantizers that export to Q/DQ and their ONNX parameters, computed once for the whole export.

    Raises QuantizerStateError naming every quantizer that cannot be exported.
    """
    problems: dict[str, str] = {}
    active: dict[int, TensorQuantizer] = {}
    params: dict[int, ExportParams] = {}
    # the layer type and role of each quantizer, for the TensorRT rules (any but a weight's is an activation's)
    roles = {id(q): ("weight" if attr.startswith("_weight_quantizer") else "input", type(layer).__name__)
             for layer in model.modules() for attr, child in layer.named_children()
             for q in (child if isinstance(child, nn.ModuleList) else [child]) if isinstance(q, TensorQuantizer)}
    for module in all_quantizers(model):
        name = names[id(module)]
        role, layer_type = roles.get(id(module), ("input", "layer"))
        verdict = tensorrt_check(role, module._num_bits, module.axis, layer_type)
        if verdict.error and is_quantizing(module):
            problems[name] = verdict.error
            continue
        if module._if_calib and not module._disabled:
            problems[name] = "still collecting calibration statistics (calibration did not finish)"
            continue
        if not is_quantizing(module):
            continue
        try:
            params[id(module)] = export_params(module)
        except LookupError as error:
            problems[name] = f"enabled but {error}"
            continue
        except ValueError as error:
            problems[name] = str(error)
            continue
        active[id(module)] = module
    if problems:
        raise QuantizerStateError(problems)
    return active, params


@contextlib.contextmanager
def _rounding(quantizers: Sequence[TensorQuantizer], rounding: str) -> Iterator[None]:
    saved = [(q, q.rounding) for q in quantizers]
    try:
        for q in quantizers:
            q.rounding = rounding
        yield
    finally:
        for q, value in saved:
            q.rounding = value


@contextlib.contextmanager
def _stand_ins(model: nn.Module, active: dict[int, TensorQuantizer], names: dict[int, str],
               params: dict[int, ExportParams]) -> Iterator[dict]:
    """Swap every active quantizer of this model instance for a QDQStandIn, and back afterwards.

    Only ``_modules`` entries of the instance change; a quantizer shared by several layers gets one
    stand-in, so the exported Q nodes share one scale initializer.
    """
    stand_ins: dict[int, QDQStandIn] = {}
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for parent in list(model.modules()):
            for attr, child in list(parent._modules.items()):
                if child is not None and id(child) in active:
                    if id(child) not in stand_ins:
                        stand_ins[id(child)] = QDQStandIn(names[id(child)], child, params[id(child)])
                    parent._modules[attr] = stand_ins[id(child)]
                    swapped.append((parent, attr, child))
        yield stand_ins
    finally:
        for parent, attr, child in reversed(swapped):
            parent._modules[attr] = child


class _LayerTracker:
    """Knows which layers are running: after an exception the innermost one is the last entered.

    Forward hooks do not run when a forward raises, so the stack keeps the failing path.
    """

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[tuple[str, str]] = []
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name, type(module).__name__)))
            self.handles.append(module.register_forward_hook(self._leave))

    def _enter(self, name: str, type_name: str):
        def hook(module, args):
            self.stack.append((name, type_name))
        return hook

    def _leave(self, module, args, output):
        if self.stack:
            self.stack.pop()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _run_reference(model: nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str],
                   active: dict[int, TensorQuantizer], names: dict[int, str], params: dict[int, ExportParams],
                   ) -> tuple[list[torch.Tensor], dict[str, int], int]:
    """Run the fake-quant model; name the failing layer on error.

    Also counts, per quantizer, how often it runs, and how many distinct (tensor, scale) pairs get
    quantized: the optimised ONNX graph has one Q/DQ pair per pair (two layers quantizing the same
    tensor with the same scale share it), which is what TensorRT wants.
    """
    calls: dict[str, int] = {}
    pairs: set[tuple] = set()
    held: list[torch.Tensor] = []  # keeps tensors alive so that their ids stay unique during the run
    handles = []
    for key, quantizer in active.items():
        name = names[key]
        p = params[key]
        signature = (p.scale.detach().cpu().numpy().tobytes(), tuple(p.scale.shape), p.qmin, p.qmax, p.clip)

        def count(module, args, output, name=name, signature=signature):
            calls[name] = calls.get(name, 0) + 1
            if args and isinstance(args[0], torch.Tensor):
                held.append(args[0])
                pairs.add((id(args[0]), signature))
        handles.append(quantizer.register_forward_hook(count))
    tracker = _LayerTracker(model)
    try:
        with torch.no_grad():
            output = model(*inputs)
    except Exception as error:
        # the innermost layer that was entered and did not finish is where the shapes went wrong
        layer, layer_type = tracker.stack[-1] if tracker.stack else ("", type(model).__name__)
        raise SampleInputError(layer, layer_type, {n: tuple(t.shape) for n, t in zip(input_names, inputs)},
                               error) from error
    finally:
        tracker.remove()
        for handle in handles:
            handle.remove()
    held.clear()
    tensors = flat_tensors(output)
    if not tensors:
        raise ExportError("The model returned no tensor; there is nothing to export.")
    return [t.detach() for t in tensors], calls, len(pairs)


# ----- exporters --------------------------------------------------------------------------------


class _CaptureError(Exception):
    """torch.export could not capture the model (not an unsupported-operator problem)."""


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """Keep the exporters' progress and registry chatter out of the user's console; collect warnings."""
    collected: list[str] = []
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield collected
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
            for w in caught:
                message = str(w.message).splitlines()[0] if str(w.message) else ""
                if issubclass(w.category, torch.jit.TracerWarning):
                    collected.append(f"TorchScript tracer: {message}")


def _unsupported_ops(error: BaseException) -> list[str]:
    text = "".join(str(e) for e in _chain(error))
    ops = re.findall(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)", text)
    found = [f"{op}.{overload}" for op, overload in ops]
    found += [m for m in re.findall(r"target=torch\.ops\.([\w.]+)", text)]
    found += re.findall(r"symbolic function for '?([\w:]+)'?", text)
    found += re.findall(r"operator '?(aten::\w+|[\w]+::\w+)'? .*not supported", text)
    unique: list[str] = []
    for op in found:
        if op not in unique:
            unique.append(op)
    return unique


def _chain(error: BaseException) -> list[BaseException]:
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _layers_calling(program, ops: list[str]) -> list[str]:
    layers: list[str] = []
    if program is None:
        return layers
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        if any(target == op or target.startswith(op + ".") for op in ops):
            stack = node.meta.get("nn_module_stack") or {}
            name = list(stack.values())[-1][0] if stack else ""
            label = name or "<model>"
            if label not in layers:
                layers.append(label)
    return layers


def _export_dynamo(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str],
                   opset: int, dynamic_batch: bool, warnings_out: list[str]) -> tuple[onnx.ModelProto, bool, str]:
    trace_inputs = inputs
    dynamic_shapes = None
    if dynamic_batch:
        # torch.export specialises a dimension of size 1, so trace with at least two samples
        if any(t.dim() > 0 and t.shape[0] == 1 for t in inputs):
            trace_inputs = _grow_batch(inputs)
        batch = torch.export.Dim("batch", min=1)
        dynamic_shapes = tuple({0: batch} if t.dim() > 0 else None for t in trace_inputs)
    try:
        program = torch.export.export(model, trace_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as error:
        if dynamic_shapes is None:
            raise _CaptureError(_first_line(error)) from error
        # a model that fixes its batch size (view(2, -1), say) still exports with a static batch
        try:
            program = torch.export.export(model, inputs, strict=False)
        except Exception as static_error:
            raise _CaptureError(_first_line(static_error)) from static_error
        dynamic_batch = False
        warnings_out.append(f"dynamic batch turned off: the model fixes its batch size ({_first_line(error)})")
    target = max(opset, DYNAMO_MIN_OPSET)
    try:
        onnx_program = torch.onnx.export(
            program, (), None, dynamo=True, opset_version=target, input_names=input_names,
            output_names=output_names, custom_translation_table={torch.ops.workbench.qdq.default: onnx_translation},
            optimize=True, verbose=False, external_data=False)
    except Exception as error:
        ops = [op for op in _unsupported_ops(error) if not op.startswith("workbench")]
        layers = _layers_calling(program, ops)
        what = ", ".join(ops) if ops else "an operation"
        where = f" called by {', '.join(layers)}" if layers else ""
        raise UnsupportedOperationError(
            f"The ONNX exporter cannot translate {what}{where}: {_first_line(error)}. Replace that operation, "
            "or leave that part of the model out of the export.", ops, layers) from error
    proto = onnx_program.model_proto
    note = "torch.export-based exporter (torch's default)"
    if default_opset(proto) != opset:
        proto, notes = convert_opset(proto, opset)
        note += f", converted from opset {target} to {opset} with onnx.version_converter"
        warnings_out.extend(notes)
    return proto, dynamic_batch, note


def _export_torchscript(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str],
                        opset: int, dynamic_batch: bool) -> onnx.ModelProto:
    if opset < 13:
        raise ExportError(f"opset {opset} is too old for per-channel Q/DQ; use opset 13 or newer.")
    register_torchscript_symbolic()
    dynamic_axes = None
    if dynamic_batch:
        dynamic_axes = {name: {0: "batch"} for name in list(input_names) + list(output_names)}
    buffer = io.BytesIO()
    try:
        torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True)
    except Exception as error:
        ops = _unsupported_ops(error)
        raise UnsupportedOperationError(f"The TorchScript ONNX exporter failed: {_first_line(error)}", ops,
                                        []) from error
    proto = onnx.load_from_string(buffer.getvalue())
    # the same clean-up the torch.export-based exporter applies (constant folding, which keeps Q/DQ,
    # and merging identical nodes), so both exporters give the same Q/DQ structure
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(proto)


def _first_line(error: BaseException) -> str:
    for line in str(error).splitlines():
        line = line.strip()
        if line and not line.startswith("Failed to convert the exported program"):
            return line[:500]
    return type(error).__name__


# ----- post-processing and validation -----------------------------------------------------------


def _name_qdq_nodes(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str]) -> None:
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


def _compare(names: list[str], reference: list[torch.Tensor], actual: list[np.ndarray]) -> list[OutputParity]:
    if len(reference) != len(actual):
        raise ExportValidationError("parity", f"onnxruntime returned {len(actual)} outputs, PyTorch {len(reference)}.")
    results = []
    for name, ref, out in zip(names, reference, actual):
        ref_np = ref.detach().cpu().numpy()
        if tuple(ref_np.shape) != tuple(out.shape):
            raise ExportValidationError("parity", f"output {name!r}: onnxruntime shape {tuple(out.shape)}, PyTorch "
                                                  f"{tuple(ref_np.shape)}.")
        if ref_np.dtype.kind not in "fc":
            equal = np.array_equal(ref_np, out)
            results.append(OutputParity(name, tuple(out.shape), 0.0 if equal else math.inf, 1.0 if equal else 0.0))
            continue
        finite_ref, finite_out = np.isfinite(ref_np), np.isfinite(out)
        if not np.array_equal(finite_ref, finite_out):
            raise ExportValidationError("parity", f"output {name!r}: onnxruntime and PyTorch disagree on which "
                                                  "values are NaN/Inf.")
        diff = np.abs(ref_np[finite_ref].astype(np.float64) - out[finite_out].astype(np.float64))
        results.append(OutputParity(name, tuple(out.shape), float(diff.max()) if diff.size else 0.0,
                                    _cosine(ref_np[finite_ref], out[finite_out])))
    return results


def _ort_session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    # run the graph as written: no fusion into integer kernels, so parity checks the graph's semantics
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def _feeds(session, inputs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(inputs):
        raise ExportValidationError("onnxruntime", f"the ONNX graph takes {len(names)} inputs ({names}), the sample "
                                                   f"has {len(inputs)}.")
    return {name: t.detach().cpu().numpy() for name, t in zip(names, inputs)}


def amax_table(model: nn.Module) -> dict[str, Any]:
    """Every quantizer's state as JSON-ready data: ``{name: {amax, scale, axis, bits, ...}}``."""
    return _amax_table(model, {})


def _amax_table(model: nn.Module, known: dict[int, ExportParams]) -> dict[str, Any]:
    """:func:`amax_table`, reusing the ONNX parameters an export already computed (``known``, by quantizer id)."""
    table: dict[str, Any] = {}
    paths: dict[int, list[str]] = {}
    for name, module in quantizer_names(model).items():
        paths.setdefault(id(module), []).append(name)
    for q in all_quantizers(model):
        name = paths[id(q)][0]
        entry: dict[str, Any] = {
            "enabled": not q._disabled, "quant": bool(q._if_quant), "num_bits": q._num_bits, "axis": q._axis,
            "unsigned": bool(q._unsigned), "narrow_range": bool(q._narrow_range),
            "shared_with": [p for p in paths[id(q)] if p != name]}
        amax = q._buffers.get("_amax")
        entry["amax"] = None if amax is None else amax.detach().cpu().float().reshape(-1).tolist()
        entry["amax_shape"] = None if amax is None else list(amax.shape)
        try:
            params = known[id(q)] if id(q) in known else export_params(q)
            entry["scale"] = params.scale.detach().cpu().reshape(-1).tolist()
            entry["zero_point_type"] = "uint8" if q._unsigned else "int8"
        except (LookupError, ValueError):
            entry["scale"] = None
        table[name] = entry
    return table


# ----- the entry point --------------------------------------------------------------------------


def export_qdq_onnx(model: nn.Module, sample_inputs: torch.Tensor | Sequence[torch.Tensor], path: str | os.PathLike,
                    *, opset: int = 17, input_names: Sequence[str] | None = None,
                    output_names: Sequence[str] | None = None, dynamic_batch: bool = True,
                    exporter: Exporter = "auto", min_cosine: float = 0.999, max_abs_diff: float | None = None,
                    amax_json_path: str | os.PathLike | None = None,
                    calibration_cache_path: str | os.PathLike | None = None,
                    float_onnx_path: str | os.PathLike | None = None,
                    trt_version: int = DEFAULT_TRT_VERSION) -> ExportReport:
    """Export a fake-quant model to a QDQ ONNX file and validate it before it appears at ``path``.

    Args:
        model: the quantized, calibrated model (quantized modules, QuantAdd/QuantConcat, placement rules).
        sample_inputs: a tensor or a tuple of tensors: the model's positional inputs. They are traced,
            run through onnxruntime and compared with PyTorch.
        path: where the ``.onnx`` file goes. Nothing is written there unless validation passes.
        opset: ONNX opset of the file (>= 13 for per-channel Q/DQ; 17 suits TensorRT 8.6).
        input_names, output_names: graph input/output names (default ``input``/``input_N``,
            ``output``/``output_N``).
        dynamic_batch: make dimension 0 of every input and output symbolic ("batch"), and check in
            onnxruntime that another batch size works too.
        exporter: ``"auto"`` (torch.export-based, TorchScript where that cannot do it), ``"dynamo"`` or
            ``"torchscript"``.
        min_cosine: the lowest acceptable cosine similarity of every output with PyTorch's.
        max_abs_diff: optional bound on the largest absolute difference.
        amax_json_path: also write every quantizer's amax and scale as JSON.
        calibration_cache_path: also write a TensorRT calibration cache (implicit quantization) for the
            activation quantizers; see :mod:`workbench.export.tensorrt`.
        float_onnx_path: also write the graph without Q/DQ, with the tensor names the cache uses.
        trt_version: the TensorRT version in the cache header (8601 for 8.6.1).

    Returns:
        An :class:`ExportReport` with the exporter used, Q/DQ counts, opset, file size, times and the
        onnxruntime-vs-PyTorch figures.

    Raises:
        TypeError, ValueError: bad arguments.
        QuantizerStateError: an enabled quantizer is not calibrated, still calibrating, or not INT8.
        SampleInputError: the model fails on the sample inputs (the message names the layer and inputs).
        UnsupportedOperationError: the exporter cannot translate an operation (named, with its layer).
        ExportValidationError: the file failed onnx.checker, onnxruntime, or the parity check.
        ExportError: any other export failure. In every case no file is left at ``path``.
    """
    started = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}.")
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ValueError(f"exporter must be 'auto', 'dynamo' or 'torchscript', got {exporter!r}.")
    if not isinstance(opset, int) or opset < 13:
        raise ValueError(f"opset must be an integer >= 13 (per-channel QuantizeLinear needs 13), got {opset!r}.")
    path = Path(path)
    if not path.parent.exists():
        raise ValueError(f"The folder {path.parent} does not exist.")
    inputs = _as_tuple(sample_inputs)
    device = model_device(model)
    inputs = tuple(t.to(device) for t in inputs)
    if input_names is None:
        input_names = ["input"] if len(inputs) == 1 else [f"input_{i}" for i in range(len(inputs))]
    input_names = list(input_names)
    if len(input_names) != len(inputs) or len(set(input_names)) != len(input_names):
        raise ValueError(f"input_names must name each of the {len(inputs)} inputs once, got {input_names}.")

    names = _quantizer_names(model)
    active, params = _check_quantizers(model, names)
    # train/eval modes (one by one: some layers may be frozen) and quantizer state go back afterwards
    entry_state = ModelSnapshot(model)
    model.eval()
    report_warnings: list[str] = []
    tmp_path: str | None = None
    try:
        with _rounding(list(active.values()), "onnx"):
            reference, calls, distinct = _run_reference(model, inputs, input_names, active, names, params)
            grown = None
            if dynamic_batch and inputs[0].dim() > 0:
                grown = _grow_batch(inputs)
                try:
                    grown_reference, _, _ = _run_reference(model, grown, input_names, active, names, params)
                except SampleInputError as error:
                    report_warnings.append(f"dynamic batch turned off: the model fails at batch size "
                                           f"{grown[0].shape[0]} ({error.original})")
                    dynamic_batch, grown = False, None
        if output_names is None:
            output_names = ["output"] if len(reference) == 1 else [f"output_{i}" for i in range(len(reference))]
        output_names = list(output_names)
        if len(output_names) != len(reference) or len(set(output_names)) != len(output_names):
            raise ValueError(f"output_names must name each of the model's {len(reference)} output tensors once, "
                             f"got {output_names}.")

        export_started = time.perf_counter()
        with _stand_ins(model, active, names, params) as stand_ins, _quiet() as quiet_warnings:
            proto, used_exporter, note, dynamic_batch = _export(
                model, inputs, input_names, output_names, opset, dynamic_batch, exporter, report_warnings)
        for message in quiet_warnings:
            if message not in report_warnings:
                report_warnings.append(message)
        export_time = time.perf_counter() - export_started
        if not dynamic_batch:
            grown = None

        scale_to_quantizer = {f"{s.quantizer_name}.scale": s.quantizer_name for s in stand_ins.values()}
        _name_qdq_nodes(proto, scale_to_quantizer)
        counts = {op: sum(1 for n in proto.graph.node if n.op_type == op)
                  for op in ("QuantizeLinear", "DequantizeLinear", "Clip")}
        per_channel_activations = _per_channel_activations(proto, scale_to_quantizer)
        if per_channel_activations:
            report_warnings.append("per-channel quantizers on activations (TensorRT expects activations per "
                                   "tensor): " + ", ".join(per_channel_activations))
        tiny = [s.quantizer_name for s in stand_ins.values() if s.params.tiny_channels]
        if tiny:
            report_warnings.append("amax <= 2**-24 (exported with scale 1, exact for all-zero channels): "
                                   + ", ".join(tiny))

        for name, module in model.named_modules():
            if isinstance(module, QuantLSTM) and any(id(q) in active for q in module._input_quantizers):
                report_warnings.append(f"quantized LSTM '{name}' is unrolled step by step: the graph takes only the "
                                       "sample's sequence length (leave the LSTM unquantized for an ONNX LSTM node)")
        validation_started = time.perf_counter()
        fd, tmp_path = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp's 0600 would make the file unshareable: the usual mode
        onnx.save(proto, tmp_path)
        try:
            onnx.checker.check_model(tmp_path, full_check=True)
        except Exception as error:
            raise ExportValidationError("checker", f"onnx.checker rejected the exported graph: {error}") from error
        try:
            session = _ort_session(tmp_path)
            ort_outputs = session.run(None, _feeds(session, inputs))
        except ExportValidationError:
            raise
        except Exception as error:
            raise ExportValidationError("onnxruntime", f"onnxruntime could not run the exported graph: "
                                                       f"{_first_line(error)}") from error
        parity = _compare(output_names, reference, ort_outputs)
        dynamic_check = None
        if grown is not None:
            try:
                grown_outputs = session.run(None, _feeds(session, grown))
            except Exception as error:
                raise ExportValidationError("onnxruntime", f"the graph does not run at batch size "
                                                           f"{grown[0].shape[0]}: {_first_line(error)}") from error
            grown_parity = _compare(output_names, grown_reference, grown_outputs)
            dynamic_check = min(grown_parity, key=lambda p: p.cosine)
        worst = min(p.cosine for p in parity + ([dynamic_check] if dynamic_check else []))
        largest = max(p.max_abs_diff for p in parity + ([dynamic_check] if dynamic_check else []))
        report = ExportReport(
            path=str(path), exporter=used_exporter, exporter_note=note, opset=default_opset(proto),
            requested_opset=opset, input_names=input_names, output_names=output_names, dynamic_batch=dynamic_batch,
            quantize_nodes=counts["QuantizeLinear"], dequantize_nodes=counts["DequantizeLinear"],
            clip_nodes=_qdq_clips(proto),
            expected_qdq=distinct, quantizer_calls_total=sum(calls.values()), quantizers=len(stand_ins),
            per_channel=sum(1 for s in stand_ins.values() if s.params.per_channel),
            per_tensor=sum(1 for s in stand_ins.values() if not s.params.per_channel),
            unsigned=sum(1 for s in stand_ins.values() if s.params.qmin == 0),
            narrow_range=sum(1 for s in stand_ins.values() if s.params.qmin == -127),
            outputs=parity, max_abs_diff=largest, cosine=worst, dynamic_batch_check=dynamic_check,
            file_size=os.path.getsize(tmp_path), export_time_s=export_time,
            validation_time_s=time.perf_counter() - validation_started, total_time_s=0.0,
            quantizer_calls=dict(calls), warnings=report_warnings)
        if not worst >= min_cosine:
            raise ExportValidationError("parity", f"onnxruntime and the fake-quant PyTorch model disagree: cosine "
                                                  f"{worst:.6f} < {min_cosine} (max abs diff {largest:.4g}).", report)
        if max_abs_diff is not None and largest > max_abs_diff:
            raise ExportValidationError("parity", f"onnxruntime and the fake-quant PyTorch model disagree: max abs "
                                                  f"diff {largest:.4g} > {max_abs_diff}.", report)
        os.replace(tmp_path, path)
        tmp_path = None

        if amax_json_path is not None:
            table = {"model": type(model).__name__, "onnx": path.name, "quantizers": _amax_table(model, params)}
            report.amax_json_path = str(write_json_atomic(amax_json_path, table))
        if calibration_cache_path is not None or float_onnx_path is not None:
            amax_by_scale = {f"{s.quantizer_name}.scale": _amax_of(s) for s in stand_ins.values()
                             if not s.params.per_channel}
            if calibration_cache_path is not None:
                scales = activation_scales(proto, amax_by_scale)
                report.calibration_cache_path = str(write_text_atomic(
                    calibration_cache_path, calibration_cache_text(scales, trt_version)))
            if float_onnx_path is not None:
                float_path = Path(float_onnx_path)
                tmp_float = float_path.with_name(float_path.name + ".tmp")
                onnx.save(strip_qdq(proto), str(tmp_float))
                tmp_float.replace(float_path)
                report.float_onnx_path = str(float_path)
        report.total_time_s = time.perf_counter() - started
        logger.info("QDQ export: %s", report.summary())
        return report
    finally:
        if tmp_path is not None and os.path.exists(tmp_path):
            os.remove(tmp_path)
        entry_state.restore()


def _per_channel_activations(proto: onnx.ModelProto, scale_to_quantizer: dict[str, str]) -> list[str]:
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


def _qdq_clips(proto: onnx.ModelProto) -> int:
    producers = {out: n for n in proto.graph.node for out in n.output}
    clips = 0
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear":
            source = producers.get(node.input[0])
            if source is not None and source.op_type == "Clip":
                clips += 1
    return clips


def _amax_of(stand_in: QDQStandIn) -> float:
    # scale = amax / max_bound, and the cache wants the dynamic range amax
    max_bound = 255.0 if stand_in.params.qmin == 0 else 127.0
    return float(stand_in.scale.reshape(())) * max_bound


def _export(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str], opset: int,
            dynamic_batch: bool, exporter: Exporter, report_warnings: list[str]):
    """Run the chosen exporter; with "auto", fall back to TorchScript and say why."""
    if exporter == "torchscript":
        proto = _export_torchscript(model, inputs, input_names, output_names, opset, dynamic_batch)
        return proto, "torchscript", "TorchScript exporter (requested)", dynamic_batch
    try:
        proto, dynamic_batch, note = _export_dynamo(model, inputs, input_names, output_names, opset, dynamic_batch,
                                                    report_warnings)
        return proto, "dynamo", note, dynamic_batch
    except _CaptureError as error:
        if exporter == "dynamo":
            raise ExportError(f"torch.export could not capture the model: {error}") from error
        reason = f"torch.export could not capture the model ({error}); the TorchScript exporter records the " \
                 "path the sample inputs take"
    except ValueError as error:  # opset conversion
        if exporter == "dynamo":
            raise ExportError(str(error)) from error
        reason = f"the torch.export-based exporter writes opset >= {DYNAMO_MIN_OPSET} and {error}"
    except UnsupportedOperationError as error:
        if exporter == "dynamo":
            raise
        try:
            proto = _export_torchscript(model, inputs, input_names, output_names, opset, dynamic_batch)
        except ExportError:
            raise error from None
        return proto, "torchscript", f"TorchScript exporter: the torch.export-based one failed ({error})", \
            dynamic_batch
    proto = _export_torchscript(model, inputs, input_names, output_names, opset, dynamic_batch)
    return proto, "torchscript", f"TorchScript exporter: {reason}", dynamic_batch


def _json_default(value: Any) -> Any:  # pragma: no cover - used by callers dumping reports
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


def report_json(report: ExportReport) -> str:
    """The report as JSON text (for the project file's export history)."""
    return json.dumps(report.to_dict(), default=_json_default, indent=2)
