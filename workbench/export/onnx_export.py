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

The parts live by idea: :mod:`~workbench.export.reference` (sample inputs, quantizer checks, the
fake-quant reference run), :mod:`~workbench.export.exporters` (dynamo and TorchScript),
:mod:`~workbench.export.validation` (node names, onnxruntime parity, amax table) and
:mod:`~workbench.export.report`; this module is the one entry point that runs them in order.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch
from torch import nn

from workbench import __version__
from workbench.export.errors import ExportValidationError, SampleInputError
from workbench.export.exporters import FAST_PATH_NOTE, Exporter, first_line, quiet, run_exporter, token_inputs
from workbench.export.formats import (
    FORMAT_NAMES,
    FP8_OPS,
    fold_int4_casts,
    format_counts,
    name_int4_weights,
    to_trt_fp8_ops,
)
from workbench.export.fp4 import needs_reference_evaluator, reference_session
from workbench.export.gemms import WeightGemms, weight_gemms
from workbench.export.memory import release_freed_memory
from workbench.export.network_dtype import bf16_opset, graph_float_type, needs_bfloat16_evaluator
from workbench.export.notes import ReportLog
from workbench.export.onnx_file import (
    EXTERNAL_DATA_THRESHOLD,
    StagedFile,
    external_data_file,
    relocate_external_data,
    stage,
    write_onnx,
)
from workbench.export.opset import DEFAULT_OPSET, FORMAT_OPSET, check_opset, default_opset
from workbench.export.provenance import WRITER
from workbench.export.qdq import ExportParams
from workbench.export.reference import (
    ExportCall,
    check_quantizers,
    default_input_names,
    first_quantizer_names,
    grow_batch,
    grow_sequence,
    rounding,
    run_reference,
    sample_call,
    stand_ins,
    traced_module_scopes,
    without_cache,
)
from workbench.export.report import ExportReport, OutputParity, ParityCheck, report_json
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
    compare,
    feeds,
    model_weights,
    ort_session,
    per_channel_activations,
    post_process,
    qdq_clips,
    range_inputs,
)
from workbench.quant.algorithms.batches import model_device
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.quant.nn.modules.quant_rnn import QuantLSTM
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

logger = logging.getLogger(__name__)

__all__ = ["export_qdq_onnx", "ExportReport", "OutputParity", "Exporter", "amax_table", "report_json"]


# ----- the entry point --------------------------------------------------------------------------


def export_qdq_onnx(model: nn.Module,
                    sample_inputs: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                    path: str | os.PathLike, *, opset: int = DEFAULT_OPSET, input_names: Sequence[str] | None = None,
                    output_names: Sequence[str] | None = None, output: str | None = None, dynamic_batch: bool = True,
                    exporter: Exporter = "auto", min_cosine: float = 0.999, max_abs_diff: float | None = None,
                    amax_json_path: str | os.PathLike | None = None,
                    calibration_cache_path: str | os.PathLike | None = None,
                    float_onnx_path: str | os.PathLike | None = None,
                    trt_version: int = DEFAULT_TRT_VERSION,
                    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
                    fp8_ops: str = "standard") -> ExportReport:
    """Export a fake-quant model to a QDQ ONNX file and validate it before it appears at ``path``.

    The steps, each a function of this module: :func:`_plan` (arguments, quantizers, opset),
    :func:`_run_references` (the fake-quant outputs onnxruntime must match), :func:`_capture` (the ONNX
    exporter), :func:`_post_process_graph` (names, counts, structural warnings), :func:`_validate`
    (checker, onnxruntime parity), :func:`_build_report`, :func:`_commit` and :func:`_write_side_files`.

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
        output: which part of the model's output to export (a ``ModelOutput``/dict key such as
            ``logits``, or a tuple index); default: see :func:`~workbench.quant.algorithms.batches.select_output`
            (a tensor or tuple of tensors whole, else the first tensor: never a cache object). A Hugging
            Face model whose config has ``use_cache=True`` is exported with it off (the report says so).
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
        ExportValidationError: the file failed onnx.checker, onnxruntime, or the parity check.
        ExportError: any other export failure. In every case no file is left at ``path``.
    """
    started = time.perf_counter()
    job = _plan(model, sample_inputs, path, opset=opset, input_names=input_names, output_names=output_names,
                output=output, dynamic_batch=dynamic_batch, exporter=exporter,
                external_data_threshold=external_data_threshold, fp8_ops=fp8_ops)
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
                _run_references(job)
            release_freed_memory()  # each step's freed weight-sized blocks go back before the next (see memory.py)
            _name_outputs(job)
            _capture(job)
        try:
            report, checks = _check(job, min_cosine, max_abs_diff)
        except ExportValidationError as error:
            if job.exporter_note != FAST_PATH_NOTE:
                raise
            # the trace looked clean but its graph is not the model's: torch.export records it instead
            _discard_staged(job)
            job.fast_path = False
            job.log.add("fast_path_failed", f"the TorchScript fast path's graph failed validation "
                                            f"({first_line(error)}); exported with the torch.export-based exporter")
            with without_cache(model):
                _capture(job)
            report, checks = _check(job, min_cosine, max_abs_diff)
        _commit(job, report)
        _write_side_files(job, report, amax_json_path=amax_json_path, calibration_cache_path=calibration_cache_path,
                          float_onnx_path=float_onnx_path, trt_version=trt_version)
        report.total_time_s = time.perf_counter() - started
        logger.info("QDQ export: %s", report.summary())
        return report
    finally:
        _discard_staged(job)
        entry_state.restore()


