"""Export without the whole model (issue 37 point 4): a model whose weights are in a lazily opened checkpoint
(``hf:`` safetensors, :class:`~workbench.sources.lazy_checkpoint.LazyCheckpoint`) is exported by the ordinary
:func:`~workbench.export.onnx_export.export_qdq_onnx` with its weights streamed
(:mod:`workbench.export.streamed_weights`):

* traced with FakeTensors in place of the weights (torch.export-based exporter only: the TorchScript tracer needs
  real tensors), the graph is the one an eager export writes;
* every initializer is read from the checkpoint, quantized (an INT4 weight's values, two a byte once packed; an
  FP8 weight's E4M3 values) and written to the external data file one tensor at a time;
* the fake-quant forwards (references, parity) page the weights in about one block at a time; the file is validated
  block by block (:mod:`workbench.export.blockwise_validation`: one piece of the graph at a time, each reading only
  its own weights from the data file), with the whole graph's outputs.

:func:`export_lazily_opened` is what the Session's export job calls: the streamed route where it applies, today's
(every weight read first) where it does not, and the report says which was taken and why.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from torch import nn

from workbench.export.errors import ExportError, ExportValidationError, QuantizerStateError
from workbench.export.onnx_export import export_qdq_onnx
from workbench.export.report import ExportReport
from workbench.export.streamed_weights import StreamedWeights, StreamingUnsupported, paged, streaming
from workbench.sources.errors import SourceError
from workbench.sources.lazy_checkpoint import LazyCheckpoint

__all__ = ["export_streamed", "export_lazily_opened", "ROUTE_KIND"]

logger = logging.getLogger(__name__)

ROUTE_KIND = "export_route"  # the report's note saying which route wrote the file (workbench.export.notes)


def _source_error(error: BaseException) -> SourceError | None:
    """The checkpoint's own error somewhere in ``error``'s chain (a shard gone or damaged while exporting)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, SourceError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def export_streamed(model: nn.Module, checkpoint: LazyCheckpoint, float_model: nn.Module, sample_inputs: Any,
                    path: str | os.PathLike, **options: Any) -> tuple[ExportReport, StreamedWeights]:
    """:func:`~workbench.export.onnx_export.export_qdq_onnx` of ``model`` (quantized, sharing its parameters with
    ``float_model``, the model ``checkpoint`` is attached to) with its weights streamed from ``checkpoint``; returns
    the report and what was read.

    Raises:
        StreamingUnsupported: the streamed route cannot write this model (nothing was written).
        ExportError: the export failed (a checkpoint tensor that cannot be read is named with its file); no file is
            left at ``path``.
    """
    if options.get("exporter", "auto") == "torchscript":
        raise StreamingUnsupported("the TorchScript exporter traces real weights")
    options["exporter"] = "dynamo"
    # weights an earlier job left in memory stay there and are exported from it: a job may have changed them
    # (smoothing folds its scales into them, fine-tuning trains them), the checkpoint would give them back unchanged
    weights = StreamedWeights(checkpoint, float_model)
    try:
        with streaming(weights), paged():
            report = export_qdq_onnx(model, sample_inputs, path, **options)
    except StreamingUnsupported:
        raise
    except Exception as error:
        source = _source_error(error)
        if source is not None:
            raise ExportError(f"{source} Nothing was written to {path}.") from error
        raise
    return report, weights


def export_lazily_opened(model: nn.Module, checkpoint: LazyCheckpoint | None, float_model: nn.Module,
                         sample_inputs: Any, path: str | os.PathLike, *, materialise: Callable[[], None],
                         **options: Any) -> ExportReport:
    """Export ``model`` as :func:`export_qdq_onnx` does; a model opened lazily (``checkpoint``) goes the streamed
    route (:func:`export_streamed`), or, where that cannot write it, today's: ``materialise()`` reads every weight,
    then the ordinary export runs. The report's notes say which route wrote the file."""
    if checkpoint is None:
        return export_qdq_onnx(model, sample_inputs, path, **options)
    try:
        report, weights = export_streamed(model, checkpoint, float_model, sample_inputs, path, **dict(options))
    except (StreamingUnsupported, ExportError) as error:
        # the same graph and quantizers without streaming: a file that fails its checks, or a quantizer that
        # cannot be exported, would fail the same way; a checkpoint that cannot be read cannot be loaded either
        if isinstance(error, QuantizerStateError | ExportValidationError) or _source_error(error) is not None:
            raise
        logger.info("the streamed export failed (%s); exporting with every weight in memory", error)
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        materialise()
        report = export_qdq_onnx(model, sample_inputs, path, **options)
        _note(report, f"exported with every weight in memory: the streamed route cannot write this model ({why})")
        return report
    read = len(set(weights.written))
    held = weights.peak_paged
    amount = f"{held / 1024 ** 2:.1f} MiB" if held >= 1024 ** 2 else f"{held / 1024:.1f} KiB"
    _note(report, f"streamed from the checkpoint: traced without weights, {read} initializers read (quantized where "
                  f"they are) and written one at a time; the forwards held at most {amount} of weights at once (of "
                  f"{checkpoint.nbytes / 1024 ** 2:.1f} MiB)")
    return report


def _note(report: ExportReport, message: str) -> None:
    report.notes.append(message)
    report.entry_kinds[message] = ROUTE_KIND
