"""The GUI's one handle on the session: Qt signals around :class:`workbench.session.Session`.

Widgets never call the session directly: they call the controller, which runs long operations in the
:class:`JobRunner` and turns every exception into an ``error`` signal (a dialog, never a crash). What
changed is the session's to say: its events (:mod:`workbench.session.events`, no Qt) become the
controller's signals here, in one place, and each view refreshes from those. Everything here has a
headless twin in the session, which the CLI uses.

The jobs (:mod:`workbench.app.controller_jobs`) and the edits (:mod:`workbench.app.controller_edits`)
are mixins of the one Controller class; the signals, the session and the events-to-signals live here.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from PySide6.QtCore import QObject, Signal

from workbench.analysis import AnalysisCancelled
from workbench.app import main_thread_gc
from workbench.app.controller_edits import EditsMixin
from workbench.app.controller_jobs import JobsMixin
from workbench.app.disk_watch import ProjectFileWatcher
from workbench.app.jobs import JobRunner
from workbench.app.lint_state import LintState
from workbench.graph import ModelTree
from workbench.quant.algorithms.calibrate import CalibrationCancelled
from workbench.session import Event, Session, SessionEvent
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec

logger = logging.getLogger(__name__)

__all__ = ["Controller", "QtLogHandler"]

# what a view shows changes with these: the described tree and layer rows are read again
_VIEW_EVENTS = frozenset({SessionEvent.LAYERS, SessionEvent.CALIBRATION, SessionEvent.SENSITIVITY,
                          SessionEvent.FINETUNE})


class QtLogHandler(logging.Handler):
    """Forwards log records (from any thread) to the controller's ``log`` signal."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(level=logging.INFO)
        self._controller = controller
        self.setFormatter(logging.Formatter("%(message)s"))
        self.said: set[tuple[int, str]] = set()  # warnings already in the log since the project opened

    def emit(self, record: logging.LogRecord) -> None:
        message = self.format(record)
        if record.levelno >= logging.WARNING:
            # each warning once per open project: a rebuild after every edit would repeat the same lines
            key = (record.levelno, message)
            if key in self.said:
                return
            self.said.add(key)
        try:
            self._controller.log.emit(record.levelname.lower(), message)
        except RuntimeError:  # the controller is being destroyed
            pass


