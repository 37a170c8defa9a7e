"""The TorchScript exporter's graph without its weights, and the weights attached from the model's own tensors.

torch.onnx's TorchScript exporter builds the graph with its weights in C++, serialises it and hands the bytes
to Python, which parses them again; its shape inference copies each weight a node reads into a one-node graph.
The weights were held three or four times at once (7x the fp32 size at the peak of a whole export,
``bench/export_speed.py``). Here the model's parameters and buffers go into the trace as inputs
(:func:`weight_inputs`; the export wrapper calls the model through ``torch.func.functional_call``), so torch
holds them only by reference and its shape inference reads their types, not their values; the graph names them
``model.<name>``. :func:`attach_weights` turns those inputs into initializers read straight from the tensors:
inside the graph for a small model, else written one by one to a data file beside the target, the form the
torch.export-based path streams its weights to (the staging, the validation and the fold into one file on
commit are shared, see :mod:`workbench.export.onnx_file`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from workbench.export.onnx_file import SMALL_TENSOR, temporary_name

__all__ = ["weight_inputs", "attach_weights", "DATA_ALIGNMENT", "WEIGHT_PREFIX"]

# each tensor in the data file starts on a page boundary, so that a reader may map it in place
DATA_ALIGNMENT = 4096
# the graph input of the model's tensor ``name`` is ``model.<name>``, as TorchScript names the wrapper's parameters
WEIGHT_PREFIX = "model."

_ONNX_TYPES = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
               torch.bfloat16: onnx.TensorProto.BFLOAT16, torch.float64: onnx.TensorProto.DOUBLE,
               torch.int8: onnx.TensorProto.INT8, torch.uint8: onnx.TensorProto.UINT8,
               torch.int16: onnx.TensorProto.INT16, torch.int32: onnx.TensorProto.INT32,
               torch.int64: onnx.TensorProto.INT64, torch.bool: onnx.TensorProto.BOOL}


def weight_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters and buffers of ``model`` to pass into the trace, by name: each tensor once (a tied weight
    under its first name: ``functional_call`` ties the others to it), of a type an initializer can hold. A
    tensor left out (an FP8 buffer) stays the model's own, and torch writes it into the graph as before."""
    found: dict[str, torch.Tensor] = {}
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.dtype in _ONNX_TYPES and not tensor.is_sparse:
            found[name] = tensor.detach()  # no autograd record of the trace: the Q/DQ computes in place
    return found


def attach_weights(proto: onnx.ModelProto, weights: Mapping[str, torch.Tensor], target_path: Path | None,
                   stream: bool) -> None:
    """Make the inputs of ``proto`` named in ``weights`` (graph input name -> tensor) initializers over those
    tensors; one that no node reads is dropped. With ``stream`` (and a ``target_path``), tensors over
    :data:`~workbench.export.onnx_file.SMALL_TENSOR` bytes go to a temporary data file beside ``target_path``
    (``external_data_file`` finds it), written from the tensors' own memory. In place."""
    read = {name for node in proto.graph.node for name in node.input}
    taken = [value.name for value in proto.graph.input if value.name in weights]
    data_file = temporary_name(target_path, ".export.onnx.data") if stream and target_path is not None else None
    initializers = []
    try:
        with open(data_file, "wb") if data_file is not None else contextlib.nullcontext() as out:
            offset = 0
            for name in taken:
                if name not in read:
                    continue
                tensor = weights[name].detach().cpu().contiguous()
                raw = _bytes_of(tensor)
                if out is None or raw.nbytes <= SMALL_TENSOR:
                    initializers.append(_inline(name, tensor, raw))
                    continue
                padding = -offset % DATA_ALIGNMENT
                out.write(bytes(padding))
                offset += padding
                out.write(raw)  # the tensor's own memory: no copy of the weights is made
                initializers.append(_external(name, tensor, data_file.name, offset, raw.nbytes))
                offset += raw.nbytes
    except BaseException:
        if data_file is not None:
            data_file.unlink(missing_ok=True)
        raise
    kept = [value for value in proto.graph.input if value.name not in weights]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.graph.initializer.extend(initializers)


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes in place, as a flat uint8 array over its memory (little-endian, as ONNX stores raw
    data, on the machines torch runs on)."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)  # numpy has no bfloat16: the same bits
    return tensor.reshape(-1).numpy().view(np.uint8)


def _header(name: str, tensor: torch.Tensor) -> onnx.TensorProto:
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = _ONNX_TYPES[tensor.dtype]
    proto.dims.extend(tensor.shape)
    return proto


def _inline(name: str, tensor: torch.Tensor, raw: np.ndarray) -> onnx.TensorProto:
    proto = _header(name, tensor)
    proto.raw_data = raw.tobytes()
    return proto


def _external(name: str, tensor: torch.Tensor, location: str, offset: int, length: int) -> onnx.TensorProto:
    proto = _header(name, tensor)
    proto.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value
    return proto
