"""The session: one open project and the things a user can do with it.

A :class:`Session` owns one project (plain data, saved by :mod:`workbench.project`) and the live
models built from it: the float model from the project's model source and the quantized model
(:func:`workbench.session.build.build_quantized`). Its methods are the user's actions: create, open and
save a project; choose data; select layers and edit their descriptors; change settings; calibrate,
rank sensitivity, search a fallback, evaluate, fine-tune and export. Long jobs take a
``progress(done, total, message)`` callback and a ``cancel`` token with ``is_set()`` and never touch
Qt: the GUI runs them in a worker thread, the CLI with a tqdm bar. What the front ends read of it (layers,
settings, the live quantized model, the latest results) is its base class's, in :mod:`workbench.session.reading`,
turned into rows by :mod:`workbench.session.views`.
"""
from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench import __version__
from workbench.graph.fold import FoldReport
from workbench.project import (
    CalibrationRecord,
    Project,
    load_project,
    save_project,
)
from workbench.project.settings import DEFAULT_SETTINGS, ProjectSettings
from workbench.quant.algorithms.calibrate import CalibrationResult, CancelToken, ProgressCallback
from workbench.quant.algorithms.distributed import DistContext
from workbench.quant.algorithms.precision import mix_label
from workbench.quant.algorithms.residency import WithDerivedWeights
from workbench.session import (
    analysis,
    calibration,
    configure,
    data_sources,
    decisions,
    exports,
    finetuning,
    paths,
    recalibration,
    smoothing,
    tensorrt,
    weights,
)
from workbench.session import ladder as ladder_job
from workbench.session.build import BuildReport, build_quantized, quantizable
from workbench.session.edits import SessionEdits
from workbench.session.errors import SessionError
from workbench.session.events import EventEmitter, SessionEvent
from workbench.session.state import state_digest
from workbench.sources.data_source import DataSpec
from workbench.sources.errors import EntryPointError, TrustRequired
from workbench.sources.model_source import LoadedModel, ModelSpec, load_model
from workbench.sources.trust import CHANGED, TRUSTED, UNKNOWN, remember_trust, trust_status

logger = logging.getLogger(__name__)

__all__ = ["Session"]


