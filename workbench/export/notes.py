"""What an export tells its user besides the numbers: warnings (something to act on) and notes (what the
exporter did on its own, shown quietly), one registry of kinds that decides which is which.

Every entry of an :class:`~workbench.export.report.ExportReport`'s ``warnings`` and ``notes`` is added
through :class:`ReportLog` with a kind from :data:`REPORT_KINDS`, so a new message is classified where it
is written and the CLI, the GUI's export dialog and the JSON agree on it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Severity", "EntryKind", "REPORT_KINDS", "ReportLog", "severity_of"]


class Severity(str, enum.Enum):
    """``warning``: something the user should act on or know before deploying; ``note``: what the exporter did."""

    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class EntryKind:
    """One kind of report entry: its key, whether it is a warning or a note, and what it is about."""

    key: str
    severity: Severity
    description: str


_W, _N = Severity.WARNING, Severity.NOTE

REPORT_KINDS: dict[str, EntryKind] = {kind.key: kind for kind in (
    EntryKind("unreached_quantizers", _W, "enabled quantizers calibration never reached, exported in float"),
    EntryKind("dynamic_batch_off", _W, "the model fails at another batch size or fixes it: the batch is static"),
    EntryKind("no_range_check", _W, "no parity check on random inputs: the model fails on them"),
    EntryKind("tracer", _W, "a TorchScript tracer warning: the graph may hold a value of the sample as a constant"),
    EntryKind("opset_kept", _W, "the file keeps the exporter's opset: converting it to the requested one failed"),
    EntryKind("float_gemms", _W, "weight GEMMs without Q/DQ on the weight (TensorRT runs them in float)"),
    EntryKind("per_channel_activations", _W, "per-channel quantizers on activations (TensorRT wants per-tensor)"),
    EntryKind("tiny_amax", _W, "amax <= 2**-24: the quantizer maps every input to 0"),
    EntryKind("lstm_unrolled", _W, "a quantized LSTM unrolled step by step: the sequence length is fixed"),
    EntryKind("sequences_apart_fail", _W, "the graph declares lengths independent the model cannot take apart"),
    EntryKind("optimized_differs", _W, "onnxruntime's default graph optimizations move values by a quantization step"),
    EntryKind("quantizers_without_qdq", _W, "quantizers that ran in PyTorch but have no Q/DQ node in the file"),
    EntryKind("int8_vs_fp32", _W, "the INT8-vs-FP32 comparison on the project's data could not be made"),
    EntryKind("not_validated", _W, "onnxruntime and the model disagree beyond the threshold: written not validated, "
                                    "with the diagnosis"),
    EntryKind("validated_before_selection", _N, "a detector's outputs after its NMS / top-k part on near-equal "
                                                 "scores; everything before the selection agrees: validated there"),
    EntryKind("parity_not_diagnosed", _W, "the parity failure's diagnosis itself failed"),
    EntryKind("parity_batch_skipped", _N, "an extra parity batch the graph or the model cannot take, not checked"),
    EntryKind("use_cache_off", _N, "a Hugging Face model exported with use_cache=False (no cache output)"),
    EntryKind("opset_for_format", _N, "the opset raised to the one the precisions in use need"),
    EntryKind("opset_conversion", _N, "what onnx.version_converter's graph needed for the older opset"),
    EntryKind("external_data", _N, "the weights are in a data file beside the graph (over 2 GB)"),
    EntryKind("fp8_ort_optimizations", _N, "onnxruntime's CPU QDQ fusions do not keep FP8 semantics"),
    EntryKind("fp8_trt_form", _N, "FP8 written as TensorRT's custom ops, validated in the standard form"),
    EntryKind("reference_evaluator", _N,
              "validated with onnx's reference evaluator (no onnxruntime CPU kernel for NVFP4)"),
    EntryKind("outputs", _N, "which of the model's outputs the graph returns, and what was left out"),
    EntryKind("output_renamed", _N, "an output named as an input, renamed (an ONNX graph names each value once)"),
    EntryKind("constant_qdq", _N, "a quantizer on a constant: its Q/DQ left out (it gives the constant back)"),
    EntryKind("pinned_qdq", _N, "Q/DQ repeated after data movement so onnxruntime's optimizer can open the file"),
    EntryKind("static_sequence", _N, "the sequence length fixed at the sample's, as asked"),
    EntryKind("static_sequence_unrolled", _W, "the sequence length fixed at the sample's: the graph declaring it "
              "dynamic did not run at another length (a loop over the sequence unrolled when traced)"),
    EntryKind("export_route", _N, "a lazily opened model: streamed from its checkpoint, or every weight read first"),
    EntryKind("validation_route", _N, "whether the whole graph or its blocks one at a time were validated, and why"),
    EntryKind("fast_path_failed", _N, "the TorchScript fast path's graph failed validation: torch.export took over"),
)}


def severity_of(kind: str) -> Severity:
    """The severity of a registered kind (KeyError names the unknown kind: every entry has a kind)."""
    try:
        return REPORT_KINDS[kind].severity
    except KeyError:
        raise KeyError(f"unknown export report kind {kind!r}; known: {', '.join(REPORT_KINDS)}") from None


@dataclass
class ReportLog:
    """The warnings and notes of one export, each once, in the order they were added; ``kinds`` maps each
    message to its kind (for the JSON and for tests)."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, message: str) -> None:
        """Add ``message`` under ``kind`` (to the warnings or the notes, as the registry says); once."""
        target = self.warnings if severity_of(kind) is Severity.WARNING else self.notes
        if message not in target:
            target.append(message)
        self.kinds.setdefault(message, kind)

    def extend(self, kind: str, messages: list[str]) -> None:
        for message in messages:
            self.add(kind, message)

    def remove(self, messages: list[str]) -> None:
        """Take back entries that no longer hold (an opset raised for FP8 that the TensorRT form undid)."""
        self.warnings[:] = [m for m in self.warnings if m not in messages]
        self.notes[:] = [m for m in self.notes if m not in messages]
        for message in messages:
            self.kinds.pop(message, None)
