"""The export's capture: the plan (arguments, quantizers, opset), the fake-quant reference outputs onnxruntime must
match, the graph's output names, the ONNX exporter's run, and the post-processing of the captured graph (names
after modules, counts, structural warnings). The steps of :func:`~workbench.export.onnx_export.export_qdq_onnx`
before the file is checked.
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from workbench.export import streamed_weights
from workbench.export.blockwise_validation import sample_blocks_kept
from workbench.export.errors import ExportValidationError, SampleInputError
from workbench.export.export_job import ExportJob
from workbench.export.exporters import (
    Exporter,
    quiet,
    run_exporter,
    token_inputs,
)
from workbench.export.formats import (
    FORMAT_NAMES,
    FP8_OPS,
    fold_int4_casts,
    format_counts,
    name_int4_weights,
)
from workbench.export.gemms import weight_gemms
from workbench.export.memory import release_freed_memory
from workbench.export.network_dtype import bf16_opset
from workbench.export.notes import ReportLog
from workbench.export.onnx_file import external_data_file
from workbench.export.opset import FORMAT_OPSET, check_opset
from workbench.export.outputs import distinct_from_inputs
from workbench.export.qdq_graph import account_qdq, prepare_qdq
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
)
from workbench.export.validation import (
    per_channel_activations,
    post_process,
    range_inputs,
)
from workbench.quant.algorithms.batches import model_device
from workbench.quant.nn.modules.quant_rnn import QuantLSTM


def plan_job(model: nn.Module, sample_inputs, path: str | os.PathLike, *, opset: int,
          input_names: Sequence[str] | None, output_names: Sequence[str] | None, output: str | None,
          outputs: Sequence[str] | None, dynamic_batch: bool, exporter: Exporter, external_data_threshold: int,
          fp8_ops: str) -> ExportJob:
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
    call = ExportCall(model, len(args), list(kwargs), output, outputs)

    if fp8_ops not in FP8_OPS:
        raise ValueError(f"fp8_ops must be one of {', '.join(FP8_OPS)}, got {fp8_ops!r}.")
    names = first_quantizer_names(model)
    with streamed_weights.weights_on_meta():  # a streamed export quantizes each weight as it is written
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
    return ExportJob(model=model, path=path, call=call, inputs=inputs, input_names=input_names,
                   output_names=None if output_names is None else list(output_names), opset=opset,
                   requested_opset=requested_opset, dynamic_batch=dynamic_batch, exporter=exporter,
                   external_data_threshold=external_data_threshold, fp8_ops=fp8_ops, names=names, active=active,
                   params=params, unreached=unreached, formats=formats, opset_notes=opset_notes,
                   log=log)


def reference_outputs(job: ExportJob, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """The fake-quant model's outputs on ``inputs`` (SampleInputError names the failing layer)."""
    release_freed_memory()  # the previous run's fake-quant weights
    outputs, _, _ = run_reference(job.call, inputs, job.input_names, job.active, job.names, job.params)
    return outputs


def run_references(job: ExportJob) -> None:
    """The outputs onnxruntime must match: the sample's, and those of the inputs the dynamic axes and the
    range check use (a model that fails on them keeps those axes static, or skips that check)."""
    with sample_blocks_kept(job):  # (a streamed export: its blocks' outputs, for the block-by-block validation)
        job.reference, job.calls, job.distinct = run_reference(job.call, job.inputs, job.input_names, job.active,
                                                               job.names, job.params)
    labels, notes = list(job.call.labels), list(job.call.output_notes)
    inputs = job.inputs
    if job.dynamic_batch and inputs[0].dim() > 0:
        job.grown = grow_batch(inputs)
        # one run checks both the other batch size and the sample's range: random values at that batch size
        ranged = range_inputs(job.grown)
        if ranged is not None:
            try:
                job.ranged_reference = job.grown_reference = reference_outputs(job, ranged)
                job.ranged = job.grown = ranged
            except SampleInputError:  # which of the two the model cannot take is found out below, one by one
                pass
        if job.grown_reference is None:
            try:
                job.grown_reference = reference_outputs(job, job.grown)
            except SampleInputError as error:
                job.log.add("dynamic_batch_off", f"dynamic batch turned off: the model fails at batch size "
                                                     f"{job.grown[0].shape[0]} ({error.original})")
                job.dynamic_batch, job.grown = False, None
        if job.grown_reference is not None and len(job.grown_reference) != len(job.reference):
            # a detector returning one result per image (torchvision's list of dicts): the graph's outputs are
            # those of the sample's batch size, which the file must then keep
            job.log.add("dynamic_batch_off", f"dynamic batch turned off: the model returns "
                        f"{len(job.reference)} tensors at batch size {inputs[0].shape[0]} and "
                        f"{len(job.grown_reference)} at {job.grown[0].shape[0]} (outputs per sample)")
            job.dynamic_batch, job.grown, job.grown_reference = False, None, None
            job.ranged, job.ranged_reference = None, None
    if job.static_sequence:
        job.log.add("static_sequence", f"sequence length fixed at the sample's "
                    f"({', '.join(str(inputs[i].shape[1]) for i in sorted(token_inputs(inputs)))}), as asked")
    if job.dynamic_batch and token_inputs(inputs) and not job.static_sequence:
        job.longer = grow_sequence(inputs, token_inputs(inputs))
        try:
            job.longer_reference = reference_outputs(job, job.longer)
        except SampleInputError:
            job.longer = None  # the model takes only this length: the exporter keeps it static
    if job.ranged_reference is None:
        range_check_at_sample_batch(job)
    # the names are the sample's outputs' (another batch size's run named its own)
    job.call.labels, job.call.output_notes = labels, notes


