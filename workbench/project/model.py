"""What a project holds, as plain data (no torch modules, no Qt): saved by :mod:`workbench.project.store`."""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.sources.data_source import DataSpec, InputSpec
from workbench.sources.model_source import FileDigest, ModelSpec

if TYPE_CHECKING:
    from workbench.quant.algorithms.calibrate import CalibrationResult, QuantizerCalibration

__all__ = ["LayerDecision", "QuantizerRecord", "CalibrationRecord", "SensitivityRecord", "FallbackRecord",
           "ExportRecord", "FinetuneRecord", "EngineReportRecord", "LintRecord", "SmoothingRecord", "Project",
           "ProjectOrigin", "now_iso", "DATA_ROLES"]

DATA_ROLES = ("calibration", "evaluation", "training")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class LayerDecision:
    """The user's choice for one quantizable layer: quantize or leave in float, and descriptor overrides.

    ``input_desc`` / ``weight_desc`` hold :meth:`QuantDescriptor.dict` fields; None means the layer
    type's default descriptor.
    """

    name: str
    type: str
    quantize: bool = True
    input_desc: dict[str, Any] | None = None
    weight_desc: dict[str, Any] | None = None


@dataclass
class QuantizerRecord:
    """One quantizer's calibration outcome, with the statistics to recompute or plot it."""

    name: str
    amax: np.ndarray
    method: str
    calibrator: str
    num_samples: int = 0
    nonfinite_count: int = 0
    max_value: float | None = None
    calibrator_state: dict[str, Any] | None = None  # MaxCalibrator/HistogramCalibrator.state()
    descriptor: dict[str, Any] | None = None  # the descriptor it was calibrated with
    # how "auto" chose ``method`` (MethodChoice.to_dict: method, reason, amax and SQNR per candidate); None when
    # the method was given
    choice: dict[str, Any] | None = None
    # warnings about this quantizer's amax (CalibrationWarning.to_dict: quantizer, kind, message)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reason(self) -> str:
        """Why this quantizer has its method, in words ("" when the method was the run's own)."""
        return str(self.choice.get("reason", "")) if self.choice else ""

    @classmethod
    def from_calibration(cls, item: QuantizerCalibration, *, calibrator_state: dict[str, Any] | None,
                         descriptor: dict[str, Any] | None, name: str | None = None) -> QuantizerRecord:
        """The record of one quantizer's calibration outcome (what
        :func:`workbench.quant.algorithms.calibrate.calibrate` measured), with the statistics and descriptor to keep
        beside it; ``name`` when the quantizer is recorded under another of its names (one shared by a placement
        rule)."""
        return cls(name or item.name, item.amax.numpy().astype(np.float32), item.method, item.calibrator,
                   item.num_samples, item.nonfinite_count, item.max_value, calibrator_state, descriptor,
                   None if item.choice is None else item.choice.to_dict(), [w.to_dict() for w in item.warnings])


@dataclass
class CalibrationRecord:
    id: int
    created: str
    method: str
    percentile: float
    num_batches: int
    wall_time_s: float
    device: str
    output_sqnr_db: float | None = None
    warnings: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    quantizers: dict[str, QuantizerRecord] = field(default_factory=dict)
    # layers whose BatchNorm was folded into them when this run calibrated (their weight amax is of the
    # folded weight); None for runs saved before folding existed (nothing was folded)
    folded: list[str] | None = None
    sqnr_batches: int = 0  # the batches output_sqnr_db is pooled over (0: saved before it was counted: the first)
    # workbench.session.state.state_digest of the project right after the run: output_sqnr_db describes that
    # state only (a later edit, amax method or fallback makes it stale); None for runs saved before format 4
    state_digest: str | None = None
    # workbench.session.weights.weights_digest of the float model this run calibrated: a factory with random
    # initialisation builds other weights at every command, which the stored amax do not describe; None: unknown
    weights_digest: str | None = None

    @classmethod
    def from_result(cls, result: CalibrationResult, *, id: int, created: str, quantizers: dict[str, QuantizerRecord],
                    folded: list[str] | None) -> CalibrationRecord:
        """The record of a calibration run: the run's own numbers from ``result``, the quantizers' records."""
        return cls(id=id, created=created, method=result.method, percentile=float(result.percentile),
                   num_batches=result.num_batches, wall_time_s=result.wall_time_s, device=result.device,
                   output_sqnr_db=result.output_sqnr_db, warnings=list(result.warnings), unused=list(result.unused),
                   quantizers=quantizers, folded=folded, sqnr_batches=result.sqnr_batches)


