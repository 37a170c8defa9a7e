"""The checks of a captured graph, on its staged file: onnx.checker, then onnxruntime (or onnx's reference evaluator
for formats it has no kernel for) against the fake-quant references at the sample, another batch size, longer and
unequal sequences and random inputs in the sample's range; the report of the figures, and the parity threshold.
"""
from __future__ import annotations

import time

import onnx
import torch

from workbench.export import streamed_weights
from workbench.export.blockwise_validation import block_rows, piecewise_session
from workbench.export.capture import reference_outputs
from workbench.export.errors import ExportValidationError, SampleInputError, UnrolledSequenceError
from workbench.export.export_job import ExportJob, ValidationChecks
from workbench.export.exporters import (
    CAPTURED_LINES,
    first_line,
    token_inputs,
)
from workbench.export.fp4 import needs_reference_evaluator, reference_session
from workbench.export.memory import release_freed_memory
from workbench.export.network_dtype import graph_float_type, needs_bfloat16_evaluator
from workbench.export.notes import ReportLog
from workbench.export.onnx_file import stage
from workbench.export.opset import default_opset
from workbench.export.parity_checks import batch_checks
from workbench.export.reference import (
    rounding,
    without_cache,
)
from workbench.export.report import ExportReport, OutputParity, ParityCheck
from workbench.export.validation import (
    compare,
    feeds,
    model_weights,
    ort_session,
    qdq_clips,
)

STATIC_SEQUENCE_HINT = (" (the graph declares the sequence length dynamic but holds the sample's: a loop over "
                         "the sequence unrolled when traced, as Mamba's scan is; export with static_sequence=True, "
                         "--static-sequence on the command line, to fix the length at the sample's)")


def run_ort(session, inputs: tuple[torch.Tensor, ...], what: str) -> list:
    """One onnxruntime run; an error says at which shape (``what``) the graph failed."""
    release_freed_memory()  # the previous run's Q/DQ outputs (a float copy of each weight, one at a time)
    try:
        return session.run(None, feeds(session, inputs))
    except Exception as error:
        if what.startswith("sequence length"):  # a loop over the sequence, unrolled at the sample's length
            raise UnrolledSequenceError(f"the graph does not run at {what}{STATIC_SEQUENCE_HINT}: "
                                        f"{first_line(error)}") from error
        raise ExportValidationError("onnxruntime", f"the graph does not run at {what}: "
                                                   f"{first_line(error)}") from error


def validate(job: ExportJob) -> ValidationChecks:
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
        # a streamed export's (or one too large for memory): piece by piece, each block's weights read in turn
        session = piecewise_session(job, why_reference)
        if session is None:
            # (a streamed export's weights are on meta: onnxruntime reads the data file)
            weights = {} if streamed_weights.active() else model_weights(job.model)
            session = reference_session(tmp_path) if why_reference else ort_session(tmp_path, weights)
        ort_outputs = session.run(None, feeds(session, inputs))
    except ExportValidationError:
        raise
    except Exception as error:
        raise ExportValidationError("onnxruntime", f"onnxruntime could not run the exported graph: "
                                                   f"{first_line(error)}") from error
    parity = compare(output_names, job.reference, ort_outputs, dict(zip(job.input_names, inputs)))
    rows = [ParityCheck.of("sample inputs", p) for p in parity]
    rows += block_rows(job, session, inputs)  # each block's output (block-by-block validation only)
    dynamic_check = None
    if job.grown is not None:
        what = f"batch size {job.grown[0].shape[0]}"
        grown_outputs = run_ort(session, job.grown, what)
        sample = dict(zip(job.input_names, job.grown)) if job.ranged is job.grown else None
        dynamic_check = min(compare(output_names, job.grown_reference, grown_outputs, sample), key=lambda p: p.cosine)
        if job.ranged is job.grown:
            what = f"random inputs in the sample's range, batch size {job.grown[0].shape[0]}"
        rows.append(ParityCheck.of(what, dynamic_check))
    sequence_check = None
    if job.longer is not None and has_sequence_axis(proto):
        sequence_rows = sequence_checks(job, session)
        sequence_check = min((p for _, p in sequence_rows), key=lambda p: p.cosine)
        rows += [ParityCheck.of(what, p) for what, p in sequence_rows]
    range_check = dynamic_check if job.grown is not None and job.ranged is job.grown else None
    if job.ranged_reference is not None and range_check is None:  # the sample alone can hide a difference
        release_freed_memory()
        range_check = min(compare(output_names, job.ranged_reference, session.run(None, feeds(session, job.ranged)),
                                  dict(zip(job.input_names, job.ranged))), key=lambda p: p.cosine)
        rows.append(ParityCheck.of("random inputs in the sample's range", range_check))
    rows += batch_checks(job, session)  # the extra batches (parity_batches)
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
    return ValidationChecks(parity, dynamic_check, sequence_check, range_check, optimized_check, validation_started,
                            rows)