class Controller(QObject, JobsMixin, EditsMixin):
    """Owns the open session and the job runner; views listen to its signals.

    Signals:
        session_changed: a project was created or opened.
        layers_changed: layer decisions or descriptors changed (the tree refreshes).
        settings_changed(keys): project settings changed.
        calibration_changed: amax values changed (calibration, another method, fine-tuning, reopening).
        sensitivity_changed: a sensitivity run finished.
        project_saved(path): the project file was written.
        fallback_changed(result): a fallback search finished.
        ladder_changed(result): a mixed-precision ladder search finished (a LadderResult).
        search_partial(result): a fallback or ladder search running measured another point (an incomplete
            FallbackResult or LadderResult: the curve so far; from the worker, queued).
        export_finished(report): a QDQ ONNX file was written and validated.
        selection_changed(names): layers selected in any view.
        dirty_changed(bool): unsaved changes appeared or were saved.
        trust_needed(kind, target, message): opening needs permission to run user code.
        error(title, message, details): something failed; the main window shows a dialog.
        log(level, message): a line for the log panel.
        busy_changed(bool): a job started or ended (editing is disabled meanwhile).
        finetune_progress(epoch, step, loss): a fine-tuning step finished (from the worker, queued).
        finetune_epoch(record): a fine-tuning epoch was measured (an EpochRecord; epoch 0 is the start).
        finetune_finished(result): a fine-tune ended (a FinetuneResult; ``result.cancelled`` when cancelled).
    """

    session_changed = Signal()
    layers_changed = Signal()
    settings_changed = Signal(list)
    project_saved = Signal(str)
    calibration_changed = Signal()
    sensitivity_changed = Signal()
    fallback_changed = Signal(object)
    ladder_changed = Signal(object)
    search_partial = Signal(object)
    export_finished = Signal(object)
    selection_changed = Signal(list)
    dirty_changed = Signal(bool)
    trust_needed = Signal(str, str, str)
    error = Signal(str, str, str)
    log = Signal(str, str)
    busy_changed = Signal(bool)
    finetune_progress = Signal(int, int, float)
    finetune_epoch = Signal(object)
    finetune_finished = Signal(object)
    engine_changed = Signal()  # a TensorRT engine report was imported

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session: Session | None = None
        self.jobs = JobRunner(self, cancelled_types=(CalibrationCancelled, AnalysisCancelled))
        self.jobs.busy_changed.connect(self.busy_changed)
        self._queued_edits: list[tuple] = []  # (what, edit, session): edits asked for while a job runs
        self.jobs.busy_changed.connect(self._run_queued_edits)  # before a queued job: edits come first
        self._queued: tuple | None = None  # a job asked for while the model was being rebuilt
        self.jobs.busy_changed.connect(self._start_queued)
        self.jobs.failed.connect(self._job_failed)
        self.jobs.cancelled.connect(lambda name, error: self.log.emit("warning", f"{name} cancelled: {error}"))
        self.jobs.cancelled.connect(lambda _name, _error: self._tell())
        self._selection: list[str] = []
        self.workers = 1  # > 1: calibration and analysis run in that many processes (the device selector's "all GPUs")
        self.reloaded = False  # the open session is the same project read back after worker processes wrote it
        # asks the user (the window sets it) whether unsaved changes may be saved for worker processes; None: yes
        self.confirm_save: Callable[[str], bool] | None = None
        self._prepared_views: tuple | None = None  # (session, tree, layers) computed by the opening job
        self._tree_cache: tuple | None = None  # (session, tree): describing a big model takes a while
        self._pending: list[Event] = []  # the session's events not yet told as signals
        self._holding = 0  # > 0: an edit is under way, its events are told when it is done
        self._disconnect_events: Callable[[], None] | None = None
        self.disk = ProjectFileWatcher(self)  # another process saving the open project: the window offers a reload
        self._log_handler = QtLogHandler(self)
        logging.getLogger("workbench").addHandler(self._log_handler)
        # jobs run Python in a worker thread: garbage holding widgets must not be collected there
        self._gc_acquired = main_thread_gc.acquire()
        self.lint_state = LintState(self)  # the last fusion lint, for the tree's icons and the TensorRT tab

    def shutdown(self) -> None:
        """Cancel a running job and wait for it (before the window closes)."""
        self.disk.watch(None)  # a closing window asks nothing about its file any more
        if self.jobs.busy:
            self.jobs.cancel()
            self.jobs.wait()
        logging.getLogger("workbench").removeHandler(self._log_handler)
        if self._gc_acquired:  # no worker thread runs any more
            self._gc_acquired = False
            main_thread_gc.release()

    # ----- state --------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.jobs.busy

    @property
    def dirty(self) -> bool:
        return self.session is not None and self.session.dirty

    @property
    def selection(self) -> list[str]:
        return list(self._selection)

    def use_workers(self, count: int) -> None:
        """Run calibration, sensitivity and the fallback search in ``count`` local processes (1: in this one)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"the number of worker processes must be a positive integer, got {count!r}.")
        if count != self.workers:
            self.workers = count
            self.log.emit("info", f"calibration and analysis run in {count} processes" if count > 1 else
                          "calibration and analysis run in this process")

    def select(self, names: Iterable[str]) -> None:
        """Select layers (the tree, the layer panel and the sensitivity view follow)."""
        names = list(names)
        if names != self._selection:
            self._selection = names
            self.selection_changed.emit(names)

    # ----- projects -----------------------------------------------------------------------------

    def new_project(self, model: ModelSpec, calibration: DataSpec, evaluation: DataSpec | None = None, *,
                    trust_code: bool = False, input_shape: tuple[int, ...] | None = None, name: str | None = None,
                    base_dir: Path | None = None, settings: dict[str, Any] | None = None,
                    on_done: Callable[[Session], None] | None = None) -> bool:
        """Create a project in the background (loading a model can take a while)."""
        self._log_handler.said.clear()  # another project: its warnings are news again

        def job(progress, cancel):
            progress(0, 1, "loading the model")
            session = Session.create(model, calibration, evaluation, trust_code=trust_code, input_shape=input_shape,
                                     name=name, base_dir=base_dir, settings=settings)
            return self._prepare_views(session, progress)

        return self._start("Creating project", job, lambda session: self._adopt(session, on_done),
                           trust=("model", model.label))

    def open_project(self, path: str | Path, *, trust_code: bool = False,
                     on_done: Callable[[Session], None] | None = None) -> bool:
        """Open a project file in the background; ``trust_needed`` asks before running its code."""
        path = Path(path)

        self._log_handler.said.clear()  # another project: its warnings are news again

        def job(progress, cancel):
            progress(0, 1, f"opening {path.name}")
            return self._prepare_views(Session.open(path, trust_code=trust_code), progress)

        return self._start("Opening project", job, lambda session: self._adopt(session, on_done),
                           trust=("project", str(path)))

    def _prepare_views(self, session: Session, progress: Callable[[int, int, str], None]) -> Session:
        """In the worker: build what the views show first, so that opening a big model never freezes the window.

        Building the quantized model of a model with thousands of modules takes seconds (fx tracing);
        its tree, layer rows and shapes are computed here, before the session reaches the GUI thread,
        and handed over once by :meth:`views`.
        """
        progress(0, 1, "building the quantized model")
        # torch's first broadcast_shapes imports sympy (~0.7 s, holding the GIL): here, not in the
        # middle of the first calibration where it would freeze the progress display
        torch.broadcast_shapes((1,), (1,))
        tree, layers = session.tree(), session.layers()
        try:
            session.layer_shapes()
        except Exception as error:  # noqa: BLE001 - shapes are a nicety; the layer panel shows none
            logger.warning("Layer shapes not available: %s", error)
        self._prepared_views = (session, tree, layers)
        self._tree_cache = (session, tree)
        return session

    def _forget_views(self) -> None:
        """An edit or a job changes the session: what was read from it is stale."""
        self._prepared_views = None
        self._tree_cache = None

    def tree(self) -> ModelTree:
        """The module tree of the open session, re-read only after an edit or a job.

        Every view asks here rather than ``session.tree()``, so that a big model is described once per change.
        """
        session = self.session
        if session is None:
            raise RuntimeError("no project is open")
        cached = self._tree_cache
        if cached is not None and cached[0] is session:
            return cached[1]
        tree = session.tree()
        if not self.busy:  # a running job may still change it
            self._tree_cache = (session, tree)
        return tree

    def views(self) -> tuple[Any, list[Any]]:
        """The module tree and the layer rows of the open session, for the tree view.

        The first call after opening returns what the background job computed; later calls ask the
        session (after an edit the session rebuilds its quantized model).
        """
        if self.session is None:
            raise RuntimeError("no project is open")
        prepared, self._prepared_views = self._prepared_views, None
        if prepared is not None and prepared[0] is self.session:
            return prepared[1], prepared[2]
        return self.tree(), self.session.layers()

    def _adopt(self, session: Session, on_done: Callable[[Session], None] | None, *, reload: bool = False) -> None:
        """Make ``session`` the open one; ``reload``: the same project read back after worker processes wrote it
        (the choice of workers stays)."""
        if not reload:
            self.workers = 1
        self.reloaded = reload
        if self._disconnect_events is not None:
            self._disconnect_events()
        self.session = session
        self._pending = []
        self._disconnect_events = session.events.connect(self._on_session_event)
        session.who = "this window"  # in "p.qwb changed since this window opened it (by another process)"
        self.disk.watch(session)
        self._selection = []
        self.session_changed.emit()
        self.layers_changed.emit()
        self.calibration_changed.emit()
        self.sensitivity_changed.emit()
        self.dirty_changed.emit(session.dirty)
        for message in session.file_changes:
            self.log.emit("warning", message)
        if on_done is not None:
            on_done(session)

    def save(self, path: str | Path | None = None) -> Path | None:
        """Save the project (to ``path``, or where it lives); None and an error signal on failure."""
        if self.session is None:
            return None
        try:
            saved = self.session.save(path)
        except Exception as error:  # noqa: BLE001 - shown to the user, the project stays as it was
            self.error.emit("Could not save the project", str(error), "")
            return None
        self.log.emit("info", f"saved {saved}")
        if self.session.merged_on_save:  # another process's changes came in with the save
            self.log.emit("info", "kept what another process saved meanwhile: "
                          + ", ".join(self.session.merged_on_save))
            self._forget_views()
            self.layers_changed.emit()
            self.calibration_changed.emit()
        self.disk.watch(self.session)
        return saved

    # ----- the session's events, as signals -----------------------------------------------------

    def _on_session_event(self, event: Event) -> None:
        """Called by the session (in a job's worker thread during a job): keep it, tell it when safe.

        Views read the session when told: never while a job owns it, nor halfway through an edit whose
        quantized model is still to be rebuilt. So events wait for the end of the job or edit.
        """
        if event.kind in _VIEW_EVENTS:
            self._forget_views()
        self._pending.append(event)
        if not self._holding and not self.busy and threading.current_thread() is threading.main_thread():
            self._tell()

    def _tell(self) -> None:
        """The pending events as signals, each signal once."""
        events, self._pending = self._pending, []
        if not events or self.session is None:
            return
        kinds = {event.kind for event in events}
        if SessionEvent.SETTINGS in kinds:
            keys = [key for event in events for key in event.data.get("keys", ())]
            self.settings_changed.emit(list(dict.fromkeys(keys)))
        # fine-tuning brings new weights and learned amax: what the layer rows and the amax show
        if kinds & {SessionEvent.LAYERS, SessionEvent.FINETUNE}:
            self.layers_changed.emit()
        if kinds & {SessionEvent.CALIBRATION, SessionEvent.FINETUNE}:
            self.calibration_changed.emit()
        if SessionEvent.SENSITIVITY in kinds:
            self.sensitivity_changed.emit()
        saved = [event.data["path"] for event in events if event.kind is SessionEvent.SAVED]
        if saved:
            self.project_saved.emit(saved[-1])
        self.dirty_changed.emit(self.session.dirty)

    # ----- reading what the views show (on the GUI thread, between jobs) ----------------------------

    def _open_session(self) -> Session:
        if self.session is None:
            raise RuntimeError("no project is open")
        return self.session

    def descriptors(self, names: Iterable[str], role: str) -> dict[str, dict[str, Any] | None]:
        """The descriptor fields each layer's ``role`` quantizer uses (see :meth:`Session.descriptors`)."""
        return self._open_session().descriptors(list(names), role)

    def layer_shapes(self) -> dict[str, dict[str, Any]]:
        return self._open_session().layer_shapes()

    def histogram(self, quantizer_name: str) -> dict[str, Any] | None:
        return self._open_session().histogram(quantizer_name)

    def weight_ranges(self, layer: str) -> Any:
        return self._open_session().weight_ranges(layer)

    def default_export_path(self) -> Path:
        return self._open_session().default_export_path()

    def finetune_history(self) -> list[Any]:
        return self._open_session().finetune_history()

    def latest_sensitivity(self) -> Any:
        return self._open_session().latest_sensitivity()

    def latest_fallback(self) -> Any:
        return self._open_session().latest_fallback()

    def latest_ladder(self) -> Any:
        return self._open_session().latest_ladder()

    def evaluation_has_labels(self) -> bool:
        """Whether the evaluation data has labels (top-1 accuracy needs them); opening the data may raise."""
        return bool(self._open_session().data("evaluation").has_labels)

    def layers_of(self, unit: Any) -> list[str]:
        return self._open_session().layers_of(unit)

    def ignore_preview(self, patterns: Iterable[str]) -> list[str]:
        return self._open_session().ignore_preview(list(patterns))

    def engine_report(self) -> Any:
        """The project's latest imported engine report (None: none, or no project)."""
        return self.session.latest_engine_report() if self.session is not None else None
