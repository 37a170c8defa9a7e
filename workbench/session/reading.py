"""The Session's reading side: what the front ends read of an open project, without changing it.

:class:`SessionReading` is the base of :class:`workbench.session.core.Session`, which holds the state and the
actions (create, edit, calibrate, export...). Here: the data sources and sample inputs, the layers and their
descriptors and precisions, the typed settings, the live quantized model (built when first read after an edit),
histograms and weight ranges, the latest stored results, export paths and the summary ``workbench show`` prints.
Reading may build or cache (the quantized model, the layer shapes) but never changes the project.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from workbench.graph import ModelTree, describe_model
from workbench.graph.fold import FoldReport
from workbench.project import ExportRecord, Project, file_revision, load_project
from workbench.project.settings import ProjectSettings
from workbench.quant.algorithms.precision import Precision
from workbench.quant.algorithms.residency import WithDerivedWeights
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.session import (
    analysis,
    calibration,
    configure,
    data_sources,
    decisions,
    exports,
    finetuning,
    paths,
    tensorrt,
    views,
)
from workbench.session import ladder as ladder_job
from workbench.session.build import BuildReport, build_quantized, fold_base
from workbench.session.errors import SessionError
from workbench.session.state import state_digest
from workbench.session.views import LayerView
from workbench.sources.data_source import DataSource
from workbench.sources.model_source import LoadedModel
from workbench.sources.paths import absolute_path
from workbench.sources.shapes_only import on_meta, run_on_shapes_first
from workbench.sources.trust import TRUSTED, CodeReference, trust_status

T = TypeVar("T")

__all__ = ["SessionReading"]


class SessionReading:
    """What the front ends read of an open project; the state is the Session's (set in its ``__init__``)."""

    project: Project
    path: Path | None
    base_dir: Path
    trust_code: bool
    float_model: nn.Module
    device: torch.device
    build_report: BuildReport
    last_build_s: float
    file_changes: list[str]
    _loaded: LoadedModel
    _data: data_sources.DataSources
    _settings: tuple[dict[str, Any], ProjectSettings] | None
    _quant_model: nn.Module | None
    _folded: tuple[nn.Module, FoldReport] | None
    _layer_shapes: dict[str, dict[str, Any]] | None

    def changed_on_disk(self) -> bool:
        """Whether another process saved the project file since this session opened or last saved it."""
        origin = self.project.origin
        if self.path is None or origin is None:
            return False
        return file_revision(self.path) != origin.revision

    @staticmethod
    def code_references(path: str | Path) -> list[CodeReference]:
        """The code a project file would run (model, data, metric, loss) and why it needs trust, read
        without running any of it; empty for a project that runs none."""
        path = Path(path)
        return paths.project_code(load_project(path), path.parent)

    @staticmethod
    def trust_status(path: str | Path) -> str:
        """Whether the project's code is trusted as it is now: ``"trusted"``, ``"changed"`` (trusted before
        the code changed) or ``"unknown"`` (never trusted, or a copy); ``"trusted"`` for one with no code."""
        references = SessionReading.code_references(path)
        return trust_status(path, references) if references else TRUSTED

    def data(self, role: str = "calibration") -> DataSource:
        """The opened data source for ``role`` (evaluation falls back to calibration data; training data to
        all of the calibration data, shuffled)."""
        return self._data.get(self.project, role, trust_code=self.trust_code, base_dir=self.base_dir)

    def sample_inputs(self, batch: int = 1) -> Any:
        """The first ``batch`` samples of the calibration data, on the session's device: a tensor, or a dict
        of keyword inputs (``input_ids``, ``attention_mask``...)."""
        return data_sources.sample_inputs(self.data("calibration"), self.device, batch)

    def _streamed(self, job: Callable[[], T]) -> T:
        """``job()`` (a forward of the model, or a build that runs one), with a lazily opened model's weights read
        module by module as the forward reaches them (every weight is loaded when it cannot be: as eagerly)."""
        checkpoint = self._loaded.checkpoint
        return job() if checkpoint is None else checkpoint.run_streamed(self.float_model, job)

    def _on_shapes(self) -> bool:
        """Whether sample forwards run on shapes only (:mod:`workbench.sources.shapes_only`): a lazily opened model
        whose weights are not all in memory, where a real forward would read the whole checkpoint."""
        checkpoint = self._loaded.checkpoint
        return checkpoint is not None and not checkpoint.resident(self.float_model)

    def _sample_run(self, job: Callable[[Any], T], sample: Any, what: str) -> T:
        """``job(sample)``: a build or check that runs the model on one sample, on meta (``sample`` moved there, no
        weight read) where :meth:`_on_shapes`, else, or when that fails, on the weights, streamed."""
        if sample is None or not self._on_shapes():
            return self._streamed(lambda: job(sample))
        return run_on_shapes_first(lambda: job(on_meta(sample)), lambda: self._streamed(lambda: job(sample)), what)

    def _example_inputs(self):
        """One sample, for the functional rewrite's check of traced modules; None without usable data."""
        return data_sources.example_inputs(self.sample_inputs)

    def layers(self) -> list[LayerView]:
        """Every quantizable layer with its decision, descriptors, amax and sensitivity rank."""
        return views.layer_views(self.project, self.quantized_model())

    def tree(self) -> ModelTree:
        """The module tree of the quantized model (names, types, parameters, quantizer states)."""
        return describe_model(self.quantized_model())

    def select(self, *, names: Iterable[str] | None = None, patterns: Iterable[str] | None = None,
               types: Iterable[str] | None = None, subtree: str | None = None) -> list[str]:
        """Quantizable layers matching any of the criteria (regex patterns match like the ignore policy)."""
        return decisions.select(self.project, names=names, patterns=patterns, types=types, subtree=subtree)

    def ignore_preview(self, patterns: Iterable[str]) -> list[str]:
        """The layers an ignore policy (list of regexes) would leave in float, without changing anything."""
        return decisions.ignore_preview(self.project, patterns)

    def precision_problems(self, names: Iterable[str], precision: Precision | str) -> dict[str, str]:
        """Why ``precision`` cannot be set on each of ``names`` it does not fit (nothing is changed)."""
        return decisions.precision_problems(self.project, self.quantized_model(), self.settings.defaults, names,
                                            precision)

    def precisions(self, names: Iterable[str] | None = None) -> dict[str, Precision | None]:
        """The precision each layer (all by default) runs in; None for custom descriptors."""
        return decisions.precisions(self.project, self.quantized_model(), names)

    def weight_bytes(self, mix: dict[str, Precision | None] | None = None) -> int:
        """Bytes of the model's weights (scales included) with the layers in ``mix``'s precisions (default:
        their precisions now; a layer left out of ``mix`` counts as float)."""
        return decisions.mix_weight_bytes(self.project, self.quantized_model(), mix)

    def descriptors(self, names: Iterable[str], role: str) -> dict[str, dict[str, Any] | None]:
        """The descriptor fields each layer's ``role`` quantizer uses: its override, else the default it was built with.

        None for a layer without a quantizer for that role (a pooling layer has no weight quantizer).
        """
        if role not in ("input", "weight"):
            raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
        return decisions.descriptors(self.project, self.quantized_model(), names, role)

    def layer_shapes(self) -> dict[str, dict[str, Any]]:
        """Input, output and weight shapes of the float model's modules, from one sample input (computed once).

        Keys are module names; values ``{"inputs": [shape, ...], "output": shape | None, "weight": shape | None}``.
        Functional layers (an fx-inserted add) are not modules of the float model and have no entry.
        """
        if self._layer_shapes is None:
            sample = self.sample_inputs(batch=1)
            self._layer_shapes = self._sample_run(lambda inputs: views.layer_shapes(self.float_model, inputs), sample,
                                                  "the layer shapes")
        return self._layer_shapes

    @property
    def settings(self) -> ProjectSettings:
        """The project's settings, typed and checked: read them here, change them with :meth:`set_settings`.

        Made from the stored settings (``project.settings``, the file's JSON) when they changed since the
        last read, so it never disagrees with what a save writes.
        """
        self._settings = configure.typed_settings(self.project.settings, self._settings)
        return self._settings[1]

    def quantized_model(self) -> nn.Module:
        """The quantized model for the current decisions, calibrated as far as the project knows."""
        if self._quant_model is None:
            started = time.perf_counter()
            base, folding = self._fold_base()
            example = self._example_inputs()
            built = self._sample_run(lambda inputs: build_quantized(base, self.project, self.device, folding=folding,
                                                                    example_inputs=inputs, settings=self.settings),
                                     example, "building the quantized model")
            self._quant_model, self.build_report = built.model, built.report
            self.last_build_s = time.perf_counter() - started
        derived = self._block_residency()
        checkpoint = self._loaded.checkpoint
        if derived.pending() and checkpoint is not None and checkpoint.resident(self.float_model):
            derived.load("", self._quant_model)  # every weight was read since (a job that needs them all)
        return self._quant_model

    def _block_residency(self) -> WithDerivedWeights:
        """What a job walking the quantized model block by block loads and releases each block with: the lazily
        opened checkpoint's weights, and the smoothed weights computed from them (:class:`WithDerivedWeights`)."""
        return WithDerivedWeights(self._loaded.residency, self.build_report.derived_weights)

    @property
    def needs_rebuild(self) -> bool:
        """True after a decision changed: the next use rebuilds the quantized model (``last_build_s`` says
        how long the last build took, so a front end can do it in the background when it is slow)."""
        return self._quant_model is None

    def _fold_base(self) -> tuple[nn.Module, FoldReport | None]:
        """The model quantized models are built from: the float model, with BatchNorm folded when the
        project says so (computed once; see :func:`fold_base`)."""
        if not self.settings.fold_bn:
            return self.float_model, None
        if self._folded is None:
            if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.float_model.modules()):
                self._loaded.materialise()  # folding computes new weights from the real ones
            self._folded = fold_base(self.float_model, self.project.input_spec, self.device)
        return self._folded

    def folded_layers(self) -> dict[str, str]:
        """layer -> the BatchNorm folded into it, in the quantized model (empty when folding is off)."""
        self.quantized_model()
        folding = self.build_report.folding
        return dict(folding.folded_into) if folding is not None else {}

    def histogram(self, quantizer_name: str) -> dict[str, Any] | None:
        """Histogram counts, bin edges and the amax every method gives, for plotting; None without one."""
        quantizer = quantizer_names(self.quantized_model()).get(quantizer_name)
        if quantizer is None:
            raise SessionError(f"{quantizer_name!r} is not a quantizer of this model.")
        run = self.project.current_calibration
        return views.histogram_of(quantizer, run.quantizers.get(quantizer_name) if run else None)

    def weight_ranges(self, layer: str) -> np.ndarray | None:
        """Per-output-channel max |w| of a layer's weight (for the bar plot), or None without weights."""
        module = dict(self.quantized_model().named_modules()).get(layer)
        checkpoint = self._loaded.checkpoint
        if module is None or checkpoint is None or checkpoint.resident(module):
            return views.weight_ranges(module)
        checkpoint.load(layer, module)  # this layer's weights only, for as long as the plot needs them
        try:
            return views.weight_ranges(module)
        finally:
            checkpoint.release(layer, module)

    def metric(self):
        """The project's metric as a workbench.analysis Metric (entry points need trust)."""
        setting = self.settings.metric
        return self._resolve_metric(setting.name, setting.direction)

    def _resolve_metric(self, metric: Any, direction: str | None = None):
        return analysis.resolve_metric(metric, direction, trust_code=self.trust_code, base_dir=self.base_dir)

    def _analysis_batches(self) -> list:
        return analysis.analysis_batches(self.data("evaluation"))

    def latest_sensitivity(self):
        """The last sensitivity ranking stored in the project (None if there was none)."""
        return analysis.latest_sensitivity(self.project)

    def ladder_changes(self, result: Any = None) -> list[ladder_job.MixChange]:
        """What applying a ladder's mix (the last search's by default) changes: one entry per layer whose precision
        changes, marked ``hand_set`` where that overrides a precision or descriptors the user set by hand."""
        result = result if result is not None else self.latest_ladder()
        if result is None:
            return []
        own = self.precisions()
        return ladder_job.mix_changes(self.project, own, result.precisions,
                                      ladder_job.hand_set_layers(self.project, own))

    def latest_ladder(self):
        """The last ladder search stored in the project (None if there was none)."""
        return analysis.latest_ladder(self.project)

    def latest_fallback(self):
        """The last fallback search stored in the project (None if there was none)."""
        return analysis.latest_fallback(self.project)

    def layers_of(self, unit: Any) -> list[str]:
        """The quantizable layers a sensitivity or fallback unit switches (a Unit, a UnitResult or a name).

        A unit is named by its quantizers (``block.add._input1_quantizer``); the views select and
        ignore layers, so they map units to layers through here.
        """
        return analysis.layers_of(self.project, unit)

    def latest_lint(self):
        """(warnings, changed since, what was linted) of the project's last lint; None when never linted."""
        return tensorrt.latest_lint(self.project)

    def latest_engine_report(self):
        return tensorrt.latest_engine_report(self.project)

    def state_digest(self) -> str:
        """A digest of what the quantized model computes now (see :mod:`workbench.session.state`): a result that
        kept the digest of its own state (output SQNR, lint, export) is current while the two are equal."""
        return state_digest(self.project)

    def default_export_path(self) -> Path:
        """Where ``export`` writes without a path: the project's export setting (relative to the project's
        folder), else ``<project>.qdq.onnx`` next to it."""
        return exports.default_export_path(self.project, self.settings.export, self.path, self.project_dir)

    def overwrite_refusal(self, path: str | Path | None = None) -> str | None:
        """Why :meth:`export` to ``path`` (default: the project's) would refuse without ``force``; None if it
        would not."""
        target = Path(path).expanduser().resolve() if path is not None else self.default_export_path()
        return exports.overwrite_refusal(self.project, self.settings.export, target, self.project_dir)

    def export_path(self, record: ExportRecord) -> str:
        """Where an export of the history lies (its stored path is relative to the project's folder)."""
        return absolute_path(record.path, self.project_dir) or record.path

    @property
    def project_dir(self) -> Path:
        """The folder the project's relative paths (exports, data, code) are taken from: the project file's,
        or before the first save the folder it was created in."""
        return self.path.parent if self.path is not None else self.base_dir

    def finetune_history(self) -> list[Any]:
        """Every stored fine-tune as a :class:`workbench.training.FinetuneResult` (no model), oldest first."""
        return finetuning.finetune_history(self.project)

    def _require_calibrated(self) -> nn.Module:
        """The quantized model, once calibrated. Quantizers the last calibration never reached (no data flowed
        through them) keep no amax: export leaves them in float and says so. Any other quantizer without amax
        (never calibrated, or stale after its descriptor changed) is refused: calibrate first."""
        model = self.quantized_model()
        calibration.check_calibrated(model, self.project.current_calibration)
        return model

    def summary(self, layers: list[LayerView] | None = None) -> dict[str, Any]:
        """A JSON-able overview for ``workbench show`` (``layers``: :meth:`layers`, when the caller has them)."""
        model = self.quantized_model()
        return views.summary(self.project, model, self.build_report, self.settings, path=self.path,
                             model_description=self._loaded.describe(),
                             export_paths=[self.export_path(record) for record in self.project.exports],
                             file_changes=self.file_changes, layers=layers)
