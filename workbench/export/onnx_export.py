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
* A graph whose weights exceed ``external_data_threshold`` (protobuf cannot encode a message over
  2 GB) keeps them in ``<path>.data``. The torch.export-based exporter's graph is written from onnx_ir
  straight to a temporary data file beside ``path``; the naming passes, the opset conversion and the
  validation then work on the graph without its weights (checker and onnxruntime read the files), so
  no step serialises the whole model. Both files are renamed into place together, or removed.
  onnxruntime maps the data file and runs each weight's Q/DQ next to the layer that reads it, so the
  validation adds about one copy of the weights to the process (a 600M model: peak 2.3x its fp32 size).
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
from pathlib import Path

import onnx
import torch
from torch import nn

from workbench import __version__
from workbench.export.errors import ExportValidationError, SampleInputError
from workbench.export.exporters import Exporter, first_line, quiet, run_exporter, token_inputs
from workbench.export.formats import (
    FORMAT_NAMES,
    FP8_OPS,
    fold_int4_casts,
    format_counts,
    name_int4_weights,
    to_trt_fp8_ops,
)
from workbench.export.gemms import weight_gemms
from workbench.export.onnx_file import (
    EXTERNAL_DATA_THRESHOLD,
    external_data_file,
    relocate_external_data,
    stage,
    write_onnx,
)
from workbench.export.opset import default_opset
from workbench.export.provenance import WRITER
from workbench.export.qdq import FORMAT_OPSET
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
    compare,
    feeds,
    ort_session,
    per_channel_activations,
    post_process,
    qdq_clips,
    range_inputs,
)
from workbench.quant.batches import model_device
from workbench.quant.nn.modules.quant_rnn import QuantLSTM
from workbench.quant.snapshot import ModelSnapshot

logger = logging.getLogger(__name__)

__all__ = ["export_qdq_onnx", "ExportReport", "OutputParity", "Exporter", "amax_table", "report_json"]


# ----- the entry point --------------------------------------------------------------------------