def _discard_staged(job: _Export) -> None:
    """Remove the validated-but-uncommitted file, or the exporter's temporary weights file."""
    if job.staged is not None:
        job.staged.discard()
    elif job.exported_data is not None:
        job.exported_data.unlink(missing_ok=True)
    job.staged = job.exported_data = None


def _check(job: _Export, min_cosine: float, max_abs_diff: float | None) -> tuple[ExportReport, _Checks]:
    """Name and count the captured graph, validate it, and refuse it when the parity is short."""
    _post_process_graph(job)
    release_freed_memory()
    checks = _validate(job)
    release_freed_memory()
    report = _build_report(job, checks)
    _enforce_parity(report, checks, min_cosine, max_abs_diff)
    return report, checks


# ----- the steps --------------------------------------------------------------------------------


@dataclass
class _Export:
    """What one export carries from step to step (filled in as the steps run)."""

    model: nn.Module
    path: Path
    call: ExportCall
    inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str] | None
    opset: int
    requested_opset: int
    dynamic_batch: bool
    exporter: Exporter
    external_data_threshold: int
    fp8_ops: str
    names: dict[int, str]
    active: dict[int, TensorQuantizer]
    params: dict[int, ExportParams]
    unreached: list[TensorQuantizer]
    formats: set[str]
    opset_notes: list[str]
    log: ReportLog
    # the fake-quant reference run (:func:`_run_references`)
    reference: list[torch.Tensor] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    distinct: int = 0
    grown: tuple[torch.Tensor, ...] | None = None  # one more sample, for the dynamic-batch check
    grown_reference: list[torch.Tensor] | None = None
    longer: tuple[torch.Tensor, ...] | None = None  # token inputs one position longer
    longer_reference: list[torch.Tensor] | None = None
    ranged: tuple[torch.Tensor, ...] | None = None  # random inputs in the sample's range
    ranged_reference: list[torch.Tensor] | None = None
    # the capture (:func:`_capture`) and the graph's figures (:func:`_post_process_graph`)
    proto: onnx.ModelProto | None = None
    used_exporter: str = ""
    exporter_note: str = ""
    swapped: dict = field(default_factory=dict)
    export_time_s: float = 0.0
    exported_data: Path | None = None  # a large graph's weights, in a temporary file until committed
    counts: dict[str, int] = field(default_factory=dict)
    by_format: dict[str, int] = field(default_factory=dict)
    gemms: WeightGemms | None = None
    staged: StagedFile | None = None  # the validated file beside ``path``, until committed
    folded: bool = False  # a streamed graph's weights folded into the committed file
    fast_path: bool = True  # "auto" may try the TorchScript fast path (off again when its graph fails validation)


@dataclass
class _Checks:
    """onnxruntime against the fake-quant model (:func:`_validate`): the named checks, and every row of the
    report's parity table (each check that contributes to the headline, one row each)."""

    parity: list[OutputParity]
    dynamic_check: OutputParity | None
    sequence_check: OutputParity | None
    range_check: OutputParity | None
    optimized_check: OutputParity | None
    started: float
    rows: list[ParityCheck] = field(default_factory=list)

    @property
    def counted(self) -> list[ParityCheck]:
        """The rows the parity thresholds and the headline numbers cover."""
        return [row for row in self.rows if row.in_headline]