@dataclass
class SensitivityRecord:
    """A sensitivity run in the serialised form of workbench.analysis (results per unit inside)."""

    id: int
    created: str
    data: dict[str, Any]


@dataclass
class FallbackRecord:
    id: int
    created: str
    data: dict[str, Any]
    applied: bool = False


@dataclass
class ExportRecord:
    id: int
    created: str
    path: str
    settings: dict[str, Any]
    report: dict[str, Any]


@dataclass
class LintRecord:
    """The last fusion lint (workbench.export.lint warnings as dicts) and the project state it was run on
    (workbench.session.state.state_digest): reused, not exported again, while the state is the same."""

    id: int
    created: str
    digest: str
    warnings: list[dict[str, Any]]
    source: str = ""  # what was linted: "preview export", an exported file, or "the last lint" (reused)


@dataclass
class EngineReportRecord:
    """A TensorRT engine report imported into the project (:meth:`workbench.engine.EngineReport.to_dict`)."""

    id: int
    created: str
    data: dict[str, Any]


@dataclass
class FinetuneRecord:
    """One quantization-aware fine-tune: its settings and history, and (for the active one) its result.

    ``data`` is :meth:`workbench.training.FinetuneResult.to_dict` (settings, per-epoch loss and metric).
    ``weights`` are the quantized model's parameters after the fine-tune, by name, and ``amax`` the
    learned ranges; both are kept for the active run only (older runs keep their history). They apply
    while the model is built the same way: ``folded`` is the fold state they were trained with and
    ``calibration_id`` the calibration the learned ranges replace.
    """

    id: int
    created: str
    data: dict[str, Any]
    calibration_id: int | None = None
    folded: list[str] = field(default_factory=list)
    active: bool = True
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    amax: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class SmoothingRecord:
    """One layer's smoothing (SmoothQuant or AWQ, :mod:`workbench.quant.algorithms.smoothing`): the weight's input
    columns are multiplied by ``scales`` in the quantized model, its input divided by them (folded into
    ``folded_into``'s weight and bias, or a Mul before the input quantizer when None)."""

    layer: str
    method: str
    alpha: float
    scales: np.ndarray
    folded_into: str | None = None
    error_before: float | None = None
    error_after: float | None = None


@dataclass
class ProjectOrigin:
    """Where a project in memory came from: the file, its revision then, and a digest of each part.

    A save compares the file's revision with ``revision``; when another process saved in between, the
    digests tell what each side changed (see :mod:`workbench.project.merge`).
    """

    path: str
    revision: int
    digests: dict[str, str] = field(default_factory=dict)


@dataclass
class Project:
    """Everything a project file holds."""

    name: str = "untitled"
    model: ModelSpec | None = None
    model_digests: list[FileDigest] = field(default_factory=list)
    input_spec: InputSpec | None = None
    data: dict[str, DataSpec] = field(default_factory=dict)
    layers: dict[str, LayerDecision] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    calibrations: list[CalibrationRecord] = field(default_factory=list)
    sensitivity: list[SensitivityRecord] = field(default_factory=list)
    fallbacks: list[FallbackRecord] = field(default_factory=list)
    exports: list[ExportRecord] = field(default_factory=list)
    finetunes: list[FinetuneRecord] = field(default_factory=list)
    engine_reports: list[EngineReportRecord] = field(default_factory=list)
    lints: list[LintRecord] = field(default_factory=list)  # the latest fusion lint only
    smoothing: dict[str, SmoothingRecord] = field(default_factory=dict)  # by layer name
    created: str = field(default_factory=now_iso)
    modified: str = field(default_factory=now_iso)
    app_version: str = ""
    saved_in: str = ""  # the folder the project was last saved in: where its relative paths used to lead
    # the file and revision this was loaded from or last saved to (None: not from a file yet)
    origin: ProjectOrigin | None = field(default=None, compare=False, repr=False)

    @property
    def current_calibration(self) -> CalibrationRecord | None:
        return self.calibrations[-1] if self.calibrations else None

    @property
    def current_finetune(self) -> FinetuneRecord | None:
        """The fine-tune whose weights the quantized model uses (None: the model's own weights)."""
        return next((record for record in reversed(self.finetunes) if record.active), None)

    def next_id(self, records: list) -> int:
        return 1 + max((record.id for record in records), default=0)
