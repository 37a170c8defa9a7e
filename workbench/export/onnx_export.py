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
* The fast path: where the TorchScript trace records the graph torch.export would (float inputs, INT8
  quantizers, no recurrent layer, and a trace that reads no tensor value into Python and computes no
  shape at run time: :func:`~workbench.export.exporters.fast_path_refusal`), ``"auto"`` takes the
  TorchScript exporter first, 2-4x faster on a CNN. Its graph has the same Q/DQ, the same node names
  after modules and quantizers, and the same outputs; two operations are spelled as TorchScript (and
  Model Optimizer's export) spell them: ``GlobalAveragePool`` and ``Flatten`` where torch.export writes
  ``ReduceMean`` and ``Reshape``. A fast graph that fails validation is exported again with torch.export
  (the report's notes say why).
* Validation, on a temporary file next to the target: ``onnx.checker`` (full check), an onnxruntime
  CPU session on the sample inputs, and the outputs compared with the fake-quant PyTorch model (max
  abs diff, cosine). During that comparison the quantizers compute ONNX's rounding
  (``round(x / scale)``; see :mod:`workbench.quant.kernels.fake_quant`) so a single layer matches to float
  rounding; their rounding is restored afterwards. Only a valid file is renamed to ``path``.
* A graph whose weights exceed ``external_data_threshold`` (protobuf cannot encode a message over
  2 GB) keeps them in ``<path>.data``. The torch.export-based exporter's graph is written from onnx_ir
  straight to a temporary data file beside ``path``; the naming passes, the opset conversion and the
  validation then work on the graph without its weights (checker and onnxruntime read the files), so
  no step serialises the whole model. Both files are renamed into place together, or removed.
  onnxruntime takes the weights from the model's own tensors where their bytes equal the data file's
  (:func:`~workbench.export.validation.shared_weights`) and runs each weight's Q/DQ next to the layer that
  reads it, so the validation holds no second copy of the weights. The TorchScript exporter writes its graph
  without the weights, which are attached from the model's tensors
  (:mod:`~workbench.export.torchscript_weights`), streamed the same way over 8 MB.
  The TorchScript exporter cannot write a graph over 2 GB: such a model never falls back to it, and the
  error says why the torch.export-based exporter failed.

The parts live by idea: :mod:`~workbench.export.export_job` (what the steps share),
:mod:`~workbench.export.capture` (plan, reference outputs, the exporter's run, post-processing),
:mod:`~workbench.export.file_checks` (checker, onnxruntime at every shape, the report, the threshold),
:mod:`~workbench.export.parity_checks` and :mod:`~workbench.export.parity` (more batches, a failure located and
classified), :mod:`~workbench.export.reference` (sample inputs, quantizer checks, the fake-quant reference run),
:mod:`~workbench.export.exporters` (dynamo and TorchScript), :mod:`~workbench.export.validation` (node names,
onnxruntime parity, amax table) and :mod:`~workbench.export.report`; this module is the one entry point that runs
them in order, then commits the file and writes the side files.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from workbench import __version__
from workbench.export.capture import (
    capture,
    fix_sequence_length,
    name_outputs,
    plan_job,
    post_process_graph,
    run_references,
)
from workbench.export.errors import ExportValidationError, UnrolledSequenceError
from workbench.export.export_job import ExportJob, ValidationChecks
from workbench.export.exporters import (
    FAST_PATH_NOTE,
    Exporter,
    first_line,
)
from workbench.export.file_checks import build_report, enforce_parity, validate
from workbench.export.formats import (
    to_trt_fp8_ops,
)
from workbench.export.memory import release_freed_memory
from workbench.export.onnx_file import (
    EXTERNAL_DATA_THRESHOLD,
    external_data_file,
    relocate_external_data,
    stage,
    write_onnx,
)
from workbench.export.opset import DEFAULT_OPSET, FORMAT_OPSET, default_opset
from workbench.export.parity_checks import not_validated
from workbench.export.provenance import WRITER
from workbench.export.reference import (
    rounding,
    sample_call,
    without_cache,
)
from workbench.export.report import ExportReport, OutputParity, report_json
from workbench.export.tensorrt import (
    DEFAULT_TRT_VERSION,
    activation_scales,
    calibration_cache_text,
    strip_qdq,
    write_json_atomic,
    write_text_atomic,
)
from workbench.export.validation import (
    amax_of,
    amax_table,
    amax_table_of,
)
from workbench.quant.algorithms.snapshot import ModelSnapshot

logger = logging.getLogger(__name__)

__all__ = ["export_qdq_onnx", "ExportReport", "OutputParity", "Exporter", "amax_table", "report_json"]


# ----- the entry point --------------------------------------------------------------------------


def export_qdq_onnx(model: nn.Module,
                    sample_inputs: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                    path: str | os.PathLike, *, opset: int = DEFAULT_OPSET, input_names: Sequence[str] | None = None,
                    output_names: Sequence[str] | None = None, output: str | None = None,
                    outputs: Sequence[str] | None = None, dynamic_batch: bool = True,
                    exporter: Exporter = "auto", min_cosine: float = 0.999, max_abs_diff: float | None = None,
                    amax_json_path: str | os.PathLike | None = None,
                    calibration_cache_path: str | os.PathLike | None = None,
                    float_onnx_path: str | os.PathLike | None = None,
                    trt_version: int = DEFAULT_TRT_VERSION,
                    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
                    fp8_ops: str = "standard", static_sequence: bool = False, strict: bool = False,
                    parity_batches: Sequence[torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]]
                    | None = None, parity_outputs: Callable[[int, Any], None] | None = None) -> ExportReport:
    """Export a fake-quant model to a QDQ ONNX file and validate it before it appears at ``path``.

    The steps, each a function of this module: :func:`plan_job` (arguments, quantizers, opset),
    :func:`run_references` (the fake-quant outputs onnxruntime must match), :func:`capture` (the ONNX
    exporter), :func:`post_process_graph` (names, counts, structural warnings), :func:`validate`
    (checker, onnxruntime parity), :func:`build_report`, :func:`_commit` and :func:`_write_side_files`.

    Args:
        model: the quantized, calibrated model (quantized modules, QuantAdd/QuantConcat, placement rules).
        sample_inputs: a tensor or a tuple of tensors (the model's positional inputs), or a dict of
            tensors passed by keyword (``input_ids``, ``attention_mask``). They are traced, run through
            onnxruntime and compared with PyTorch.
        path: where the ``.onnx`` file goes. Nothing is written there unless validation passes.
        opset: ONNX opset of the file (:func:`~workbench.opsets.check_opset`: from 13, which per-channel Q/DQ
            needs, to the installed onnx's newest; the default, 17, suits TensorRT 8.6).
        input_names: graph input names (default: the forward's argument names, ``x`` as ``input``).
        output_names: graph output names (default: after the ``ModelOutput``/dict key they come from, else
            ``output``/``output_N``).
        output: one part of the model's output to export alone (a ``ModelOutput``/dict key such as
            ``logits``, or a tuple index; see :func:`~workbench.quant.algorithms.batches.select_output`).
        outputs: the outputs to export, by name (``["logits", "pred_boxes"]``; see
            :mod:`workbench.export.outputs`). Default, without ``output``: every tensor the model returns, each
            an ONNX output named after its field (never a cache object). A Hugging Face model whose config has
            ``use_cache=True`` is exported with it off (the report says so). An output named as an input is
            renamed (``sample`` -> ``sample_out``) and the report says so.
        dynamic_batch: make dimension 0 of every input and output symbolic ("batch"), and axis 1 of
            integer inputs (token ids, masks: "sequence"; an encoder-decoder's ``decoder_*`` inputs, or any
            length torch.export finds independent, get their own name) where the model allows it, and check in
            onnxruntime that another batch size and other (unequal) lengths work too.
        exporter: ``"auto"`` (torch.export-based, TorchScript where that cannot do it), ``"dynamo"`` or
            ``"torchscript"``.
        min_cosine: the lowest acceptable cosine similarity of every output with PyTorch's.
        max_abs_diff: optional bound on the largest absolute difference.
        amax_json_path: also write every quantizer's amax and scale as JSON.
        calibration_cache_path: also write a TensorRT calibration cache (implicit quantization) for the
            activation quantizers; see :mod:`workbench.export.tensorrt`.
        float_onnx_path: also write the graph without Q/DQ, with the tensor names the cache uses.
        trt_version: the TensorRT version in the cache header (8601 for 8.6.1).
        external_data_threshold: a graph larger than this many bytes (default: protobuf's 2 GB limit)
            keeps its weights in ``<path>.data`` beside the file, validated the same way.
        fp8_ops: how FP8 Q/DQ is written: ``"standard"`` (opset 19 QuantizeLinear to float8e4m3fn) or
            ``"trt"`` (TensorRT's custom ops, validated in the standard form first).
        static_sequence: keep the sample's sequence length (axis 1 of token inputs) fixed: for a model that
            loops over the sequence in Python (a scan the trace unrolls at the sample's length). A graph that
            declares the length dynamic and does not run at another is refused with this option named.
        strict: refuse the file when the parity check fails. Without it the file is written marked "not
            validated" (``report.validated`` False) with the diagnosis of where and why onnxruntime and the
            model part (:mod:`workbench.export.parity`) in ``report.parity_diagnosis`` and the warnings.
        parity_batches: more inputs (each shaped like ``sample_inputs``, other batch sizes where the batch
            is dynamic) whose outputs onnxruntime must match too, one parity row each ("batch 2", ...).
        parity_outputs: called with each parity batch's index and the model's own output on it (as it returns it,
            computed with ONNX's rounding as the parity check compares it), so that a caller measuring the model on
            the same batches need not run them again; not called for a batch the check skips, nor when quantizers
            without amax are exported in float (the model as exported then differs from the model as called).

    Returns:
        An :class:`ExportReport` with the exporter used, Q/DQ counts, opset, file size, times and the
        onnxruntime-vs-PyTorch figures.

    Enabled quantizers that calibration never reached (no amax while others have one) are exported
    disabled, in float, and listed in the report's warnings; a model with no calibrated quantizer at
    all is refused.

    Raises:
        TypeError, ValueError: bad arguments.
        QuantizerStateError: no quantizer is calibrated, or one is still calibrating or not INT8.
        SampleInputError: the model fails on the sample inputs (the message names the layer and inputs).
        UnsupportedOperationError: the exporter cannot translate an operation (named, with its layer).
        ExportValidationError: the file failed onnx.checker or onnxruntime, or (with ``strict``) the parity
            check; its message then carries the diagnosis.
        ExportError: any other export failure. In every case no file is left at ``path``.
    """
    started = time.perf_counter()
    job = plan_job(model, sample_inputs, path, opset=opset, input_names=input_names, output_names=output_names,
                output=output, outputs=outputs, dynamic_batch=dynamic_batch, exporter=exporter,
                external_data_threshold=external_data_threshold, fp8_ops=fp8_ops)
    job.static_sequence = static_sequence
    job.extra = [sample_call(batch) for batch in parity_batches or ()]
    job.parity_outputs = parity_outputs
    # train/eval modes (one by one: some layers may be frozen) and quantizer state go back afterwards
    entry_state = ModelSnapshot(model)
    model.eval()
    if job.unreached:
        for quantizer in job.unreached:  # back on when entry_state is restored
            quantizer.disable()
        job.log.add("unreached_quantizers", f"{len(job.unreached)} enabled quantizer(s) without amax (never reached "
                    "during calibration) exported in float, without Q/DQ: "
                    + ", ".join(job.names[id(q)] for q in job.unreached))
    try:
        with without_cache(model) as cache_note:
            if cache_note:
                job.log.add("use_cache_off", cache_note)
            with rounding(list(job.active.values()), "onnx"):
                run_references(job)
            release_freed_memory()  # each step's freed weight-sized blocks go back before the next (see memory.py)
            name_outputs(job)
            capture(job)
        try:
            try:
                try:
                    report, checks = _check(job, min_cosine, max_abs_diff)
                except UnrolledSequenceError:  # a scan unrolled at the sample's length: fix the length
                    _discard_staged(job)
                    fix_sequence_length(job)
                    with without_cache(model):
                        capture(job)
                    report, checks = _check(job, min_cosine, max_abs_diff)
            except ExportValidationError as error:
                if job.exporter_note != FAST_PATH_NOTE:
                    raise
                # the trace looked clean but its graph is not the model's: torch.export records it instead
                _discard_staged(job)
                job.fast_path = False
                job.log.add("fast_path_failed", f"the TorchScript fast path's graph failed validation "
                                                f"({first_line(error)}); exported with the torch.export-based "
                                                "exporter")
                with without_cache(model):
                    capture(job)
                report, checks = _check(job, min_cosine, max_abs_diff)
        except ExportValidationError as error:
            if error.stage != "parity" or error.report is None or job.staged is None:
                raise
            report = not_validated(job, error, strict, min_cosine)
        _commit(job, report)
        _write_side_files(job, report, amax_json_path=amax_json_path, calibration_cache_path=calibration_cache_path,
                          float_onnx_path=float_onnx_path, trt_version=trt_version)
        report.total_time_s = time.perf_counter() - started
        logger.info("QDQ export: %s", report.summary())
        return report
    finally:
        _discard_staged(job)
        entry_state.restore()


def _discard_staged(job: ExportJob) -> None:
    """Remove the validated-but-uncommitted file, or the exporter's temporary weights file."""
    if job.staged is not None:
        job.staged.discard()
    elif job.exported_data is not None:
        job.exported_data.unlink(missing_ok=True)
    job.staged = job.exported_data = None


def _check(job: ExportJob, min_cosine: float, max_abs_diff: float | None) -> tuple[ExportReport, ValidationChecks]:
    """Name and count the captured graph, validate it, and refuse it when the parity is short."""
    post_process_graph(job)
    release_freed_memory()
    checks = validate(job)
    release_freed_memory()
    report = build_report(job, checks)
    sequence = checks.sequence_check
    sample_agrees = all(p.cosine >= min_cosine for p in checks.parity)
    if sequence is not None and not sequence.cosine >= min_cosine and sample_agrees:
        # runs at a longer sequence but computes it wrong while the sample agrees: a loop unrolled at the sample's
        # length (RWKV's recurrence), as one that does not run at all: fix the length (the handler of _export)
        raise UnrolledSequenceError(f"the graph computes a longer sequence wrongly (cosine {sequence.cosine:.6f}) "
                                    "while the sample's length agrees")
    enforce_parity(report, checks, min_cosine, max_abs_diff)
    return report, checks


# ----- committing the checked file ----------------------------------------------------------------


def _commit(job: ExportJob, report: ExportReport) -> None:
    """Rename the validated file (and its weights' file) into place; FP8 in TensorRT's custom-op form is
    written now, from the graph validated in the standard form."""
    formats, opset_notes = job.formats, job.opset_notes
    if job.fp8_ops == "trt" and "fp8" in formats:
        # validated in the standard form (onnxruntime cannot run TensorRT's custom ops); written in TensorRT's
        job.staged.discard()
        job.staged = None
        # FP8 in this form needs no opset 19; the other formats keep what they need
        trt_opset = max([job.requested_opset] + [FORMAT_OPSET[f] for f in formats if f != "fp8"])
        trt_proto, trt_notes = to_trt_fp8_ops(job.proto, trt_opset)
        job.log.extend("fp8_trt_form", trt_notes)
        report.format_notes.extend(trt_notes)
        onnx.checker.check_model(trt_proto)
        report.opset = default_opset(trt_proto)
        if report.opset < job.opset:  # the opset raised for float8 types did not last: no note about it
            job.log.remove(opset_notes)
            report.format_notes = [w for w in report.format_notes if w not in opset_notes]
        job.staged = stage(trt_proto, job.path, job.external_data_threshold)
        report.file_size = job.staged.size
    staged, path = job.staged, job.path
    external = staged.external_data_path
    folded = staged.fold and staged.data_path is not None  # streamed during export, one file now
    staged.commit()
    job.staged = job.exported_data = None
    job.folded = folded
    if external is not None:  # the graph in memory names the data file as the one on disk does
        relocate_external_data(job.proto, external.name)
    report.external_data_path = None if external is None else str(external)
    if external is not None:  # the graph now names the data file by its final (shorter) name
        report.file_size = path.stat().st_size + external.stat().st_size
    elif folded:
        report.file_size = path.stat().st_size


def _write_side_files(job: ExportJob, report: ExportReport, *, amax_json_path: str | os.PathLike | None,
                      calibration_cache_path: str | os.PathLike | None, float_onnx_path: str | os.PathLike | None,
                      trt_version: int) -> None:
    """The amax JSON, the TensorRT calibration cache and the float graph, each written atomically."""
    path, proto, swapped = job.path, job.proto, job.swapped
    if amax_json_path is not None:
        table = {"writer": f"{WRITER} {__version__}", "model": type(job.model).__name__, "onnx": path.name,
                 "quantizers": amax_table_of(job.model, job.params)}
        report.amax_json_path = str(write_json_atomic(amax_json_path, table))
    if calibration_cache_path is not None or float_onnx_path is not None:
        amax_by_scale = {f"{s.quantizer_name}.scale": amax_of(s) for s in swapped.values()
                         if not s.params.per_channel and s.params.format == "int8"}  # INT8 ranges only
        if calibration_cache_path is not None:
            scales = activation_scales(proto, amax_by_scale)
            report.calibration_cache_path = str(write_text_atomic(
                calibration_cache_path, calibration_cache_text(scales, trt_version)))
        if float_onnx_path is not None:
            # a folded graph's weights are in the committed file now, no longer in the temporary data file
            float_graph = strip_qdq(onnx.load(str(path)) if job.folded else proto)
            if external_data_file(float_graph, path.parent) is not None:
                # its own data file: the weights are read in (never serialised in the proto) and written out
                onnx.external_data_helper.load_external_data_for_model(float_graph, str(path.parent))
            report.float_onnx_path = str(write_onnx(float_graph, Path(float_onnx_path), job.external_data_threshold,
                                                    keep_proto=False))