def sequence_checks(job: ExportJob, session) -> list[tuple[str, OutputParity]]:
    """The graph at a longer sequence; where it keeps lengths independent (encoder, decoder), also at unequal
    lengths. Each comparison's worst output, with what was checked."""
    inputs, output_names = job.inputs, job.output_names
    length = max(t.shape[1] for i, t in enumerate(job.longer) if i in token_inputs(inputs))
    what = f"sequence length {length}"
    longer_outputs = run_ort(session, job.longer, what)
    try:
        found = [(what, min(compare(output_names, job.longer_reference, longer_outputs), key=lambda p: p.cosine))]
    except ExportValidationError as error:  # an output of the sample's length: a loop unrolled when traced
        raise UnrolledSequenceError(f"the graph does not run at {what}{STATIC_SEQUENCE_HINT}: "
                                    f"{error.args[0] if error.args else error}") from error
    groups = sequence_groups(job.proto)
    if len(groups) > 1:  # lengths the graph keeps independent (encoder, decoder) checked at unequal values
        apart = grow_sequence_apart(inputs, list(groups.values()))
        with without_cache(job.model), rounding(list(job.active.values()), "onnx"):
            try:
                apart_reference = reference_outputs(job, apart)
            except SampleInputError as error:
                apart = None
                job.log.add("sequences_apart_fail", f"the graph declares {', '.join(groups)} independent, but the "
                            f"model fails when they differ ({error.original})")
        if apart is not None:
            lengths = ", ".join(f"{name} {apart[indices[0]].shape[1]}" for name, indices in groups.items())
            apart_outputs = run_ort(session, apart, f"sequence lengths {lengths}")
            found.append((f"sequence lengths {lengths}",
                          min(compare(output_names, apart_reference, apart_outputs), key=lambda p: p.cosine)))
    return found


def build_report(job: ExportJob, checks: ValidationChecks) -> ExportReport:
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
        quantizer_calls=dict(job.calls), quantizers_without_qdq=list(job.without_qdq),
        exporter_log=job.captured[:CAPTURED_LINES], warnings=job.log.warnings, notes=job.log.notes,
        entry_kinds=job.log.kinds, range_check=checks.range_check,
        formats={f: sum(1 for s in swapped.values() if s.params.format == f) for f in sorted(job.formats)},
        qdq_by_format=job.by_format, fp8_ops=job.fp8_ops if "fp8" in job.formats else None,
        format_notes=list(job.opset_notes), checks=list(checks.rows))


def enforce_parity(report: ExportReport, checks: ValidationChecks, min_cosine: float,
                   max_abs_diff: float | None) -> None:
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


def optimized_parity(path: str, inputs: tuple[torch.Tensor, ...], output_names: list[str],
                     reference: list[torch.Tensor], log: ReportLog) -> OutputParity | None:
    """The sample's parity when onnxruntime runs the file with its default graph optimizations, as a user's
    script or a deployment does (the checks above run the graph as written, optimizations off).

    Optimized kernels accumulate in another order; a value that lands within float error of a rounding
    boundary then takes the next quantization step in a later quantizer, and that step travels to the
    output (a UNet's skip and ConvTranspose carry it far). The graph is still the project's model: the
    report gives both numbers, and a warning says why they differ.

    Raises:
        ExportValidationError: onnxruntime cannot open or run the file with those optimizations.
    """
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outputs = session.run(None, feeds(session, inputs))
    except Exception as error:
        # a user's script, and most deployments, open the file this way: a file they cannot run is no export
        reason = first_line(error).rstrip(".")
        raise ExportValidationError("onnxruntime", f"onnxruntime with its default graph optimizations "
                                                   f"(ORT_ENABLE_ALL) cannot run the file: {reason}. "
                                                   "The graph as written runs; this is an onnxruntime optimizer's "
                                                   "problem the export could not avoid.") from error
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


def has_sequence_axis(proto: onnx.ModelProto) -> bool:
    return any(len(value.type.tensor_type.shape.dim) > 1 and value.type.tensor_type.shape.dim[1].dim_param == "sequence"
               for value in proto.graph.input)
