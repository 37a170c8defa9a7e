"""The weights of a streamed export (issue 37 point 4): a lazily opened checkpoint's model exported without ever
holding all its weights.

While :func:`streaming` is active (:mod:`workbench.export.streamed_export` runs the ordinary export inside it), the
export's steps ask this module where weights come from:

* The fake-quant forwards (reference outputs, parity) run with the weights paged in as operations use them, about
  one block at a time (:meth:`~workbench.sources.lazy_checkpoint.LazyCheckpoint.streamed`).
* The quantizers' export parameters are computed with the weights on meta (:func:`weights_on_meta`): an INT4, FP8 or
  NVFP4 weight's quantized values are then meta too, computed again from the checkpoint when written.
* The trace (:func:`traced_without_weights`): every weight still on meta is replaced, for the capture only, by a CPU
  FakeTensor of its shape and dtype (torch.export traces it as it would the real one; torch.onnx's
  ``enable_fake_mode`` does the same). The ONNX exporter then gives each such initializer no value;
  :func:`fill_initializers` gives it an ``onnx_ir.LazyTensor`` that reads the weight from the checkpoint (and
  quantizes it, for a quantized weight) each time its bytes are asked for, *before* the exporter's optimizer runs.
  The optimizer therefore folds exactly what it folds in an eager export (small weights' casts, read and folded in
  memory; weights over its 8192-element limit stay initializers), and ``onnx_ir.save`` writes the initializers to
  the external data file one at a time: each weight is read, quantized and packed as it is written.
* Validation takes no weights from the model's tensors (they are on meta): it runs the file block by block, each
  piece's weights read from the data file (:mod:`workbench.export.blockwise_validation`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.export.errors import ExportError
from workbench.export.qdq import QDQStandIn, export_params
from workbench.sources.lazy_checkpoint import LazyCheckpoint

__all__ = ["StreamedWeights", "StreamingUnsupported", "streaming", "active", "paged", "weights_on_meta",
           "traced_without_weights", "fill_initializers"]


class StreamingUnsupported(Exception):
    """The model has a tensor on meta that the streamed export cannot write (the ordinary route takes over)."""


@dataclass
class StreamedWeights:
    """The checkpoint a streamed export reads from, its model, and what it read (for the report and the tests)."""

    checkpoint: LazyCheckpoint
    model: nn.Module
    # id of a fake tensor standing in during the trace -> (what it is, how to compute its real value)
    sources: dict[int, tuple[str, Callable[[], torch.Tensor]]] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)  # initializers computed from the checkpoint, in order
    paging: Any = None  # the active paging mode of the forwards (LazyCheckpoint.streamed), while one runs
    peak_paged: int = 0  # the most bytes of weights the forwards held at once


_ACTIVE: ContextVar[StreamedWeights | None] = ContextVar("workbench_streamed_weights", default=None)


@contextlib.contextmanager
def streaming(weights: StreamedWeights) -> Iterator[StreamedWeights]:
    """Within it, the export steps take their weights from ``weights`` (see the module's docstring)."""
    token = _ACTIVE.set(weights)
    try:
        yield weights
    finally:
        _ACTIVE.reset(token)


def active() -> StreamedWeights | None:
    """The streamed export's weights, or None for an ordinary export."""
    return _ACTIVE.get()


@contextlib.contextmanager
def paged() -> Iterator[None]:
    """Forwards of the model within it read each weight when an operation uses it and release the ones read
    longest ago past about one block (nothing changes for an ordinary export, or when already paging)."""
    weights = active()
    if weights is None or weights.paging is not None:
        yield
        return
    with weights.checkpoint.streamed(weights.model) as paging:
        weights.paging = paging
        try:
            yield
        finally:
            weights.peak_paged = max(weights.peak_paged, paging.peak)
            weights.paging = None


@contextlib.contextmanager
def weights_on_meta() -> Iterator[None]:
    """Nothing within it pages weights in: the quantizers' export parameters are computed from the weights' shapes
    only (an INT4 weight's values are meta until written)."""
    weights = active()
    if weights is None or weights.paging is None:
        yield
        return
    with weights.paging.paused():
        try:
            yield
        except ExportError:  # the quantizers' own problems: the same without streaming
            raise
        except RuntimeError as error:  # an operation that takes no meta tensor
            raise StreamingUnsupported(f"the export parameters cannot be computed from the weights' shapes "
                                       f"({str(error).splitlines()[0]})") from error


def _fake(mode: Any, tensor: torch.Tensor) -> torch.Tensor:
    with mode:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")


@contextlib.contextmanager
def traced_without_weights(root: nn.Module, quantizers: dict[str, Any]) -> Iterator[None]:
    """For the capture: every tensor of ``root`` on meta (a weight not read, a quantized weight's values) is a CPU
    FakeTensor within it, and its source is remembered for :func:`fill_initializers`; the meta tensors are back
    afterwards. ``quantizers``: the active quantizers by name (a stand-in's values are computed by its quantizer).

    Raises:
        StreamingUnsupported: a tensor on meta that is neither a checkpoint weight nor a quantized weight's values.
    """
    weights = active()
    if weights is None:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    with weights_on_meta():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        checkpoint = weights.checkpoint
        swapped: list[tuple[dict, str, torch.Tensor]] = []
        fakes: dict[int, torch.Tensor] = {}
        # a quantized weight's values (an INT4/FP8/NVFP4 stand-in's buffers): its quantizer and the layer's weight
        values_of: dict[int, tuple[Any, nn.Parameter]] = {}
        for layer in root.modules():
            stand_in = layer._modules.get("_weight_quantizer")
            if isinstance(stand_in, QDQStandIn) and isinstance(getattr(layer, "weight", None), nn.Parameter):
                values_of[id(stand_in)] = (quantizers[stand_in.quantizer_name], layer.weight)
        try:
            for module in root.modules():
                for slots, is_parameter in ((module._parameters, True), (module._buffers, False)):
                    for attr, tensor in list(slots.items()):
                        if tensor is None or not tensor.is_meta:
                            continue
                        if id(tensor) not in fakes:
                            fake = _fake(mode, tensor)
                            if is_parameter:
                                fake = nn.Parameter(fake, requires_grad=False)
                            fakes[id(tensor)] = fake
                            weights.sources[id(fake)] = _source(checkpoint, module, attr, tensor, values_of)
                        slots[attr] = fakes[id(tensor)]
                        swapped.append((slots, attr, tensor))
            yield
        finally:
            for slots, attr, tensor in reversed(swapped):
                slots[attr] = tensor


def _source(checkpoint: LazyCheckpoint, module: nn.Module, attr: str, tensor: torch.Tensor,
            values_of: dict[int, tuple[Any, nn.Parameter]]) -> tuple[str, Callable[[], torch.Tensor]]:
    """What a meta tensor is and how to compute it: a checkpoint weight read in its dtype, or a quantized weight's
    values computed by its quantizer from the weight read, as the eager export computes them."""
    key = checkpoint.key_of(tensor) if isinstance(tensor, nn.Parameter) else None
    if key is not None:
        return key, lambda: checkpoint.read(key, tensor.dtype)
    if id(module) in values_of and attr in ("values", "block_scales"):
        quantizer, weight = values_of[id(module)]
        key = checkpoint.key_of(weight)
        if key is not None:
            def compute() -> torch.Tensor:
                return getattr(export_params(quantizer, checkpoint.read(key, weight.dtype)), attr)
            return f"{key} ({attr} of {module.quantizer_name})", compute
    raise StreamingUnsupported(f"{type(module).__name__}.{attr} is on meta and is no weight of the checkpoint")


def fill_initializers(model: Any) -> bool:
    """Give every initializer of ``model`` (an onnx_ir model from the exporter) that holds a stand-in FakeTensor a
    value computed from the checkpoint when its bytes are read; returns False when no streamed export is active.

    Raises:
        StreamingUnsupported: an initializer is a FakeTensor of unknown origin.
    """
    weights = active()
    if weights is None:
        return False
    import onnx_ir
    from onnx_ir.tensor_adapters import TorchTensor
    from torch._subclasses.fake_tensor import FakeTensor

    for name, value in model.graph.initializers.items():
        held = value.const_value
        raw = getattr(held, "raw", None)
        if not isinstance(raw, FakeTensor):
            continue
        source = weights.sources.get(id(raw))
        if source is None:
            raise StreamingUnsupported(f"initializer {name!r} has no value and no known source in the checkpoint")
        label, compute = source

        def read(label: str = label, compute: Callable[[], torch.Tensor] = compute, name: str = name) -> Any:
            weights.written.append(label)
            return TorchTensor(compute().contiguous(), name=name)

        value.const_value = onnx_ir.LazyTensor(read, dtype=held.dtype, shape=held.shape, name=name)
    return True
