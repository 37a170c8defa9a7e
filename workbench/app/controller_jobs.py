"""The controller's jobs: calibration, analysis, export, fine-tuning and evaluation in the worker thread.

A mixin of :class:`workbench.app.controller.Controller` (its signals and state live there). Every job
is ``fn(progress, cancel)`` run by the :class:`~workbench.app.jobs.JobRunner`, one at a time; what it
changed is told as signals once it ends, and a failure becomes the ``error`` signal (a dialog).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer, SignalInstance

from workbench.app.controller_edits import UPDATE_JOB
from workbench.app.lint_state import LINT_JOB
from workbench.export.lint import count_text
from workbench.project.diff import compare_with_file
from workbench.session import Session
from workbench.session.workers import WORKER_JOBS, WorkersResult, run_in_workers
from workbench.sources.errors import TrustRequired

__all__ = ["JobsMixin", "SENSITIVITY_JOB", "FALLBACK_JOB", "LADDER_JOB", "CALIBRATION_JOB"]

# the jobs' names (the status bar and the tabs that show a job's progress read them from here)
SENSITIVITY_JOB = "Sensitivity analysis"
FALLBACK_JOB = "Fallback search"
LADDER_JOB = "Ladder search"
CALIBRATION_JOB = "Calibrating"


class JobsMixin:
    """Long operations on the open session (``Controller`` mixes this in).

    ``workers`` (set by the controller, chosen in the device selector): more than 1 runs calibration,
    sensitivity and the fallback search in that many local processes (all GPUs); the other jobs run
    in this process, on the session's device.
    """

    def calibrate(self, **options: Any) -> bool:
        session = self._require_session()
        smoothing = {"smoothquant", "awq"} & options.keys()  # computed in one process (the same scales everywhere)
        if session is not None and self.workers > 1 and not smoothing:
            return self._workers_job(CALIBRATION_JOB, "calibrate", options)
        if smoothing and session is not None and self.workers > 1:
            self.log.emit("info", f"Calibrating with {' and '.join(sorted(smoothing))} in one process on "
                                  f"{session.device}: every process must use the same scales")
        return session is not None and self._session_job(
            CALIBRATION_JOB, lambda progress, cancel: session.calibrate(progress=progress, cancel=cancel, **options))

    def calibrate_applied(self) -> bool:
        """Calibrate after a ladder's Apply: only the layers it changed where that gives a whole calibration's amax
        (:meth:`workbench.session.core.Session.calibrate_applied`), the whole model otherwise (and with workers)."""
        session = self._require_session()
        if session is not None and self.workers > 1:
            return self.calibrate()
        return session is not None and self._session_job(
            CALIBRATION_JOB, lambda progress, cancel: session.calibrate_applied(progress=progress, cancel=cancel))

    def sensitivity(self, **options: Any) -> bool:
        session = self._require_session()
        if session is not None and self.workers > 1:
            return self._workers_job(SENSITIVITY_JOB, "sensitivity", options)
        return session is not None and self._session_job(
            SENSITIVITY_JOB,
            lambda progress, cancel: session.sensitivity(progress=progress, cancel=cancel, **options))

    def fallback(self, **options: Any) -> bool:
        session = self._require_session()
        if session is not None and self.workers > 1:
            return self._workers_job(FALLBACK_JOB, "fallback", options, with_result=self.fallback_changed)
        # each measurement's point goes to the chart as it arrives (search_partial, queued to the GUI thread)
        return session is not None and self._session_job(
            FALLBACK_JOB, lambda progress, cancel: session.fallback(progress=progress, cancel=cancel,
                                                                    on_partial=self.search_partial.emit, **options),
            with_result=self.fallback_changed)

    def ladder(self, **options: Any) -> bool:
        """The mixed-precision ladder search (one process: it calibrates a model per rung first)."""
        session = self._require_session()
        if session is not None:
            self._one_process(LADDER_JOB)
        return session is not None and self._session_job(
            LADDER_JOB, lambda progress, cancel: session.ladder(progress=progress, cancel=cancel,
                                                                on_partial=self.search_partial.emit, **options),
            with_result=self.ladder_changed)

    def _workers_job(self, name: str, job: str, options: dict[str, Any],
                     with_result: SignalInstance | None = None) -> bool:
        """Run the session's ``job`` in ``self.workers`` processes on the project file (saved first), then
        show the project as rank 0 wrote it; a failed or cancelled job leaves the file as it was."""
        session, nprocs = self.session, self.workers
        if session.path is None:
            self.error.emit(name, f"Save the project first (File ▸ Save As…): the {nprocs} worker processes read "
                                  "it from its file.", "")
            return False
        unsaved = session.dirty
        if unsaved and self.confirm_save is not None and not self.confirm_save(
                f"The {nprocs} worker processes read the project from its file, so its unsaved changes will be "
                f"saved to {session.path.name} first. Save and run {name.lower()}?"):
            self.log.emit("info", f"{name} not started: the project's changes are not saved")
            return False
        selection = self.selection

        def run(progress, cancel):
            result = run_in_workers(session, job, nprocs, options, save=True, progress=progress, cancel=cancel)
            progress(0, 1, "reading the project back")
            self._prepare_views(result.session, progress)
            return result

        def done(result: WorkersResult) -> None:
            if unsaved:
                self.log.emit("info", f"saved {session.path} for the worker processes")
            self._adopt(result.session, None, reload=True)
            self.select(selection)
            for warning in result.warnings:
                self.log.emit("warning", warning)
            self.log.emit("info", f"{result.summary} ({result.world_size} processes)")
            if with_result is not None:
                with_result.emit(result.session.latest_fallback())

        return self._start(name, run, done)

    def _one_process(self, name: str) -> None:
        """Say that a job without workers runs in this process alone while all GPUs are chosen."""
        if self.workers > 1 and self.session is not None:
            self.log.emit("info", f"{name} runs in one process on {self.session.device}: 'all GPUs' applies to "
                                  f"{', '.join(WORKER_JOBS)} only.")

    def _session_job(self, name: str, run: Callable[[Any, Any], Any],
                     with_result: SignalInstance | None = None) -> bool:
        """Run ``run(progress, cancel)`` in the worker; when it ends, log the result's warnings and summary
        and emit ``with_result(result)`` (what changed the session's events tell)."""
        def done(result: Any) -> None:
            for warning in getattr(result, "warnings", ()):
                self.log.emit("warning", warning)
            self.log.emit("info", result.summary())
            if with_result is not None:
                with_result.emit(result)

        return self._start(name, run, done)

    def export(self, path: str | Path | None = None, **options: Any) -> bool:
        session = self._require_session()
        if session is None:
            return False

        def job(progress, cancel):
            progress(0, 1, "exporting and validating QDQ ONNX")
            return session.export(path, **options)

        def done(report):
            self.log.emit("info", report.summary())
            self.export_finished.emit(report)

        self._one_process("Exporting")
        return self._start("Exporting", job, done)

    def export_preview(self, path: str | Path, on_done: Callable[[Any], None], **options: Any) -> bool:
        """Export to ``path`` for viewing only: the project's export settings and history stay as they
        were, and ``export_finished`` is not emitted (``on_done(report)`` is called instead)."""
        session = self._require_session()
        if session is None:
            return False

        def job(progress, cancel):
            progress(0, 1, "exporting a QDQ ONNX preview")
            return session.export(path, remember=False, **options)

        def done(report):
            self.log.emit("info", f"preview: {report.summary()}")
            on_done(report)

        return self._start("Exporting a preview", job, done)

    def finetune(self, **options: Any) -> bool:
        """Fine-tune in the background (options as :meth:`Session.finetune`); Cancel keeps the best model so far."""
        session = self._require_session()
        if session is None:
            return False

        def job(progress, cancel):
            # emitted from the worker thread: Qt queues them to the GUI thread's slots
            return session.finetune(progress=progress, cancel=cancel,
                                    on_step=lambda s: self.finetune_progress.emit(s.epoch, s.step, s.loss),
                                    on_epoch=self.finetune_epoch.emit, **options)

        def done(result):
            self.log.emit("warning" if result.cancelled else "info", result.summary())
            self.finetune_finished.emit(result)

        self._one_process("Fine-tuning")
        return self._start("Fine-tuning", job, done)

    def evaluate(self, on_done: Callable[[Any], None], **options: Any) -> bool:
        """Compare FP32 and INT8 on the evaluation data (the session's ``evaluate``); ``on_done`` gets the
        :class:`workbench.analysis.Evaluation`."""
        session = self._require_session()
        if session is None:
            return False
        self._one_process("Evaluating")
        return self._start("Evaluating", lambda progress, cancel: session.evaluate(progress=progress, cancel=cancel,
                                                                                   **options), on_done)

    def lint(self, on_done: Callable[[list[Any]], None]) -> bool:
        """Predict TensorRT's fusion hazards in the background (the session's ``lint``: a preview export, the
        project unchanged); ``on_done`` gets the :class:`workbench.export.lint.LintWarning` list."""
        session = self._require_session()
        if session is None:
            return False

        def job(progress, cancel):
            progress(0, 1, "checking the exported graph against TensorRT's fusion rules")
            return session.lint()

        def done(warnings):
            latest = session.latest_lint()
            source = f" (from {latest[2]})" if latest is not None and latest[2] else ""
            self.log.emit("info", f"TensorRT lint: {count_text(warnings)}{source}")
            on_done(warnings)

        return self._start(LINT_JOB, job, done)

    def compare_with(self, path: str | Path, on_done: Callable[[Any], None]) -> bool:
        """Diff the project file ``path`` (A) against the open project (B, unsaved changes included) in the
        background; ``on_done`` gets a :class:`workbench.project.diff.Comparison`. A file that is no
        project this version reads fails the job: an error dialog naming the file."""
        session = self._require_session()
        if session is None:
            return False
        name = session.path.name if session.path is not None else "this project"

        def job(progress, cancel):
            progress(0, 1, f"reading {Path(path).name}")
            return compare_with_file(session.project, path, name_b=name)

        return self._start("Comparing projects", job, on_done)

    def cancel_job(self) -> None:
        self.jobs.cancel()

    def _require_session(self) -> Session | None:
        if self.session is None:
            self.error.emit("No project", "Create or open a project first.", "")
        return self.session

    def _start(self, name: str, fn, on_done, trust: tuple[str, str] | None = None) -> bool:
        if self.jobs.busy and self.jobs.job_name == UPDATE_JOB and self._queued is None:
            # the model is being rebuilt after an edit: run this job right after it, as the user meant
            self._queued = (name, fn, on_done, trust)
            return True
        if self.jobs.busy:
            self.error.emit(name, f"'{self.jobs.job_name}' is still running: wait for it or cancel it.", "")
            return False
        self._trust_context = trust
        self._forget_views()

        def done(result: Any) -> None:
            on_done(result)
            self._tell()  # what the job changed, now that the session is the GUI's again

        if not self.jobs.start(name, fn, done):
            self.error.emit(name, f"'{self.jobs.job_name}' is still running: wait for it or cancel it.", "")
            return False
        return True

    def _start_queued(self, busy: bool) -> None:
        if not busy and self._queued is not None:
            # the finished job's completion (its views refreshed from the session) runs right after this
            # signal: the queued job starts once it is done, not in the middle of it
            QTimer.singleShot(0, self._run_queued)

    def _run_queued(self) -> None:
        if self.jobs.busy or self._queued is None:
            return  # another job came first: this one waits for its end
        name, fn, on_done, trust = self._queued
        self._queued = None
        self._start(name, fn, on_done, trust)

    def _job_failed(self, name: str, error: BaseException, details: str) -> None:
        self._tell()  # a job can fail after changing something (a fallback applied, then export failed)
        if isinstance(error, TrustRequired) and getattr(self, "_trust_context", None) is not None:
            kind, target = self._trust_context
            self.trust_needed.emit(kind, target, str(error))
            return
        self.log.emit("error", f"{name} failed: {error}")
        self.error.emit(f"{name} failed", str(error) or type(error).__name__, details)
