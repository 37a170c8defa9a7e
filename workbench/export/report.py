"""The export report: what :func:`~workbench.export.onnx_export.export_qdq_onnx` wrote and how well it matches."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["OutputParity", "ParityCheck", "ExportReport", "report_json"]


@dataclass(frozen=True)
class OutputParity:
    """onnxruntime against the fake-quant PyTorch model, for one output."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    cosine: float


@dataclass(frozen=True)
class ParityCheck:
    """One row of the report's parity table: one check (the sample, another batch size, another sequence
    length, random inputs in the sample's range, onnxruntime's optimized graph) on one output.

    ``in_headline``: the report's ``max_abs_diff`` and ``cosine`` (and the parity thresholds) cover this
    row; the headline is always the worst of these rows. The optimized-graph row is for information: the
    file is checked as written."""

    check: str
    output: str
    shape: tuple[int, ...]
    max_abs_diff: float
    cosine: float
    in_headline: bool = True

    @classmethod
    def of(cls, check: str, parity: OutputParity, in_headline: bool = True) -> ParityCheck:
        return cls(check, parity.name, tuple(parity.shape), parity.max_abs_diff, parity.cosine, in_headline)


@dataclass
class ExportReport:
    """What :func:`export_qdq_onnx` wrote and how well it matches PyTorch."""

    path: str
    exporter: str                    # "dynamo" (torch.export-based) or "torchscript"
    exporter_note: str               # why that exporter
    opset: int                       # the file's opset
    requested_opset: int
    input_names: list[str]
    output_names: list[str]
    dynamic_batch: bool
    quantize_nodes: int
    dequantize_nodes: int
    clip_nodes: int                  # narrow-range clips between Q and DQ
    expected_qdq: int                # distinct (tensor, scale) pairs quantized in one forward pass
    quantizer_calls_total: int       # active quantizer calls in one forward pass (>= expected_qdq)
    quantizers: int                  # distinct quantizers exported
    per_channel: int
    per_tensor: int
    unsigned: int
    narrow_range: int
    outputs: list[OutputParity]
    max_abs_diff: float
    cosine: float                    # the lowest over outputs
    dynamic_batch_check: OutputParity | None  # the same comparison at another batch size
    file_size: int
    export_time_s: float
    validation_time_s: float
    total_time_s: float
    quantizer_calls: dict[str, int] = field(default_factory=dict)
    # quantizers that ran in PyTorch and have no Q/DQ node in the file (a constant input, a folded one), by name
    quantizers_without_qdq: list[str] = field(default_factory=list)
    # what torch logged and printed while exporting (kept out of the console; the first lines; all in --debug)
    exporter_log: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the user should act on (kinds: workbench.export.notes)
    notes: list[str] = field(default_factory=list)  # what the exporter did on its own (an opset conversion, ...)
    entry_kinds: dict[str, str] = field(default_factory=dict)  # each warning's and note's kind
    # every check behind the headline, one row each (with the optimized-graph row, outside the headline)
    checks: list[ParityCheck] = field(default_factory=list)
    amax_json_path: str | None = None
    calibration_cache_path: str | None = None
    float_onnx_path: str | None = None
    external_data_path: str | None = None  # the weights of a graph over 2 GB, beside the file
    sequence_check: OutputParity | None = None  # the comparison at another sequence length (token inputs)
    # the same comparison on random inputs spanning the sample's range (a sample can hide differences:
    # a quantizer whose input is 0 on it); None when the model takes no floating-point input
    range_check: OutputParity | None = None
    # quantizers exported per format ("int8", "fp8", "int4") and Q/DQ nodes per format (from the graph)
    formats: dict[str, int] = field(default_factory=dict)
    qdq_by_format: dict[str, int] = field(default_factory=dict)
    fp8_ops: str | None = None  # "standard" (QuantizeLinear to float8e4m3fn) or "trt" (TensorRT's custom ops)
    # what the formats changed (the opset, FP8 as custom ops), for the CLI to say; also in warnings
    format_notes: list[str] = field(default_factory=list)
    # the sample's parity with onnxruntime's default graph optimizations on (what a user's own script runs)
    optimized_check: OutputParity | None = None
    # Conv/Gemm/MatMul nodes with a constant weight, and those whose weight has no Q/DQ (float in the engine)
    weight_gemms: int = 0
    float_weight_gemms: list[str] = field(default_factory=list)
    # what the user cares about beside parity: the INT8 model against FP32 on the project's data (the metric's
    # values, the output SQNR, the batches and which data: Evaluation.to_dict() plus "data"); None when not measured
    int8_vs_fp32: dict[str, Any] | None = None
    # False: the parity check failed and the file was written anyway (not --strict), marked "not validated";
    # parity_diagnosis then says where and why (workbench.export.parity.ParityDiagnosis.to_dict())
    validated: bool = True
    parity_diagnosis: dict[str, Any] | None = None
    # the float type the network computes in and its float layers keep in the file (float32, bfloat16, float16)
    network_dtype: str = "float32"

    @property
    def qdq_pairs(self) -> int:
        return min(self.quantize_nodes, self.dequantize_nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def headline(self) -> str:
        """INT8 against FP32 in one line (``""`` when not measured): the gap, not the export's parity."""
        item = self.int8_vs_fp32
        if not item:
            return ""
        metric = dict(item.get("metric") or {})
        label = item.get("quantized_as") or "INT8"  # the project's mix (FP8, FP8+INT4 W); older reports: INT8
        # the float reference is the model in its own dtype (a bf16 model is not upcast to measure it)
        float_name = {"bfloat16": "BF16", "float16": "FP16"}.get(self.network_dtype, "FP32")
        text = (f"{label} vs {float_name} on {item.get('num_batches')} {item.get('data', 'evaluation')} batches: "
                f"output SQNR {_number(item.get('output_sqnr_db'))} dB")
        if metric.get("kind") != "sqnr" and metric.get("name") not in (None, "sqnr"):
            text += (f", {metric.get('name')} {float_name} {_number(item.get('fp32'))} / {label} "
                     f"{_number(item.get('int8'))}")
        return text

    def verdict(self) -> str:
        """``"validated"``, or ``"NOT VALIDATED: <the diagnosis>"`` when the file failed the parity check."""
        if self.validated:
            return "validated"
        diagnosis = self.parity_diagnosis or {}
        text = f"NOT VALIDATED: onnxruntime and the fake-quant model disagree (cosine {self.cosine:.6f})"
        if diagnosis:
            where = diagnosis.get("module") or diagnosis.get("first")
            text += f"; diagnosis: {diagnosis.get('label', diagnosis.get('verdict'))}" + (f" at {where}" if where
                                                                                            else "")
        return text + " (the warning below says where and why)"

    def summary(self) -> str:
        text = "" if self.validated else self.verdict() + "\n"
        text += (f"{Path(self.path).name}: {self.quantize_nodes} Q / {self.dequantize_nodes} DQ nodes "
                f"({self.quantizers} quantizers: {self.per_channel} per-channel, {self.per_tensor} per-tensor"
                + ("".join(f", {count} {name}" for name, count in self.formats.items())
                   if set(self.formats) - {"int8"} else "") + "), "
                f"opset {self.opset}{' (FP8 written as TensorRT custom ops)' if self.fp8_ops == 'trt' else ''}, "
                + (f"{self.network_dtype} network, " if self.network_dtype != "float32" else "") +
                f"{self.file_size / 1024:.1f} KiB, exporter {self.exporter}; onnxruntime vs "
                f"PyTorch: max abs diff {self.max_abs_diff:.3g}, cosine {self.cosine:.6f}")
        if self.weight_gemms:
            text += (f"; {self.weight_gemms - len(self.float_weight_gemms)} of {self.weight_gemms} weight GEMMs with "
                     "Q/DQ weights")
        if self.optimized_check is not None and self.optimized_check.max_abs_diff > 1e-5:
            text += (f"; with onnxruntime's graph optimizations: max abs diff {self.optimized_check.max_abs_diff:.3g}, "
                     f"cosine {self.optimized_check.cosine:.6f}")
        if self.dynamic_batch_check is not None:
            text += f"; dynamic batch checked at {self.dynamic_batch_check.shape[0]}"
        if self.sequence_check is not None:
            text += "; dynamic sequence length checked"
        text += f"; {self.total_time_s:.2f} s"
        if self.headline():
            text += (f"\n{self.headline()} (what quantizing costs; the parity above is the file against the "
                     "fake-quant model)")
        return text


def _number(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.4g}" if value == value and abs(value) != float("inf") else str(value)



def _json_default(value: Any) -> Any:  # pragma: no cover - used by callers dumping reports
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


def report_json(report: ExportReport) -> str:
    """The report as JSON text (for the project file's export history)."""
    return json.dumps(report.to_dict(), default=_json_default, indent=2)