def _plan(model: nn.Module, sample_inputs, path: str | os.PathLike, *, opset: int,
          input_names: Sequence[str] | None, output_names: Sequence[str] | None, output: str | None,
          dynamic_batch: bool, exporter: Exporter, external_data_threshold: int, fp8_ops: str) -> _Export:
    """Check the arguments and the quantizers; pick the opset the formats in use need."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}.")
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ValueError(f"exporter must be 'auto', 'dynamo' or 'torchscript', got {exporter!r}.")
    check_opset(opset)
    path = Path(path)
    if not path.parent.exists():
        raise ValueError(f"The folder {path.parent} does not exist.")
    args, kwargs = sample_call(sample_inputs)
    device = model_device(model)
    # the exporters see flat tensors: the positional inputs, then the keyword ones in order
    inputs = tuple(t.to(device) for t in args + tuple(kwargs.values()))
    if input_names is None:
        input_names = default_input_names(model, args, kwargs)
    input_names = list(input_names)
    if len(input_names) != len(inputs) or len(set(input_names)) != len(input_names):
        raise ValueError(f"input_names must name each of the {len(inputs)} inputs once, got {input_names}.")
    call = ExportCall(model, len(args), list(kwargs), output)

    if fp8_ops not in FP8_OPS:
        raise ValueError(f"fp8_ops must be one of {', '.join(FP8_OPS)}, got {fp8_ops!r}.")
    names = first_quantizer_names(model)
    active, params, unreached = check_quantizers(model, names)
    # the lowest opset that carries every format in use: an INT8-only model keeps the one asked for
    formats = {p.format for key, p in params.items() if key in active}
    needed = max((FORMAT_OPSET[f] for f in formats), default=opset)
    opset_notes: list[str] = []
    requested_opset = opset
    if needed > opset:
        opset_notes.append(f"opset {needed} instead of the requested {opset}: " + " and ".join(
            f"{FORMAT_NAMES[f]} needs {FORMAT_OPSET[f]}" for f in sorted(formats) if FORMAT_OPSET[f] > opset))
        opset = needed
    opset = bf16_opset(model, opset, opset_notes)
    if fp8_ops == "trt":
        per_channel_fp8 = [names[key] for key, p in params.items() if key in active and p.format == "fp8"
                           and p.per_channel]
        if per_channel_fp8:
            raise ValueError("the TensorRT custom-op form of FP8 (TRT_FP8QuantizeLinear, as pytorch-quantization "
                             "writes it) takes one scale per tensor; per-channel FP8: "
                             + ", ".join(per_channel_fp8[:5]) + " (set them with --fp8-weights per-tensor, or "
                             "export the standard form)")
    log = ReportLog()
    log.extend("opset_for_format", opset_notes)
    return _Export(model=model, path=path, call=call, inputs=inputs, input_names=input_names,
                   output_names=None if output_names is None else list(output_names), opset=opset,
                   requested_opset=requested_opset, dynamic_batch=dynamic_batch, exporter=exporter,
                   external_data_threshold=external_data_threshold, fp8_ops=fp8_ops, names=names, active=active,
                   params=params, unreached=unreached, formats=formats, opset_notes=opset_notes,
                   log=log)


def _reference(job: _Export, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """The fake-quant model's outputs on ``inputs`` (SampleInputError names the failing layer)."""
    release_freed_memory()  # the previous run's fake-quant weights
    outputs, _, _ = run_reference(job.call, inputs, job.input_names, job.active, job.names, job.params)
    return outputs


def _run_references(job: _Export) -> None:
    """The outputs onnxruntime must match: the sample's, and those of the inputs the dynamic axes and the
    range check use (a model that fails on them keeps those axes static, or skips that check)."""
    job.reference, job.calls, job.distinct = run_reference(job.call, job.inputs, job.input_names, job.active,
                                                           job.names, job.params)
    inputs = job.inputs
    if job.dynamic_batch and inputs[0].dim() > 0:
        job.grown = grow_batch(inputs)
        # one run checks both the other batch size and the sample's range: random values at that batch size
        ranged = range_inputs(job.grown)
        if ranged is not None:
            try:
                job.ranged_reference = job.grown_reference = _reference(job, ranged)
                job.ranged = job.grown = ranged
            except SampleInputError:  # which of the two the model cannot take is found out below, one by one
                pass
        if job.grown_reference is None:
            try:
                job.grown_reference = _reference(job, job.grown)
            except SampleInputError as error:
                job.log.add("dynamic_batch_off", f"dynamic batch turned off: the model fails at batch size "
                                                     f"{job.grown[0].shape[0]} ({error.original})")
                job.dynamic_batch, job.grown = False, None
    if job.dynamic_batch and token_inputs(inputs):
        job.longer = grow_sequence(inputs, token_inputs(inputs))
        try:
            job.longer_reference = _reference(job, job.longer)
        except SampleInputError:
            job.longer = None  # the model takes only this length: the exporter keeps it static
    if job.ranged_reference is None:
        _range_check_at_sample_batch(job)