def fix_sequence_length(job: ExportJob) -> None:
    """After a graph declaring the sequence length dynamic failed at a longer one: capture again with
    the sample's length fixed, and say so (a file that runs where it says it runs, as Mamba's unrolled scan
    needs; a graph that computes every length would need the loop as an ONNX Loop/Scan)."""
    lengths = ", ".join(str(job.inputs[i].shape[1]) for i in sorted(token_inputs(job.inputs)))
    longer = max(t.shape[1] for i, t in enumerate(job.longer or job.inputs) if i in token_inputs(job.inputs))
    job.log.add("static_sequence_unrolled", f"sequence length fixed at the sample's ({lengths}): with the length "
                f"dynamic the graph does not run at sequence length {longer} in onnxruntime (or computes it "
                "wrongly); the model loops over "
                "the sequence (a scan, as Mamba's), "
                "which the exporter unrolls at the sample's length. The file runs at this length only: export "
                "with a sample of the length you deploy")
    job.static_sequence = True
    job.longer = job.longer_reference = None


def range_check_at_sample_batch(job: ExportJob) -> None:
    """Random inputs in the sample's range at the sample's own shapes, and their reference."""
    job.ranged, job.ranged_reference = range_inputs(job.inputs), None
    if job.ranged is not None:
        try:
            job.ranged_reference = reference_outputs(job, job.ranged)
        except SampleInputError as error:
            job.ranged = None
            job.log.add("no_range_check", f"no parity check on random inputs in the sample's range: the "
                                              f"model fails on them ({error.original})")


def name_outputs(job: ExportJob) -> None:
    """The graph's output names: given, or after the model's output (known once the reference ran)."""
    if job.output_names is None:
        job.output_names = list(job.call.labels)
        job.log.extend("outputs", job.call.output_notes)
    job.output_names, renames = distinct_from_inputs(job.output_names, job.input_names)
    job.log.extend("output_renamed", renames)
    if len(job.output_names) != len(job.reference) or len(set(job.output_names)) != len(job.output_names):
        raise ValueError(f"output_names must name each of the model's {len(job.reference)} output tensors "
                         f"once, got {job.output_names}.")


def capture(job: ExportJob) -> None:
    """Run the ONNX exporter with the quantizers standing in as Q/DQ (see :mod:`workbench.export.exporters`)."""
    export_started = time.perf_counter()
    with stand_ins(job.model, job.active, job.names, job.params) as swapped, traced_module_scopes(job.call), \
            quiet(job.captured) as quiet_warnings, \
            streamed_weights.traced_without_weights(job.call, {job.names[k]: q for k, q in job.active.items()}):
        job.swapped = swapped
        job.proto, job.used_exporter, job.exporter_note, job.dynamic_batch = run_exporter(
            job.call, job.inputs, job.input_names, job.output_names, job.opset, job.dynamic_batch, job.exporter,
            job.log, job.path, job.external_data_threshold, formats=job.formats if job.fast_path else None,
            dynamic_sequence=not job.static_sequence)
        job.exported_data = external_data_file(job.proto, job.path.parent)
        fold_int4_casts(job.proto, str(job.path.parent))
    job.log.extend("tracer", quiet_warnings)
    job.call.eval()  # an exporter puts back the modes it found: whatever it did, the references run in eval mode
    job.export_time_s = time.perf_counter() - export_started
    if not job.dynamic_batch:
        if job.grown is not None and job.ranged is job.grown:  # the exporter fixed the batch after all
            with rounding(list(job.active.values()), "onnx"):
                range_check_at_sample_batch(job)
        job.grown = None


def post_process_graph(job: ExportJob) -> None:
    """Name the Q/DQ nodes after their quantizers, count them, and warn about what TensorRT will not like."""
    proto, swapped = job.proto, job.swapped
    scale_to_quantizer = {f"{s.quantizer_name}.scale": s.quantizer_name for s in swapped.values()}
    prepare_qdq(proto, scale_to_quantizer, job.log)
    post_process(proto, scale_to_quantizer)
    name_int4_weights(proto)
    job.counts = {op: sum(1 for n in proto.graph.node if n.op_type == op)
                  for op in ("QuantizeLinear", "DequantizeLinear", "Clip")}
    job.by_format = format_counts(proto)
    # a streamed graph's initializers (scales too) lie in its temporary data file beside the target
    job.without_qdq = account_qdq(proto, swapped.values(), job.calls, job.log, str(job.path.parent))
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
