"""The TorchScript exporter's graph without its weights, and the weights attached from the model's own tensors.

torch.onnx's TorchScript exporter builds the graph with its weights in C++, serialises it and hands the bytes
to Python, which parses them again: the weights are held three or four times at once (7x the fp32 size at the
peak of a whole export, ``bench/export_speed.py``). Exported with ``export_params=False`` the graph is a few
kilobytes and names every parameter and buffer it reads as a graph input, by its qualified name
(``model.conv1.weight``, ``model.conv1._weight_quantizer.scale``). :func:`attach_weights` turns those inputs into
initializers read straight from the tensors: inside the graph for a small model, else written one by one to a
data file beside the target, the form the torch.export-based path streams its weights to (the staging, the
validation and the fold into one file on commit are shared, see :mod:`workbench.export.onnx_file`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper
from torch import nn

from workbench.export.onnx_file import SMALL_TENSOR, temporary_name

__all__ = ["attach_weights", "DATA_ALIGNMENT"]

# each tensor in the data file starts on a page boundary, so that a reader may map it in place
DATA_ALIGNMENT = 4096


def attach_weights(proto: onnx.ModelProto, model: nn.Module, graph_inputs: list[str], target_path: Path | None,
                   stream: bool) -> bool:
    """Make each input of ``proto`` that is not one of the model's ``graph_inputs`` the initializer it stands for.

    Each such input must be a parameter or buffer of ``model`` by its qualified name; with ``stream`` (and a
    ``target_path``), tensors over :data:`~workbench.export.onnx_file.SMALL_TENSOR` bytes go to a temporary data
    file beside ``target_path`` (``external_data_file`` finds it) instead of the graph. In place.

    Returns False, with ``proto`` and the disk unchanged, when an input is no such tensor (a constant TorchScript
    folded, named ``onnx::...``) or a tensor has no numpy type (bfloat16): the caller exports with the weights.
    """
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    wanted = set(graph_inputs)
    weights = [value for value in proto.graph.input if value.name not in wanted]
    if any(value.name not in tensors or tensors[value.name].dtype == torch.bfloat16 for value in weights):
        return False
    stream = stream and target_path is not None
    data_file = temporary_name(target_path, ".export.onnx.data") if stream else None
    initializers = []
    try:
        with open(data_file, "wb") if data_file is not None else contextlib.nullcontext() as out:
            offset = 0
            for value in weights:
                array = tensors[value.name].detach().cpu().contiguous().numpy()
                if out is None or array.nbytes <= SMALL_TENSOR:
                    initializers.append(numpy_helper.from_array(array, value.name))
                    continue
                padding = -offset % DATA_ALIGNMENT
                out.write(bytes(padding))
                offset += padding
                out.write(array.data)  # the tensor's own memory: no copy of the weights is made
                initializers.append(_external(value.name, array, data_file.name, offset))
                offset += array.nbytes
    except BaseException:
        if data_file is not None:
            data_file.unlink(missing_ok=True)
        raise
    kept = [value for value in proto.graph.input if value.name in wanted]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.graph.initializer.extend(initializers)
    return True


def _external(name: str, array, location: str, offset: int) -> onnx.TensorProto:
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, entry in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
        item = tensor.external_data.add()
        item.key, item.value = key, entry
    return tensor