def _range_check_at_sample_batch(job: _Export) -> None:
    """Random inputs in the sample's range at the sample's own shapes, and their reference."""
    job.ranged, job.ranged_reference = range_inputs(job.inputs), None
    if job.ranged is not None:
        try:
            job.ranged_reference = _reference(job, job.ranged)
        except SampleInputError as error:
            job.ranged = None
            job.log.add("no_range_check", f"no parity check on random inputs in the sample's range: the "
                                              f"model fails on them ({error.original})")


def _name_outputs(job: _Export) -> None:
    """The graph's output names: given, or after the model's output (known once the reference ran)."""
    if job.output_names is None:
        job.output_names = list(job.call.labels)
    if len(job.output_names) != len(job.reference) or len(set(job.output_names)) != len(job.output_names):
        raise ValueError(f"output_names must name each of the model's {len(job.reference)} output tensors "
                         f"once, got {job.output_names}.")


def _capture(job: _Export) -> None:
    """Run the ONNX exporter with the quantizers standing in as Q/DQ (see :mod:`workbench.export.exporters`)."""
    export_started = time.perf_counter()
    with stand_ins(job.model, job.active, job.names, job.params) as swapped, traced_module_scopes(job.call), \
            quiet() as quiet_warnings:
        job.swapped = swapped
        job.proto, job.used_exporter, job.exporter_note, job.dynamic_batch = run_exporter(
            job.call, job.inputs, job.input_names, job.output_names, job.opset, job.dynamic_batch, job.exporter,
            job.log, job.path, job.external_data_threshold, formats=job.formats if job.fast_path else None)
        job.exported_data = external_data_file(job.proto, job.path.parent)
        fold_int4_casts(job.proto, str(job.path.parent))
    job.log.extend("tracer", quiet_warnings)
    job.export_time_s = time.perf_counter() - export_started
    if not job.dynamic_batch:
        if job.grown is not None and job.ranged is job.grown:  # the exporter fixed the batch after all
            with rounding(list(job.active.values()), "onnx"):
                _range_check_at_sample_batch(job)
        job.grown = None


def _post_process_graph(job: _Export) -> None:
    """Name the Q/DQ nodes after their quantizers, count them, and warn about what TensorRT will not like."""
    proto, swapped = job.proto, job.swapped
    scale_to_quantizer = {f"{s.quantizer_name}.scale": s.quantizer_name for s in swapped.values()}
    post_process(proto, scale_to_quantizer)
    name_int4_weights(proto)
    job.counts = {op: sum(1 for n in proto.graph.node if n.op_type == op)
                  for op in ("QuantizeLinear", "DequantizeLinear", "Clip")}
    job.by_format = format_counts(proto)
    blocked = sum(1 for s in swapped.values() if s.params.format == "int4")
    if job.by_format["int4"] != blocked:  # each INT4 weight is one DequantizeLinear on an INT4 initializer
        raise ExportValidationError("checker", f"the graph has {job.by_format['int4']} INT4 weight DequantizeLinear "
                                               f"nodes for {blocked} INT4 weights")
    gemms = job.gemms = weight_gemms(proto)
    if gemms.float_nodes:
        job.log.add("float_gemms", f"{len(gemms.float_nodes)} of {gemms.total} weight GEMMs keep a float weight (no "
                    "Q/DQ; TensorRT runs them in floating point): " + ", ".join(gemms.float_nodes[:10])
                    + (" ..." if len(gemms.float_nodes) > 10 else ""))
    per_channel_acts = per_channel_activations(proto, scale_to_quantizer)
    if per_channel_acts:
        job.log.add("per_channel_activations", "per-channel quantizers on activations (TensorRT expects "
                    "activations per tensor): " + ", ".join(per_channel_acts))
    tiny = [s.quantizer_name for s in swapped.values() if s.params.tiny_channels]
    if tiny:
        job.log.add("tiny_amax", "amax <= 2**-24 (quantizes every input to 0, in PyTorch and in the export): "
                    + ", ".join(tiny))
    for name, module in job.model.named_modules():
        if isinstance(module, QuantLSTM) and any(id(q) in job.active for q in module.input_quantizers):
            job.log.add("lstm_unrolled", f"quantized LSTM '{name}' is unrolled step by step: the graph takes only the "
                        "sample's sequence length (leave the LSTM unquantized for an ONNX LSTM node)")


