"""Parity beyond the sample, and what happens when it fails: the extra batches' rows, and the file written "not
validated" with the diagnosis of :mod:`workbench.export.parity` (or refused with it, ``strict``).

The functions take the export's job (:func:`~workbench.export.onnx_export.export_qdq_onnx`'s state: its model
call, inputs, quantizers, graph, staged file and log) as it is; they only read it, but for the rows' inputs.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from workbench.export.blockwise_validation import block_diagnosis
from workbench.export.errors import ExportValidationError, SampleInputError
from workbench.export.exporters import first_line
from workbench.export.parity import diagnose
from workbench.export.reference import rounding, run_reference, without_cache
from workbench.export.report import ExportReport, ParityCheck
from workbench.export.validation import compare, feeds

logger = logging.getLogger(__name__)

__all__ = ["batch_checks", "inputs_of_row", "not_validated", "SAMPLE_ROW"]

SAMPLE_ROW = "sample inputs"  # the label of the sample's row (onnx_export's first parity row)


def _graph_accepts(job: Any, inputs: tuple[torch.Tensor, ...]) -> bool:
    """Whether ``inputs`` fit the graph's inputs: as many, each of its rank and of every fixed size."""
    graph_inputs = job.proto.graph.input
    if len(inputs) != len(graph_inputs):
        return False
    for value, tensor in zip(graph_inputs, inputs):
        dims = value.type.tensor_type.shape.dim
        if len(dims) != tensor.dim():
            return False
        if any(d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, tensor.shape)):
            return False
    return True


def batch_checks(job: Any, session) -> list[ParityCheck]:
    """The parity rows of the extra batches (``parity_batches``), each batch's worst output. A batch the graph
    cannot take (another batch size with the batch fixed) or the model fails on is skipped with a note."""
    rows: list[ParityCheck] = []
    for index, (args, kwargs) in enumerate(job.extra, start=1):
        inputs = tuple(t.to(job.inputs[0].device) for t in tuple(args) + tuple(kwargs.values()))
        size = inputs[0].shape[0] if inputs and inputs[0].dim() else 1
        what = f"parity batch {index} ({size} samples)"
        if not _graph_accepts(job, inputs):
            job.log.add("parity_batch_skipped", f"{what} not checked: its inputs ("
                        f"{', '.join(str(tuple(t.shape)) for t in inputs)}) do not fit the graph's fixed shapes")
            continue
        # the model as exported computes this batch once: its output also serves the caller's headline, unless
        # quantizers without amax were switched off for the export (the headline's model keeps them on)
        hand_out = job.parity_outputs if job.parity_outputs is not None and not job.unreached else None
        with without_cache(job.model), rounding(list(job.active.values()), "onnx"):
            job.call.on_result = None if hand_out is None else functools.partial(hand_out, index - 1)
            try:
                reference, _, _ = run_reference(job.call, inputs, job.input_names, job.active, job.names,
                                                job.params)
            except SampleInputError as error:
                job.log.add("parity_batch_skipped", f"{what} not checked: the model fails on it ({error.original})")
                continue
            finally:
                job.call.on_result = None
        try:
            outputs = session.run(None, feeds(session, inputs))
        except Exception as error:
            raise ExportValidationError("onnxruntime", f"the graph runs on the sample but not on {what}"
                                                       f"{_baked(error)}: {first_line(error)}") from error
        worst = min(compare(job.output_names, reference, outputs, dict(zip(job.input_names, inputs))),
                    key=lambda p: p.cosine)
        job.checked_inputs[what] = inputs
        rows.append(ParityCheck.of(what, worst))
        del reference, outputs  # a batch's outputs at a time: an LLM's logits are large
    return rows