def export_qdq_onnx(model: nn.Module,
                    sample_inputs: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                    path: str | os.PathLike, *, opset: int = 17, input_names: Sequence[str] | None = None,
                    output_names: Sequence[str] | None = None, output: str | None = None, dynamic_batch: bool = True,
                    exporter: Exporter = "auto", min_cosine: float = 0.999, max_abs_diff: float | None = None,
                    amax_json_path: str | os.PathLike | None = None,
                    calibration_cache_path: str | os.PathLike | None = None,
                    float_onnx_path: str | os.PathLike | None = None,
                    trt_version: int = DEFAULT_TRT_VERSION,
                    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
                    fp8_ops: str = "standard") -> ExportReport:
    """Export a fake-quant model to a QDQ ONNX file and validate it before it appears at ``path``.

    Args:
        model: the quantized, calibrated model (quantized modules, QuantAdd/QuantConcat, placement rules).
        sample_inputs: a tensor or a tuple of tensors (the model's positional inputs), or a dict of
            tensors passed by keyword (``input_ids``, ``attention_mask``). They are traced, run through
            onnxruntime and compared with PyTorch.
        path: where the ``.onnx`` file goes. Nothing is written there unless validation passes.
        opset: ONNX opset of the file (>= 13 for per-channel Q/DQ; 17 suits TensorRT 8.6).
        input_names, output_names: graph input/output names (default: the forward's argument names,
            ``x`` as ``input``; outputs after the ``ModelOutput``/dict key they come from, else
            ``output``/``output_N``).
        output: which part of the model's output to export (a ``ModelOutput``/dict key such as
            ``logits``, or a tuple index); default: see :func:`~workbench.quant.batches.select_output`
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
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}.")
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ValueError(f"exporter must be 'auto', 'dynamo' or 'torchscript', got {exporter!r}.")
    if not isinstance(opset, int) or opset < 13:
        raise ValueError(f"opset must be an integer >= 13 (per-channel QuantizeLinear needs 13), got {opset!r}.")
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
    if fp8_ops == "trt":
        per_channel_fp8 = [names[key] for key, p in params.items() if key in active and p.format == "fp8"
                           and p.per_channel]
        if per_channel_fp8:
            raise ValueError("the TensorRT custom-op form of FP8 (TRT_FP8QuantizeLinear, as pytorch-quantization "
                             "writes it) takes one scale per tensor; per-channel FP8: "
                             + ", ".join(per_channel_fp8[:5]) + " (set them with --fp8-weights per-tensor, or "
                             "export the standard form)")
    # train/eval modes (one by one: some layers may be frozen) and quantizer state go back afterwards
    entry_state = ModelSnapshot(model)
    model.eval()
    report_warnings: list[str] = list(opset_notes)
    if unreached:
        for quantizer in unreached:  # back on when entry_state is restored
            quantizer.disable()
        report_warnings.append(f"{len(unreached)} enabled quantizer(s) without amax (never reached during "
                               "calibration) exported in float, without Q/DQ: "
                               + ", ".join(names[id(q)] for q in unreached))
    staged = None
    exported_data = None  # a large graph's weights, in a temporary file until committed
    try:
        with without_cache(model) as cache_note:
            if cache_note:
                report_warnings.append(cache_note)
            with rounding(list(active.values()), "onnx"):
                reference, calls, distinct = run_reference(call, inputs, input_names, active, names, params)
                grown = None
                if dynamic_batch and inputs[0].dim() > 0:
                    grown = grow_batch(inputs)
                    try:
                        grown_reference, _, _ = run_reference(call, grown, input_names, active, names, params)
                    except SampleInputError as error:
                        report_warnings.append(f"dynamic batch turned off: the model fails at batch size "
                                               f"{grown[0].shape[0]} ({error.original})")
                        dynamic_batch, grown = False, None
                longer = None  # token inputs one position longer, to check a dynamic sequence axis
                if dynamic_batch and token_inputs(inputs):
                    longer = grow_sequence(inputs, token_inputs(inputs))
                    try:
                        longer_reference, _, _ = run_reference(call, longer, input_names, active, names, params)
                    except SampleInputError:
                        longer = None  # the model takes only this length: the exporter keeps it static
                ranged, ranged_reference = range_inputs(inputs), None
                if ranged is not None:
                    try:
                        ranged_reference, _, _ = run_reference(call, ranged, input_names, active, names, params)
                    except SampleInputError as error:
                        report_warnings.append(f"no parity check on random inputs in the sample's range: the "
                                               f"model fails on them ({error.original})")
            if output_names is None:
                output_names = list(call.labels)
            output_names = list(output_names)
            if len(output_names) != len(reference) or len(set(output_names)) != len(output_names):
                raise ValueError(f"output_names must name each of the model's {len(reference)} output tensors "
                                 f"once, got {output_names}.")

            export_started = time.perf_counter()
            with stand_ins(model, active, names, params) as swapped, traced_module_scopes(call), \
                    quiet() as quiet_warnings:
                proto, used_exporter, note, dynamic_batch = run_exporter(
                    call, inputs, input_names, output_names, opset, dynamic_batch, exporter, report_warnings,
                    path, external_data_threshold)
                exported_data = external_data_file(proto, path.parent)
                fold_int4_casts(proto, str(path.parent))
        for message in quiet_warnings:
            if message not in report_warnings:
                report_warnings.append(message)
        export_time = time.perf_counter() - export_started
        if not dynamic_batch:
            grown = None

        scale_to_quantizer = {f"{s.quantizer_name}.scale": s.quantizer_name for s in swapped.values()}
        post_process(proto, scale_to_quantizer)
        name_int4_weights(proto)
        counts = {op: sum(1 for n in proto.graph.node if n.op_type == op)
                  for op in ("QuantizeLinear", "DequantizeLinear", "Clip")}
        by_format = format_counts(proto)
        blocked = sum(1 for s in swapped.values() if s.params.format == "int4")
        if by_format["int4"] != blocked:  # each INT4 weight is one DequantizeLinear on an INT4 initializer
            raise ExportValidationError("checker", f"the graph has {by_format['int4']} INT4 weight DequantizeLinear "
                                                   f"nodes for {blocked} INT4 weights")
        gemms = weight_gemms(proto)
        if gemms.float_nodes:
            report_warnings.append(f"{len(gemms.float_nodes)} of {gemms.total} weight GEMMs keep a float weight (no "
                                   "Q/DQ; TensorRT runs them in floating point): " + ", ".join(gemms.float_nodes[:10])
                                   + (" ..." if len(gemms.float_nodes) > 10 else ""))
        per_channel_acts = per_channel_activations(proto, scale_to_quantizer)
        if per_channel_acts:
            report_warnings.append("per-channel quantizers on activations (TensorRT expects activations per "
                                   "tensor): " + ", ".join(per_channel_acts))
        tiny = [s.quantizer_name for s in swapped.values() if s.params.tiny_channels]
        if tiny:
            report_warnings.append("amax <= 2**-24 (quantizes every input to 0, in PyTorch and in the export): "
                                   + ", ".join(tiny))

        for name, module in model.named_modules():
            if isinstance(module, QuantLSTM) and any(id(q) in active for q in module.input_quantizers):
                report_warnings.append(f"quantized LSTM '{name}' is unrolled step by step: the graph takes only the "
                                       "sample's sequence length (leave the LSTM unquantized for an ONNX LSTM node)")
        validation_started = time.perf_counter()
        staged = stage(proto, path, external_data_threshold)
        tmp_path = str(staged.path)
        if staged.external_data_path is not None:
            report_warnings.append(f"the graph is over {external_data_threshold / 1024 ** 3:.3g} GB: its weights are "
                                   f"in {staged.external_data_path.name} beside it (keep the two files together)")
        try:
            onnx.checker.check_model(tmp_path, full_check=True)
        except Exception as error:
            raise ExportValidationError("checker", f"onnx.checker rejected the exported graph: {error}") from error
        try:
            session = ort_session(tmp_path)
            ort_outputs = session.run(None, feeds(session, inputs))
        except ExportValidationError:
            raise
        except Exception as error:
            raise ExportValidationError("onnxruntime", f"onnxruntime could not run the exported graph: "
                                                       f"{first_line(error)}") from error
        parity = compare(output_names, reference, ort_outputs, dict(zip(input_names, inputs)))
        dynamic_check = None
        if grown is not None:
            try:
                grown_outputs = session.run(None, feeds(session, grown))
            except Exception as error:
                raise ExportValidationError("onnxruntime", f"the graph does not run at batch size "
                                                           f"{grown[0].shape[0]}: {first_line(error)}") from error
            grown_parity = compare(output_names, grown_reference, grown_outputs)
            dynamic_check = min(grown_parity, key=lambda p: p.cosine)
        sequence_check = None
        if longer is not None and _has_sequence_axis(proto):
            length = max(t.shape[1] for i, t in enumerate(longer) if i in token_inputs(inputs))
            try:
                longer_outputs = session.run(None, feeds(session, longer))
            except Exception as error:
                raise ExportValidationError("onnxruntime", f"the graph does not run at sequence length {length}: "
                                                           f"{first_line(error)}") from error
            sequence_check = min(compare(output_names, longer_reference, longer_outputs), key=lambda p: p.cosine)
            groups = sequence_groups(proto)
            if len(groups) > 1:  # lengths the graph keeps independent (encoder, decoder) checked at unequal values
                apart = grow_sequence_apart(inputs, list(groups.values()))
                with without_cache(model), rounding(list(active.values()), "onnx"):
                    try:
                        apart_reference, _, _ = run_reference(call, apart, input_names, active, names, params)
                    except SampleInputError as error:
                        apart = None
                        report_warnings.append(f"the graph declares {', '.join(groups)} independent, but the model "
                                               f"fails when they differ ({error.original})")
                if apart is not None:
                    lengths = ", ".join(f"{name} {apart[indices[0]].shape[1]}" for name, indices in groups.items())
                    try:
                        apart_outputs = session.run(None, feeds(session, apart))
                    except Exception as error:
                        raise ExportValidationError("onnxruntime", f"the graph does not run at sequence lengths "
                                                                   f"{lengths}: {first_line(error)}") from error
                    apart_check = min(compare(output_names, apart_reference, apart_outputs), key=lambda p: p.cosine)
                    sequence_check = min(sequence_check, apart_check, key=lambda p: p.cosine)
        range_check = None
        if ranged_reference is not None:  # the sample alone can hide a difference (a quantizer it leaves at 0)
            range_check = min(compare(output_names, ranged_reference, session.run(None, feeds(session, ranged)),
                                      dict(zip(input_names, ranged))), key=lambda p: p.cosine)
        # the session maps the weights: let them go before the files are committed and a float graph is written
        del session
        # a second session costs the weights again: big graphs (weights beside the file) skip it
        optimized_check = None if staged.data_path is not None else optimized_parity(
            tmp_path, inputs, output_names, reference, report_warnings)
        if "fp8" in formats and optimized_check is not None and optimized_check.max_abs_diff > 1e-5:
            # more than rounding: onnxruntime 1.32's CPU QDQ fusions change what FP8 Q/DQ computes (checked)
            report_warnings.append("FP8: onnxruntime's extended graph optimizations (its QDQ fusions) do not keep "
                                   "FP8 E4M3 semantics on the CPU; run FP8 files with ORT_ENABLE_BASIC or lower to "
                                   "check them (TensorRT builds the graph as written)")
        checks = parity + [c for c in (dynamic_check, sequence_check, range_check) if c is not None]
        worst, largest = min(p.cosine for p in checks), max(p.max_abs_diff for p in checks)
        report = ExportReport(
            path=str(path), exporter=used_exporter, exporter_note=note, opset=default_opset(proto),
            requested_opset=requested_opset, input_names=input_names, output_names=output_names,
            dynamic_batch=dynamic_batch,
            quantize_nodes=counts["QuantizeLinear"], dequantize_nodes=counts["DequantizeLinear"],
            clip_nodes=qdq_clips(proto),
            expected_qdq=distinct, quantizer_calls_total=sum(calls.values()), quantizers=len(swapped),
            per_channel=sum(1 for s in swapped.values() if s.params.per_channel),
            per_tensor=sum(1 for s in swapped.values() if not s.params.per_channel),
            unsigned=sum(1 for s in swapped.values() if s.params.qmin == 0),
            narrow_range=sum(1 for s in swapped.values() if s.params.qmin == -127),
            outputs=parity, max_abs_diff=largest, cosine=worst, dynamic_batch_check=dynamic_check,
            sequence_check=sequence_check, optimized_check=optimized_check, weight_gemms=gemms.total,
            float_weight_gemms=list(gemms.float_nodes),
            file_size=staged.size, export_time_s=export_time,
            validation_time_s=time.perf_counter() - validation_started, total_time_s=0.0,
            quantizer_calls=dict(calls), warnings=report_warnings, range_check=range_check,
            formats={f: sum(1 for s in swapped.values() if s.params.format == f) for f in sorted(formats)},
            qdq_by_format=by_format, fp8_ops=fp8_ops if "fp8" in formats else None,
            format_notes=list(opset_notes))
        where = " on random inputs in the sample's range" if range_check is not None and \
            (range_check.cosine == worst or range_check.max_abs_diff == largest) else ""
        if not worst >= min_cosine:
            raise ExportValidationError("parity", f"onnxruntime and the fake-quant PyTorch model disagree{where}: "
                                                  f"cosine {worst:.6f} < {min_cosine} (max abs diff {largest:.4g}).",
                                        report)
        if max_abs_diff is not None and largest > max_abs_diff:
            raise ExportValidationError("parity", f"onnxruntime and the fake-quant PyTorch model disagree{where}: max "
                                                  f"abs diff {largest:.4g} > {max_abs_diff}.", report)
        if fp8_ops == "trt" and "fp8" in formats:
            # validated in the standard form (onnxruntime cannot run TensorRT's custom ops); written in TensorRT's
            staged.discard()
            staged = None
            # FP8 in this form needs no opset 19; the other formats keep what they need
            trt_opset = max([requested_opset] + [FORMAT_OPSET[f] for f in formats if f != "fp8"])
            trt_proto, trt_notes = to_trt_fp8_ops(proto, trt_opset)
            report.warnings.extend(trt_notes)
            report.format_notes.extend(trt_notes)
            onnx.checker.check_model(trt_proto)
            report.opset = default_opset(trt_proto)
            if report.opset < opset:  # the opset raised for float8 types did not last: no note about it
                report.warnings = [w for w in report.warnings if w not in opset_notes]
                report.format_notes = [w for w in report.format_notes if w not in opset_notes]
            staged = stage(trt_proto, path, external_data_threshold)
            report.file_size = staged.size
        external = staged.external_data_path
        folded = staged.fold and staged.data_path is not None  # streamed during export, one file now
        staged.commit()
        staged = exported_data = None
        if external is not None:  # the graph in memory names the data file as the one on disk does
            relocate_external_data(proto, external.name)
        report.external_data_path = None if external is None else str(external)
        if external is not None:  # the graph now names the data file by its final (shorter) name
            report.file_size = path.stat().st_size + external.stat().st_size
        elif folded:
            report.file_size = path.stat().st_size

        if amax_json_path is not None:
            table = {"writer": f"{WRITER} {__version__}", "model": type(model).__name__, "onnx": path.name,
                     "quantizers": amax_table_of(model, params)}
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
                float_graph = strip_qdq(onnx.load(str(path)) if folded else proto)
                if external_data_file(float_graph, path.parent) is not None:
                    # its own data file: the weights are read in (never serialised in the proto) and written out
                    onnx.external_data_helper.load_external_data_for_model(float_graph, str(path.parent))
                report.float_onnx_path = str(write_onnx(float_graph, Path(float_onnx_path), external_data_threshold,
                                                        keep_proto=False))
        report.total_time_s = time.perf_counter() - started
        logger.info("QDQ export: %s", report.summary())
        return report
    finally:
        if staged is not None:
            staged.discard()
        elif exported_data is not None:
            exported_data.unlink(missing_ok=True)
        entry_state.restore()


def optimized_parity(path: str, inputs: tuple[torch.Tensor, ...], output_names: list[str],
                     reference: list[torch.Tensor], warnings_out: list[str]) -> OutputParity | None:
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
        warnings_out.append(f"onnxruntime with its default graph optimizations could not run the file: "
                            f"{first_line(error)}")
        return None
    del session
    worst = min(compare(output_names, reference, outputs), key=lambda p: p.cosine)
    if worst.max_abs_diff > 1e-5:
        warnings_out.append(
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