def _run_ort(session, inputs: tuple[torch.Tensor, ...], what: str) -> list:
    """One onnxruntime run; an error says at which shape (``what``) the graph failed."""
    release_freed_memory()  # the previous run's Q/DQ outputs (a float copy of each weight, one at a time)
    try:
        return session.run(None, feeds(session, inputs))
    except Exception as error:
        raise ExportValidationError("onnxruntime", f"the graph does not run at {what}: "
                                                   f"{first_line(error)}") from error


def _validate(job: _Export) -> _Checks:
    """Stage the file beside ``path``; run onnx.checker and onnxruntime on it and compare with the references."""
    validation_started = time.perf_counter()
    proto, inputs, output_names = job.proto, job.inputs, job.output_names
    job.staged = stage(proto, job.path, job.external_data_threshold)
    tmp_path = str(job.staged.path)
    if job.staged.external_data_path is not None:
        job.log.add("external_data", f"the graph is over {job.external_data_threshold / 1024 ** 3:.3g} GB: its "
                    f"weights are in {job.staged.external_data_path.name} beside it (keep the two files together)")
    try:
        onnx.checker.check_model(tmp_path, full_check=True)
    except Exception as error:
        raise ExportValidationError("checker", f"onnx.checker rejected the exported graph: {error}") from error
    try:
        # onnxruntime reads the weights the file holds from the model's own tensors (compared with the file)
        # NVFP4 (FP4 types, TensorRT's dynamic FP4 quantizer) has no onnxruntime CPU kernel: onnx's reference evaluator
        why_reference = needs_reference_evaluator(proto) or needs_bfloat16_evaluator(proto)
        session = reference_session(tmp_path) if why_reference else ort_session(tmp_path, model_weights(job.model))
        ort_outputs = session.run(None, feeds(session, inputs))
    except ExportValidationError:
        raise
    except Exception as error:
        raise ExportValidationError("onnxruntime", f"onnxruntime could not run the exported graph: "
                                                   f"{first_line(error)}") from error
    parity = compare(output_names, job.reference, ort_outputs, dict(zip(job.input_names, inputs)))
    rows = [ParityCheck.of("sample inputs", p) for p in parity]
    dynamic_check = None
    if job.grown is not None:
        what = f"batch size {job.grown[0].shape[0]}"
        grown_outputs = _run_ort(session, job.grown, what)
        sample = dict(zip(job.input_names, job.grown)) if job.ranged is job.grown else None
        dynamic_check = min(compare(output_names, job.grown_reference, grown_outputs, sample), key=lambda p: p.cosine)
        if job.ranged is job.grown:
            what = f"random inputs in the sample's range, batch size {job.grown[0].shape[0]}"
        rows.append(ParityCheck.of(what, dynamic_check))
    sequence_check = None
    if job.longer is not None and _has_sequence_axis(proto):
        sequence_rows = _sequence_checks(job, session)
        sequence_check = min((p for _, p in sequence_rows), key=lambda p: p.cosine)
        rows += [ParityCheck.of(what, p) for what, p in sequence_rows]
    range_check = dynamic_check if job.grown is not None and job.ranged is job.grown else None
    if job.ranged_reference is not None and range_check is None:  # the sample alone can hide a difference
        release_freed_memory()
        range_check = min(compare(output_names, job.ranged_reference, session.run(None, feeds(session, job.ranged)),
                                  dict(zip(job.input_names, job.ranged))), key=lambda p: p.cosine)
        rows.append(ParityCheck.of("random inputs in the sample's range", range_check))
    # the session maps the weights: let them go before the files are committed and a float graph is written
    del session
    release_freed_memory()
    # a second session costs the weights again: big graphs (weights beside the file) skip it
    if why_reference:
        job.log.add("reference_evaluator", "validated with onnx's reference evaluator: onnxruntime has no CPU kernel "
                    f"for {why_reference}")
    optimized_check = None if job.staged.data_path is not None or why_reference else optimized_parity(
        tmp_path, inputs, output_names, job.reference, job.log)
    if "fp8" in job.formats and optimized_check is not None and optimized_check.max_abs_diff > 1e-5:
        # more than rounding: onnxruntime 1.32's CPU QDQ fusions change what FP8 Q/DQ computes (checked)
        job.log.add("fp8_ort_optimizations", "FP8: onnxruntime's extended graph optimizations (its QDQ fusions) "
                    "do not keep FP8 E4M3 semantics on the CPU; run FP8 files with ORT_ENABLE_BASIC or lower to "
                    "check them (TensorRT builds the graph as written)")
    if optimized_check is not None:
        rows.append(ParityCheck.of("onnxruntime's default graph optimizations (information)", optimized_check,
                                   in_headline=False))
    return _Checks(parity, dynamic_check, sequence_check, range_check, optimized_check, validation_started, rows)


