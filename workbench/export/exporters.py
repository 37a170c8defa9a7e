"""The two ONNX exporters: torch.export-based (torch's default) and TorchScript, with the fallback
between them and errors that name the operation and the layer that calls it."""
from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Literal

import onnx
import torch
from torch import nn

from workbench.export.errors import ExportError, UnsupportedOperationError
from workbench.export.opset import convert_opset, default_opset
from workbench.export.qdq import onnx_translation, register_torchscript_symbolic
from workbench.export.reference import grow_batch

__all__ = ["Exporter", "DYNAMO_MIN_OPSET", "run_exporter", "quiet", "first_line"]

Exporter = Literal["auto", "dynamo", "torchscript"]
DYNAMO_MIN_OPSET = 18


# ----- exporters --------------------------------------------------------------------------------


class _CaptureError(Exception):
    """torch.export could not capture the model (not an unsupported-operator problem)."""


@contextlib.contextmanager
def quiet() -> Iterator[list[str]]:
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
            trace_inputs = grow_batch(inputs)
        batch = torch.export.Dim("batch", min=1)
        dynamic_shapes = tuple({0: batch} if t.dim() > 0 else None for t in trace_inputs)
    try:
        program = torch.export.export(model, trace_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as error:
        if dynamic_shapes is None:
            raise _CaptureError(first_line(error)) from error
        # a model that fixes its batch size (view(2, -1), say) still exports with a static batch
        try:
            program = torch.export.export(model, inputs, strict=False)
        except Exception as static_error:
            raise _CaptureError(first_line(static_error)) from static_error
        dynamic_batch = False
        warnings_out.append(f"dynamic batch turned off: the model fixes its batch size ({first_line(error)})")
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
            f"The ONNX exporter cannot translate {what}{where}: {first_line(error)}. Replace that operation, "
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
        raise UnsupportedOperationError(f"The TorchScript ONNX exporter failed: {first_line(error)}", ops,
                                        []) from error
    proto = onnx.load_from_string(buffer.getvalue())
    # the same clean-up the torch.export-based exporter applies (constant folding, which keeps Q/DQ,
    # and merging identical nodes), so both exporters give the same Q/DQ structure
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(proto)


def first_line(error: BaseException) -> str:
    for line in str(error).splitlines():
        line = line.strip()
        if line and not line.startswith("Failed to convert the exported program"):
            return line[:500]
    return type(error).__name__



def run_exporter(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str], opset: int,
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