def _baked(error: Exception) -> str:
    """Why a graph that ran on the sample fails on another batch of the sample's shape: a size the sample fixed
    when it was traced (switch_transformers' tokens per expert, split by counts read off the sample's routing)."""
    import re

    found = re.search(r"Name:'([^']+)'", str(error))
    node = found.group(1) if found else None
    module = node.rsplit("/", 1)[0] if node and "/" in node else None
    where = f" in {node}" + (f" (module '{module}')" if module else "") if node else ""
    return (f": a size the sample's data fixed when the graph was traced is held{where}, a count computed from the "
            "data (tokens routed to each expert, values kept by a mask) read into Python; the file would only run "
            "on inputs that route as the sample does, so it is not written. Export with a graph that computes "
            "the routing (a dense form), or leave the module in float")


def inputs_of_row(job: Any, label: str) -> tuple[torch.Tensor, ...] | None:
    """The inputs a parity row ran on, by its label (see ``_validate`` of :mod:`workbench.export.onnx_export`)."""
    if label == SAMPLE_ROW:
        return job.inputs
    if label in job.checked_inputs:
        return job.checked_inputs[label]
    if label.startswith("random inputs"):
        return job.ranged
    if label.startswith("batch size"):
        return job.grown
    if label.startswith("sequence length "):
        return job.longer
    return None


def not_validated(job: Any, error: ExportValidationError, strict: bool, min_cosine: float = 0.999) -> ExportReport:
    """The parity check failed: find where and why on the worst row's inputs (:func:`~workbench.export.parity.
    diagnose`). ``strict``: raise the error again with the diagnosis in its message; else the report, marked not
    validated, with the diagnosis (``report.parity_diagnosis``) and a warning that says both. A detector whose
    outputs part only after its NMS / top-k while every boundary before agrees to ``min_cosine`` is validated
    there (:mod:`workbench.export.parity_selection`), strict or not."""
    report: ExportReport = error.report
    counted = [row for row in report.checks if row.in_headline]
    worst = min(counted, key=lambda row: row.cosine) if counted else None
    inputs = inputs_of_row(job, worst.check) if worst is not None else None
    diagnosis = None
    if inputs is not None:
        # the sample passes and another shape fails: what parts is a size the graph holds
        sample_fine = worst.check != SAMPLE_ROW and all(row.cosine >= 0.9999 for row in counted
                                                        if row.check == SAMPLE_ROW)
        other_shape = worst.check.startswith(("batch size", "sequence length"))
        try:
            if job.blockwise is not None:  # validated block by block: the whole graph is not loaded to diagnose
                diagnosis = block_diagnosis(job, worst.check, inputs, min_cosine, worst)
            else:
                with without_cache(job.model):
                    diagnosis = diagnose(job.call, job.proto, job.staged.path.parent, inputs, job.input_names,
                                         job.output_names, {job.names[k]: q for k, q in job.active.items()},
                                         worst.check, shape_check=sample_fine and other_shape,
                                         min_cosine=min_cosine)
        except Exception as failure:  # noqa: BLE001 - the diagnosis explains; it never hides the parity error
            logger.debug("parity diagnosis failed", exc_info=True)
            job.log.add("parity_not_diagnosed", f"the parity failure could not be diagnosed: "
                        f"{type(failure).__name__}: {first_line(failure)}")
    explained = f"{error} {diagnosis.text()}" if diagnosis is not None else str(error)
    if diagnosis is not None and diagnosis.verdict == "selection":  # a detector, right before its NMS / top-k
        report.validated = True
        report.parity_diagnosis = diagnosis.to_dict()
        job.log.add("validated_before_selection", f"validated before the selection: {explained}")
        report.warnings, report.notes, report.entry_kinds = job.log.warnings, job.log.notes, job.log.kinds
        return report
    if strict:
        raise ExportValidationError("parity", f"{explained} (strict: no file was written)", report) from error
    report.validated = False
    report.parity_diagnosis = None if diagnosis is None else diagnosis.to_dict()
    job.log.add("not_validated", f"NOT VALIDATED: {explained}")
    report.warnings, report.notes, report.entry_kinds = job.log.warnings, job.log.notes, job.log.kinds
    return report