def _sequence_checks(job: _Export, session) -> list[tuple[str, OutputParity]]:
    """The graph at a longer sequence; where it keeps lengths independent (encoder, decoder), also at unequal
    lengths. Each comparison's worst output, with what was checked."""
    inputs, output_names = job.inputs, job.output_names
    length = max(t.shape[1] for i, t in enumerate(job.longer) if i in token_inputs(inputs))
    what = f"sequence length {length}"
    longer_outputs = _run_ort(session, job.longer, what)
    found = [(what, min(compare(output_names, job.longer_reference, longer_outputs), key=lambda p: p.cosine))]
    groups = sequence_groups(job.proto)
    if len(groups) > 1:  # lengths the graph keeps independent (encoder, decoder) checked at unequal values
        apart = grow_sequence_apart(inputs, list(groups.values()))
        with without_cache(job.model), rounding(list(job.active.values()), "onnx"):
            try:
                apart_reference = _reference(job, apart)
            except SampleInputError as error:
                apart = None
                job.log.add("sequences_apart_fail", f"the graph declares {', '.join(groups)} independent, but the "
                            f"model fails when they differ ({error.original})")
        if apart is not None:
            lengths = ", ".join(f"{name} {apart[indices[0]].shape[1]}" for name, indices in groups.items())
            apart_outputs = _run_ort(session, apart, f"sequence lengths {lengths}")
            found.append((f"sequence lengths {lengths}",
                          min(compare(output_names, apart_reference, apart_outputs), key=lambda p: p.cosine)))
    return found


def _build_report(job: _Export, checks: _Checks) -> ExportReport:
    """The report of the validated file (its figures from the graph, the stand-ins and the checks)."""
    counted = checks.counted
    worst, largest = min(p.cosine for p in counted), max(p.max_abs_diff for p in counted)
    swapped, proto = job.swapped, job.proto
    return ExportReport(
        path=str(job.path), exporter=job.used_exporter, exporter_note=job.exporter_note, opset=default_opset(proto),
        requested_opset=job.requested_opset, input_names=job.input_names, output_names=job.output_names,
        network_dtype=graph_float_type(proto),
        dynamic_batch=job.dynamic_batch,
        quantize_nodes=job.counts["QuantizeLinear"], dequantize_nodes=job.counts["DequantizeLinear"],
        clip_nodes=qdq_clips(proto),
        expected_qdq=job.distinct, quantizer_calls_total=sum(job.calls.values()), quantizers=len(swapped),
        per_channel=sum(1 for s in swapped.values() if s.params.per_channel),
        per_tensor=sum(1 for s in swapped.values() if not s.params.per_channel),
        unsigned=sum(1 for s in swapped.values() if s.params.qmin == 0),
        narrow_range=sum(1 for s in swapped.values() if s.params.qmin == -127),
        outputs=checks.parity, max_abs_diff=largest, cosine=worst, dynamic_batch_check=checks.dynamic_check,
        sequence_check=checks.sequence_check, optimized_check=checks.optimized_check,
        weight_gemms=job.gemms.total, float_weight_gemms=list(job.gemms.float_nodes),
        file_size=job.staged.size, export_time_s=job.export_time_s,
        validation_time_s=time.perf_counter() - checks.started, total_time_s=0.0,
        quantizer_calls=dict(job.calls), warnings=job.log.warnings, notes=job.log.notes,
        entry_kinds=job.log.kinds, range_check=checks.range_check,
        formats={f: sum(1 for s in swapped.values() if s.params.format == f) for f in sorted(job.formats)},
        qdq_by_format=job.by_format, fp8_ops=job.fp8_ops if "fp8" in job.formats else None,
        format_notes=list(job.opset_notes), checks=list(checks.rows))