class Session(SessionEdits):
    """One open project and its live models. Not thread-safe: one job at a time.

    Three sides, one object: what the front ends read of it (layers, settings, the quantized model, the latest
    results) is :class:`~workbench.session.reading.SessionReading`'s; the edits of the project (data, layers,
    descriptors, precisions, settings, applying a search's result) are :class:`~workbench.session.edits.SessionEdits`'s;
    construction, saving and the jobs (calibrate, sensitivity, searches, evaluate, export, lint, fine-tune) are here.
    """

    def __init__(self, project: Project, *, path: Path | None = None, base_dir: Path | None = None,
                 trust_code: bool = False) -> None:
        if project.model is None:
            raise SessionError("The project has no model source.")
        self.project = project
        self.path = path
        self.base_dir = base_dir or (path.parent if path is not None else Path.cwd())
        self.trust_code = trust_code
        self.dirty = False
        self.events = EventEmitter()  # what changed, for the front ends (see workbench.session.events)
        self.who = "this command"  # who opened the file, for the message when another process saved it meanwhile
        self.merged_on_save: list[str] = []  # what the last save kept of another process's changes
        self.file_changes: list[str] = []  # model/weights files that differ from when the project was made
        self.notes: list[str] = []  # what the last edit accepted but the user should know (4-bit: simulation only)
        self.unsaved_export_files: list[Path] = []  # files the last export created, recorded by the next save
        for key, value in DEFAULT_SETTINGS.items():
            project.settings.setdefault(key, copy.deepcopy(value))
        self._settings: tuple[dict[str, Any], ProjectSettings] | None = None  # (stored, typed), see settings
        try:
            self._loaded: LoadedModel = load_model(project.model, trust_code=trust_code, base_dir=self.base_dir,
                                                   lazy=True)
        except EntryPointError as error:
            raise EntryPointError(f"{error}{paths.moved_hint(project, self.base_dir)}") from error
        self.float_model: nn.Module = self._loaded.model
        self._data = data_sources.DataSources()
        self._quant_model: nn.Module | None = None
        self.last_build_s = 0.0
        self._folded: tuple[nn.Module, FoldReport] | None = None  # the float model with BatchNorm folded
        self.build_report = BuildReport()
        self._layer_shapes: dict[str, dict[str, Any]] | None = None
        self._ladder_undo: dict[str, Any] | None = None  # the layers' decisions before the last ladder Apply
        self._ladder_undo_run: CalibrationRecord | None = None  # and the calibration current then
        self.file_changes += paths.changed_files(project, self._loaded.digests)
        # kept with each calibration run; a lazily opened model's weights are read for it one at a time
        checkpoint = self._loaded.checkpoint
        self.weights_digest = weights.weights_digest(
            self.float_model, checkpoint.sampled_state(self.float_model) if checkpoint is not None else None)
        self.file_changes += weights.other_weights_note(project, self.weights_digest)
        self.device = torch.device(self.settings.device)
        self._loaded.to(self.device)

    # ----- construction -----------------------------------------------------------------------

    @classmethod
    def create(cls, model: ModelSpec, calibration: DataSpec, evaluation: DataSpec | None = None, *,
               trust_code: bool = False, input_shape: Sequence[int] | None = None, name: str | None = None,
               base_dir: Path | None = None, settings: dict[str, Any] | None = None) -> Session:
        """A new project on ``model`` with ``calibration`` data (and optional evaluation data).

        The model is loaded, its input taken from the data (or ``input_shape``), and one forward pass
        checks that the two fit. Layers start as the defaults: every quantizable layer quantized.
        """
        base = base_dir or Path.cwd()
        settings = {key: configure.checked_value(key, value) for key, value in (settings or {}).items()}
        project = Project(name=name or Path(model.target).stem or "project", model=model,
                          data={"calibration": calibration}, app_version=__version__)
        if evaluation is not None:
            project.data["evaluation"] = evaluation
        project.settings.update(settings)
        session = cls(project, base_dir=base, trust_code=trust_code)
        project.model_digests = session._loaded.digests
        project.input_spec = data_sources.checked_input_spec(project, session.data, input_shape)
        session.check_forward()
        session._init_layers()
        session.dirty = True
        return session

    @classmethod
    def open(cls, path: str | Path, *, trust_code: bool = False, remembered: bool = True) -> Session:
        """Open a project file; the model is rebuilt and its calibration restored without recalibrating.

        ``trust_code`` lets the project's code run and remembers that trust for this file and this code
        (:mod:`workbench.sources.trust`); without it, trust remembered earlier for the same file and the
        same code applies, unless ``remembered`` is False.
        """
        path = Path(path)
        project = load_project(path)
        if project.model is None:  # a file whose model row was deleted: say so before anything reads it
            raise SessionError(f"{path}: the project has no model (its table model_source is empty); it was not "
                               "opened. Use a backup, or make a new project with `workbench new`.")
        references = paths.project_code(project, path.parent)
        status = trust_status(path, references) if references and remembered and not trust_code else UNKNOWN
        try:
            session = cls(project, path=path, base_dir=path.parent, trust_code=trust_code or status == TRUSTED)
        except TrustRequired as error:
            if status != CHANGED:
                raise
            raise TrustRequired(f"{error} {paths.trust_changed_hint(path, references)}") from None
        if trust_code and references:
            remember_trust(path, references)
        if session.file_changes or not project.layers:
            session._sync_layers()  # the model may have new or fewer layers than the project knows
        model = session.quantized_model()  # rebuild now: errors surface on open, not on first use
        if any(name not in project.layers for name, _, _ in quantizable(model)):
            session._sync_layers()  # code changed without a file to fingerprint (a package entry point)
        return session

    def save(self, path: str | Path | None = None) -> Path:
        """Save to ``path`` (or where it was opened/last saved). Paths in the project become relative to it."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise SessionError("The project has no file yet: give a path to save it to.")
        if target.suffix == "":
            target = target.with_suffix(".qwb")
        target = target.resolve()
        if self.path is None or target.parent != self.base_dir.resolve():
            paths.rebase(self.project, self.settings, self.base_dir, target.parent)
            self.base_dir = target.parent
            self._data.clear()
        self.project.name = self.project.name or target.stem
        report = save_project(self.project, target, who=self.who)
        if report.merged:  # another process's changes are in the project now: build from them
            self._quant_model = None
            self._data.clear()
            logger.info("%s: kept what another process saved meanwhile: %s", target, ", ".join(report.merged))
        self.merged_on_save = report.merged
        if self.trust_code:  # the user trusts this code (and may have added some, a metric): remember it here
            references = paths.project_code(self.project, target.parent)
            if references:
                remember_trust(target, references)
        self.path = target
        self.dirty = False
        self.events.emit(SessionEvent.SAVED, path=str(target))
        return target

    def _join(self, context: DistContext | None) -> DistContext:
        """The job's context; on nccl the models move to this rank's GPU (the project keeps its device setting)."""
        context, device = configure.job_device(context, self.device)
        if device is not None:
            setting = self.settings.device
            self.set_device(str(device))
            self.project.settings["device"] = setting
        return context

    # ----- jobs -------------------------------------------------------------------------------

    def calibrate(self, *, method: str | None = None, num_batches: int | None = None,
                  percentile: float | None = None, progress: ProgressCallback | None = None,
                  cancel: CancelToken | None = None, context: DistContext | None = None,
                  block_method: str | None = None, smoothquant: float | str | None = None,
                  awq: bool | None = None, sequential: bool | None = None) -> CalibrationResult:
        """Calibrate on the calibration data and store the result (amax and histograms) in the project.

        Args:
            method, num_batches, percentile, block_method: as
                :func:`workbench.quant.algorithms.calibrate.calibrate` takes them; None: the project's ``calibration``
                setting.
            progress, cancel: ``progress(done, total, message)`` after each batch; a set ``cancel`` stops the
                run and leaves the project as it was.
            context: with a distributed ``context`` (torchrun, ``--workers``) this process calibrates on its
                share of the batches and every rank ends with the merged, one-process result; only rank 0
                should save the project (the session never saves on its own).
            smoothquant, awq: ``smoothquant`` (an alpha in [0, 1], or ``"off"``) and ``awq`` (True/False) first
                compute (or clear) that smoothing (see :meth:`smooth`); None leaves it as it is.
            sequential: one block at a time (None: the project's ``calibration.sequential``); see
                :func:`workbench.session.calibration.calibrate`.
        Returns:
            The :class:`~workbench.quant.algorithms.calibrate.CalibrationResult`, also stored as the project's current
            calibration.
        """
        in_blocks = self.settings.calibration.sequential if sequential is None else sequential
        if not in_blocks:  # one block at a time reads each block's weights when it runs, and lets them go after
            self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        if (smoothquant is not None or awq is not None) and context is not None and context.distributed:
            raise SessionError("SmoothQuant and AWQ scales are computed in one process (every rank must use the same "
                               "ones): calibrate with --smoothquant/--awq without --workers, then with workers.")
        decisions.require_quantized(self.project, "calibrate or smooth")
        if smoothquant is not None:
            self.smooth("smoothquant", smoothing.parse_alpha(smoothquant), num_batches=num_batches,
                        sequential=in_blocks, progress=progress, cancel=cancel)
        if awq is not None:
            self.smooth("awq", 1.0 if awq else None, num_batches=num_batches, sequential=in_blocks,
                        progress=progress, cancel=cancel)
        context = self._join(context)
        options = self.settings.calibration
        block_method = calibration.checked_block_method(block_method or options.block_method)
        model = self.quantized_model()
        result, record = calibration.calibrate(
            model, self.data("calibration"), self.project, options, device=self.device, folded=self.folded_layers(),
            method=method, num_batches=num_batches, percentile=percentile, progress=progress, cancel=cancel,
            context=context, block_method=block_method, sequential=sequential,
            residency=self._block_residency() if in_blocks else None)
        self.project.calibrations.append(record)
        record.state_digest = state_digest(self.project)  # what the run's output SQNR was measured on
        record.weights_digest = self.weights_digest
        # what was stale (calibrated with another descriptor) is calibrated with its own now
        self.build_report.stale = [name for name in self.build_report.stale if name not in record.quantizers]
        self._changed(SessionEvent.CALIBRATION)
        return result

    def calibrate_applied(self, *, progress: ProgressCallback | None = None,
                          cancel: CancelToken | None = None) -> CalibrationResult:
        """Calibrate after a ladder's Apply: only the layers whose quantizers it changed, when nothing else changed
        since the current calibration (the amax a whole calibration gives, see
        :mod:`workbench.session.recalibration`); else the whole model (:meth:`calibrate`)."""
        before = self._ladder_undo
        why = "no ladder mix applied" if not before else recalibration.partial_allowed(
            self.project, before, self.settings.calibration, self.data("calibration"),
            weights_digest=self.weights_digest)
        run = self.project.current_calibration
        layers = recalibration.stale_layers(self.quantized_model(), run) if why is None and run is not None else []
        if not layers:
            if why is not None:
                logger.info("calibrating the whole model: %s", why)
            return self.calibrate(progress=progress, cancel=cancel)
        self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        result, record = recalibration.calibrate_layers(
            self.quantized_model(), self.data("calibration"), self.project, self.settings.calibration, layers,
            device=self.device, folded=list(self.folded_layers()), progress=progress, cancel=cancel)
        self.project.calibrations.append(record)
        record.state_digest = state_digest(self.project)
        record.weights_digest = self.weights_digest
        self.build_report.stale = [name for name in self.build_report.stale if name not in record.quantizers]
        self._changed(SessionEvent.CALIBRATION)
        return result

    def smooth(self, method: str, alpha: float | None, *, num_batches: int | None = None,
               sequential: bool | None = None, progress: ProgressCallback | None = None,
               cancel: CancelToken | None = None) -> list[str]:
        """Compute ``method``'s smoothing ("smoothquant" with strength ``alpha``, or "awq", which searches its
        own exponent) for every layer it applies to, replacing that method's earlier records; ``alpha`` None
        clears them, so the layers get their original weights back exactly. Returns the layers smoothed.

        ``sequential`` (None: the project's ``calibration.sequential``) computes it one block at a time, each
        block's weights read when it runs (the same records; ``progress`` and ``cancel`` per block, as sequential
        calibration takes them). The quantized model's weights change: calibrate afterwards (:meth:`calibrate` with
        ``smoothquant=`` does both).
        """
        sequential = self.settings.calibration.sequential if sequential is None else sequential
        if not sequential:
            self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        self.project.smoothing = {name: record for name, record in self.project.smoothing.items()
                                  if record.method != method}
        self._invalidate()
        if alpha is None:
            self._changed(SessionEvent.LAYERS)
            return []
        layers, blocks = smoothing.layers_to_smooth(self.project, self.quantized_model(), self.precisions(), method)
        count = num_batches if num_batches is not None else self.settings.calibration.num_batches
        base, _ = self._fold_base()
        records = smoothing.compute_smoothing(base, layers, list(self.data("calibration").batches(count)),
                                              method=method, alpha=alpha, device=self.device, block_sizes=blocks,
                                              sequential=sequential, residency=self._loaded.residency,
                                              progress=progress, cancel=cancel)
        self.project.smoothing.update(records)
        self._invalidate()
        self._changed(SessionEvent.LAYERS)
        return sorted(records)

    def recompute_amax(self, names: Iterable[str], method: str, percentile: float | None = None) -> dict[str, float]:
        """Switch quantizers to another amax method using their stored histograms (no pass over data).

        ``names`` are quantizer names (``layer._input_quantizer``) or layer names (their histogram
        quantizers). Returns the new amax per quantizer; the current calibration record is updated.
        """
        self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        updated = calibration.recompute_amax(self.quantized_model(), self.project, names, method, percentile,
                                             device=self.device)
        self._changed(SessionEvent.CALIBRATION, quantizers=list(updated))
        return updated

    def sensitivity(self, *, scheme: str = "one-off", metric: Any = None, units: Any = None,
                    num_batches: int | None = None, progress: ProgressCallback | None = None,
                    cancel: CancelToken | None = None, context: DistContext | None = None,
                    sequential: bool = False):
        """Rank layers by how much quantizing them costs; the result is stored in the project.

        Args:
            scheme, units, num_batches, progress, cancel: as :func:`workbench.analysis.sensitivity` takes them.
            metric: a metric or its name; None: the project's metric.
            context: with a distributed ``context`` the units are shared among the ranks (see :meth:`calibrate`).
            sequential: one block at a time, each block's weights read when it runs: every unit's SQNR at its
                block's output, alone quantized ("one-on"; :mod:`workbench.analysis.block_sensitivity`); takes
                no metric and no ``context``.
        Returns:
            The :class:`~workbench.analysis.SensitivityResult`, appended to the project's sensitivity runs.
        """
        if sequential:
            return self._block_sensitivity(metric, units, num_batches, progress, cancel, context)
        self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        context = self._join(context)
        decisions.require_quantized(self.project, "rank")
        model = self._require_calibrated()
        batches = self._analysis_batches()
        result, record = analysis.sensitivity(model, batches, metric if metric is not None else self.metric(),
                                              self.project, scheme=scheme, units=units, num_batches=num_batches,
                                              output=self.settings.output, progress=progress, cancel=cancel,
                                              context=context)
        self.project.sensitivity.append(record)
        self._changed(SessionEvent.SENSITIVITY)
        return result

    def _block_sensitivity(self, metric: Any, units: Any, num_batches: int | None,
                           progress: ProgressCallback | None, cancel: CancelToken | None,
                           context: DistContext | None):
        if metric is not None:
            raise SessionError("Sensitivity one block at a time measures each layer's SQNR at its block's output; "
                               "it takes no metric: rank without --sequential to use one.")
        if context is not None and context.distributed:
            raise SessionError("Sensitivity one block at a time runs in one process (it walks the blocks in order): "
                               "rank without --workers, or without --sequential.")
        decisions.require_quantized(self.project, "rank")
        model = self._require_calibrated()
        try:
            result, record = analysis.block_sensitivity(
                model, self._analysis_batches(), self.project, units=units, num_batches=num_batches,
                residency=self._block_residency(), device=self.device, progress=progress, cancel=cancel)
        except ValueError as error:  # a model without repeated blocks
            raise SessionError(str(error)) from None
        self.project.sensitivity.append(record)
        self._changed(SessionEvent.SENSITIVITY)
        return result

    def _walk_options(self, progress: ProgressCallback | None, cancel: CancelToken | None) -> Any:
        return analysis.walk_options(residency=self._block_residency(), device=self.device,
                                     output=self.settings.output, progress=progress, cancel=cancel)

    def _rung_building(self, sequential: bool) -> dict[str, Any]:
        """How the ladder's rung models are built and calibrated: as the quantized model is (a lazily opened model
        on shapes), and one block at a time when ``sequential``."""
        if not sequential:
            return {}
        base, folding = self._fold_base()

        def build(variant: Project) -> Any:
            return self._sample_run(lambda inputs: build_quantized(base, variant, self.device, folding=folding,
                                                                   example_inputs=inputs, settings=self.settings),
                                    self._example_inputs(), "building a rung's model")

        return {"build": build,
                "residency_of": lambda built: WithDerivedWeights(self._loaded.residency, built.report.derived_weights)}

    def fallback(self, *, tolerance: float | None = None, target: float | None = None, max_units: int | None = None,
                 metric: Any = None, apply: bool = False, use_ranking: bool = True,
                 progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                 context: DistContext | None = None, on_partial: Callable[[Any], None] | None = None,
                 sequential: bool = False):
        """Search which layers to leave in float to get within ``tolerance`` of FP32 (or reach ``target``).

        Args:
            tolerance, target, max_units: the goal, as :func:`workbench.analysis.fallback_search` takes it; a
                tolerance where FP32 is infinite (SQNR) counts from the all-INT8 value
                (:func:`workbench.analysis.goals.resolve_goal`, the rule the CLI follows too).
            metric: a metric or its name; None: the project's metric.
            apply: leave the chosen layers in float in the project.
            use_ranking: follow the latest sensitivity ranking (else one is computed first).
            progress, cancel, context: as for :meth:`sensitivity`.
            on_partial: called (in the job's thread) with the search so far after each measurement, for a chart.
            sequential: one block at a time, each block's weights read when it runs: the model output's SQNR as
                the metric, each layer's cost at its block's output, one global choice checked end to end
                (:mod:`workbench.analysis.block_fallback`); takes no metric and no ``context``.
        Returns:
            The :class:`~workbench.analysis.FallbackResult`, appended to the project's fallback searches.
        """
        if sequential:
            analysis.refuse_for_blocks("The fallback search", metric, context)
        else:
            self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        context = self._join(context)
        model = self._require_calibrated()
        ranking = self.latest_sensitivity() if use_ranking else None
        batches = self._analysis_batches()
        if sequential:
            result, record = analysis.blocks_refused(lambda: analysis.block_fallback(
                model, batches, self.project, tolerance=tolerance, target=target, max_units=max_units,
                ranking=ranking, walk=self._walk_options(progress, cancel)))
        else:
            result, record = analysis.fallback(model, batches, metric if metric is not None else self.metric(),
                                               self.project, tolerance=tolerance, target=target,
                                               max_units=max_units, ranking=ranking, output=self.settings.output,
                                               progress=progress, cancel=cancel, context=context,
                                               on_partial=on_partial)
        self.project.fallbacks.append(record)
        if apply:
            self.apply_fallback(result)
            record.applied = True
        self._changed(SessionEvent.FALLBACK, applied=apply)
        return result

    def ladder(self, ladder: Any, *, target: float | None = None, tolerance: float | None = None,
               budget_bytes: int | None = None, metric: Any = None, apply: bool = False, use_ranking: bool = True,
               revisit_pins: bool = False, progress: ProgressCallback | None = None,
               cancel: CancelToken | None = None, on_partial: Callable[[Any], None] | None = None,
               sequential: bool = False):
        """Search a precision per layer from ``ladder`` (``"int8,fp8,float"``, cheapest first) for a goal:
        ``target``/``tolerance`` (the cheapest mix that reaches it) or ``budget_bytes`` (the best metric whose
        weights fit). The result (a :class:`~workbench.analysis.ladder.LadderResult`) is appended to the
        project's fallback searches; ``apply`` sets the layers to the mix (:meth:`apply_ladder`) and calibrates.

        Layers set by hand (:func:`~workbench.session.ladder.hand_set_layers`) are pins the search keeps as they
        are, unless ``revisit_pins``. Each rung the layers do not run in yet gets a model calibrated in it (one
        calibration pass per rung, counted by ``progress``); the fusion clean-up reads the layers' data flow on one
        sample. ``on_partial`` is called with the search so far after each measurement (for a chart).

        ``sequential``: one block at a time, each block's weights read when it runs (the rungs' models calibrated
        so too): the model output's SQNR as the metric, each layer's cost on each rung at its block's output, one
        global choice checked end to end (:mod:`workbench.analysis.block_ladder`); takes no metric.
        """
        if sequential:
            analysis.refuse_for_blocks("The ladder search", metric, None)
        else:
            self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        rungs = ladder_job.parse_rungs(ladder)
        model = self._require_calibrated()
        own = self.precisions()
        pins = set() if revisit_pins else ladder_job.hand_set_layers(self.project, own)
        searched = {name: precision for name, precision in own.items() if name not in pins}
        plans = ladder_job.rung_plans(self.project, model, self.settings.defaults, searched, rungs)
        count = self.settings.calibration.num_batches
        base, folding = self._fold_base()
        models = ladder_job.rung_models(self.project, base, folding, self.device, self.settings, plans,
                                        self.data("calibration").batches(count), example_inputs=self._example_inputs(),
                                        progress=progress, cancel=cancel, **self._rung_building(sequential))
        flow = None if sequential else ladder_job.data_flow(model, self.project.layers, self._example_inputs(),
                                                            self.device)
        def search() -> Any:
            return ladder_job.search(
                model, self._analysis_batches(), metric if metric is not None else self.metric(), self.project,
                rungs=rungs, own=own, plans=plans, models=models,
                ranking=self.latest_sensitivity() if use_ranking else None, target=target, tolerance=tolerance,
                budget_bytes=budget_bytes, output=self.settings.output, progress=progress, cancel=cancel, pins=pins,
                flow=flow, on_partial=on_partial, walk=self._walk_options(progress, cancel) if sequential else None,
                revisit_pins=revisit_pins)

        # a model without repeated blocks is refused by name; the whole-model search's errors stay as they were
        result, record = analysis.blocks_refused(search) if sequential else search()
        self.project.fallbacks.append(record)
        if apply:
            self.apply_ladder(result)
            if any(p not in ("float", "custom") for p in result.precisions.values()):
                # the new precisions' ranges (an all-float mix has none to calibrate), block by block when searched so
                self.calibrate(sequential=sequential or None)
            result.applied = True
        self._changed(SessionEvent.FALLBACK, applied=apply)
        return result

    def evaluate(self, metric: Any = None, num_batches: int | None = None, *, rounding: str | None = None,
                 progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                 known: Callable[[list], dict[int, Any]] | None = None):
        """The metric's FP32 and INT8 values (and the output SQNR) on the evaluation data.

        ``metric``: a Metric, a built-in name or an entry point (user code needs trust; a relative file
        is found next to the project); default the project's. FP32 is the float model as loaded, INT8 the
        calibrated quantized model. ``rounding="onnx"`` makes its quantizers round as ONNX's QuantizeLinear (what
        the exported graph computes, and how an export's headline is measured); default, their own
        (pytorch-quantization's formula). ``known``: outputs of the quantized model computed already (an export's
        :class:`~workbench.session.exports.ParityOutputs`). Returns a :class:`workbench.analysis.Evaluation`; the
        project is not changed.
        """
        self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        model = self._require_calibrated()
        chosen = self.metric() if metric is None else self._resolve_metric(metric)
        evaluation = analysis.evaluate(self.float_model, model, self._analysis_batches(), chosen,
                                       num_batches=num_batches, output=self.settings.output, progress=progress,
                                       cancel=cancel, rounding=rounding, known=known)
        evaluation.quantized_as = mix_label(self.precisions().values())  # "FP8 vs FP32", not always "INT8"
        return evaluation

    def export(self, path: str | Path | None = None, *, opset: int | None = None, dynamic_batch: bool | None = None,
               amax_json: bool | None = None, calibration_cache: bool | None = None, remember: bool = True,
               force: bool = False, fp8_ops: str | None = None, outputs: Sequence[str] | None = None,
               static_sequence: bool | None = None, min_cosine: float | None = None, strict: bool = False):
        """Write QDQ ONNX (validated) next to the project or at ``path``; the report is stored in the project.
        ``fp8_ops`` ("standard" or "trt", default: the project's export setting) is how FP8 is written; ``outputs``
        the model's outputs the graph returns, by name (default: the project's setting, else every one);
        ``static_sequence`` keeps the sample's sequence length fixed (default: the project's setting).
        ``min_cosine`` (default: the project's ``export.min_cosine``) is the parity threshold, checked on the
        sample and on ``export.parity_batches`` calibration batches; a file below it is written "not validated"
        with the diagnosis (``report.validated``), or refused with ``strict``.

        ``path`` is taken from the working directory; the stored path is relative to the project's folder.
        An existing file is replaced only when this project wrote it and it is unchanged, or with ``force``
        (see :mod:`workbench.session.exports`). ``remember=False`` (a preview, e.g. for the graph view)
        leaves the project as it was: the export settings, the export history and the unsaved-changes
        flag are not touched.
        """
        # lazily opened: the weights are streamed from the checkpoint as the file is written (streamed_export)
        target = Path(path).expanduser().resolve() if path is not None else self.default_export_path()
        plan = exports.plan_export(self.project, self.settings.export, target, typed=path is not None,
                                   project_path=self.path, base_dir=self.base_dir, project_dir=self.project_dir,
                                   remember=remember, force=force, opset=opset, dynamic_batch=dynamic_batch,
                                   amax_json=amax_json, calibration_cache=calibration_cache, fp8_ops=fp8_ops,
                                   outputs=tuple(outputs) if outputs else None, static_sequence=static_sequence,
                                   min_cosine=min_cosine, strict=strict)
        model = self._require_calibrated()
        batches = data_sources.parity_batches(self.data("calibration"), self.device, plan.parity_batches)
        # the parity check's forwards of the quantized model are the headline's where the batches are the same
        kept = exports.ParityOutputs(batches, self.settings.output, list(self.data("evaluation").batches(
            limit=exports.HEADLINE_BATCHES))) if remember and batches else None
        new = exports.planned_new_files(plan)
        try:  # interrupted (its validation, its headline), an export leaves no file the project does not know
            report = exports.write_export(plan, model, self.sample_inputs(batch=1), parity_batches=batches,
                                          loaded=self._loaded, parity_outputs=kept)
            if remember:
                measure = functools.partial(self.evaluate, num_batches=exports.HEADLINE_BATCHES,
                                            rounding=exports.HEADLINE_ROUNDING,
                                            known=kept.known if kept is not None else None)
                if self._loaded.checkpoint is not None:  # the headline's forwards page the weights in as well
                    measure = functools.partial(self._loaded.checkpoint.run_streamed, self.float_model, measure)
                record = exports.remember(plan, self.project, report, measure, project_path=self.path,
                                          project_dir=self.project_dir)
                self.project.exports.append(record)
                self._changed(SessionEvent.EXPORT, path=str(target))
        except BaseException:
            exports.discard(new)
            raise
        self.unsaved_export_files = new if remember else []  # the caller's save records them, or discards them
        return report

    # ----- TensorRT: lint before building, the engine's report after -------------------------

    def lint(self):
        """Fusion hazards TensorRT's Q/DQ rules predict for the project as it exports now (the last lint's, while
        the project is unchanged since; kept in the project)."""
        warnings, stored = tensorrt.lint(self.project, export_path=self.export_path,
                                         preview=lambda path: self.export(path, remember=False))
        if stored:
            self._changed(SessionEvent.LINT)  # a result the project keeps, like a sensitivity run
        return warnings

    def import_engine_report(self, layer_info: str | Path, profile: str | Path | None = None, *,
                             remember: bool = True, onnx_file: str | Path | None = None, force: bool = False):
        """trtexec's layer information (and profile) mapped onto the layers; kept in the project.
        ``onnx_file``: the ONNX the engine was built from (to read its node names); ``force``: report an
        engine that does not look like this model's."""
        report, record = tensorrt.import_engine(self.project, layer_info, profile, float_model=self.float_model,
                                                precisions=self.precisions(), onnx_file=onnx_file, force=force)
        if remember:
            self.project.engine_reports.append(record)
            self.dirty = True
        return report

    def finetune(self, *, epochs: int | None = None, lr: float | None = None, optimizer: str | None = None,
                 schedule: str | None = None, loss: str | None = None, learn_amax: Sequence[str] | str | None = None,
                 momentum: float | None = None, weight_decay: float | None = None,
                 steps_per_epoch: int | None = None, amp: bool | None = None, metric: Any = None,
                 progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                 on_step: Any = None, on_epoch: Any = None):
        """Quantization-aware fine-tuning of the calibrated model (see :func:`workbench.training.finetune`).

        Options not given come from the project's ``finetune`` setting, and the ones given are stored
        there. Trains on the training data (default: all of the calibration data, shuffled) and keeps
        the best epoch on the evaluation data by the project's metric (or ``metric``). amax stays as
        calibrated unless ``learn_amax`` names quantizers (regexes). Cancel is checked between steps and
        leaves the best model so far. The float model keeps its weights: the quantized model trains
        copies. The result (history and the resulting weights) is stored in the project, and export uses
        the fine-tuned weights; a run cancelled before its first epoch changes nothing and is not stored.
        """
        self._loaded.materialise()  # lazily opened: every weight in memory first, as an eager load gives
        given = {"epochs": epochs, "lr": lr, "optimizer": optimizer, "schedule": schedule, "loss": loss,
                 "momentum": momentum, "weight_decay": weight_decay, "steps_per_epoch": steps_per_epoch, "amp": amp,
                 "learn_amax": learn_amax}
        options, loss_spec = finetuning.finetune_options(self.settings.finetune, given, trust_code=self.trust_code,
                                                         base_dir=self.base_dir)
        model = self._require_calibrated()
        training, batches = self.data("training"), self._analysis_batches()
        result = finetuning.finetune(model, training, batches, metric if metric is not None else self.metric(),
                                     options, loss_spec, device=self.device, trust_code=self.trust_code,
                                     progress=progress, cancel=cancel, on_step=on_step, on_epoch=on_epoch)
        self.project.settings["finetune"] = options.to_stored()
        self._changed(SessionEvent.SETTINGS, keys=["finetune"])
        if result.epochs_completed == 0 and not result.changed:
            return result  # cancelled before an epoch finished: the model is as it was
        record = finetuning.finetune_record(model, self.project, result, self.folded_layers())
        finetuning.activate(self.project, record)
        self.build_report.finetune = f"fine-tuned weights of run {record.id} in use"
        self._changed(SessionEvent.FINETUNE, run=record.id)
        return result

    def reset_finetune(self) -> bool:
        """Back to the calibrated model's own weights (the fine-tune history stays); False if none was in use."""
        if not finetuning.reset_finetune(self.project):
            return False
        self._invalidate()
        self._changed(SessionEvent.FINETUNE, run=None)
        return True