def _enforce_parity(report: ExportReport, checks: _Checks, min_cosine: float, max_abs_diff: float | None) -> None:
    """Refuse the file (ExportValidationError with the report) when onnxruntime and PyTorch disagree."""
    worst, largest, range_check = report.cosine, report.max_abs_diff, checks.range_check
    where = " on random inputs in the sample's range" if range_check is not None and \
        (range_check.cosine == worst or range_check.max_abs_diff == largest) else ""
    if not worst >= min_cosine:
        raise ExportValidationError("parity", f"onnxruntime and the fake-quant PyTorch model disagree{where}: "
                                              f"cosine {worst:.6f} < {min_cosine} (max abs diff {largest:.4g}).",
                                    report)
    if max_abs_diff is not None and largest > max_abs_diff:
        raise ExportValidationError("parity", f"onnxruntime and the fake-quant PyTorch model disagree{where}: max "
                                              f"abs diff {largest:.4g} > {max_abs_diff}.", report)


def _commit(job: _Export, report: ExportReport) -> None:
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


def _write_side_files(job: _Export, report: ExportReport, *, amax_json_path: str | os.PathLike | None,
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


def optimized_parity(path: str, inputs: tuple[torch.Tensor, ...], output_names: list[str],
                     reference: list[torch.Tensor], log: ReportLog) -> OutputParity | None:
    """The sample's parity when onnxruntime runs the file with its default graph optimizations, as a user's
    script or a deployment does (the checks above run the graph as written, optimizations off).

    Optimized kernels accumulate in another order; a value that lands within float error of a rounding
    boundary then takes the next quantization step in a later quantizer, and that step travels to the
    output (a UNet's skip and ConvTranspose carry it far). The graph is still the project's model: the
    report gives both numbers, and a warning says why they differ. None when the session cannot be made.
    """
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outputs = session.run(None, feeds(session, inputs))
    except Exception as error:  # the unoptimized run passed: an optimizer's own problem is only reported
        log.add("optimized_failed", f"onnxruntime with its default graph optimizations could not run the file: "
                            f"{first_line(error)}")
        return None
    del session
    worst = min(compare(output_names, reference, outputs), key=lambda p: p.cosine)
    if worst.max_abs_diff > 1e-5:
        log.add(
            "optimized_differs",
            f"onnxruntime with its default graph optimizations differs from the project's model by up to "
            f"{worst.max_abs_diff:.3g} (cosine {worst.cosine:.6f}) on output {worst.name!r}, while the graph as "
            "written matches it: optimized kernels round differently, so values near a quantization step boundary "
            "move by one step in a later quantizer; TensorRT's kernels do the same. Compare with optimizations off "
            "(GraphOptimizationLevel.ORT_DISABLE_ALL) to check the export itself.")
    return worst


def sequence_groups(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Symbolic axis-1 names of the graph's inputs (``sequence``, ``decoder_sequence``) -> the
    indices of the inputs that carry each: one entry per length the graph lets vary on its own."""
    groups: dict[str, list[int]] = {}
    for index, value in enumerate(proto.graph.input):
        dims = value.type.tensor_type.shape.dim
        if len(dims) > 1 and dims[1].dim_param and "sequence" in dims[1].dim_param:
            groups.setdefault(dims[1].dim_param, []).append(index)
    return groups


def grow_sequence_apart(inputs: tuple[torch.Tensor, ...], groups: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """The inputs with the k-th group of token inputs k + 1 positions longer (last position repeated), so
    no two independent lengths stay equal."""
    grown = list(inputs)
    for k, indices in enumerate(groups):
        for i in indices:
            t = inputs[i]
            grown[i] = torch.cat([t] + [t[:, -1:]] * (k + 1), 1)
    return tuple(grown)


def _has_sequence_axis(proto: onnx.ModelProto) -> bool:
    return any(len(value.type.tensor_type.shape.dim) > 1 and value.type.tensor_type.shape.dim[1].dim_param == "sequence"
               for value in proto.graph.input)
