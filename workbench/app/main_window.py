"""The main window: model tree (left), layer panel and analysis tabs (centre), log (bottom), jobs (status bar).

The window owns no project state: the :class:`Controller` does. The window turns user intent into
controller calls (asking about unsaved changes and trust first), shows the controller's errors as
dialogs, and enables or disables editing while a job runs.

Its actions, menus and toolbar come from one registry (:mod:`workbench.app.menus`), the device
selector is :mod:`workbench.app.device_selector`, and the job commands with the dialogs they open are
:mod:`workbench.app.window_jobs`; projects (new, open, save, reload), errors and trust stay here.
"""
from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSettings, Qt, QTimer
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QTabWidget,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.device_selector import DeviceSelector
from workbench.app.dialogs import ErrorDialog
from workbench.app.engine_panel import EnginePanel
from workbench.app.finetune_tab import FinetuneTab
from workbench.app.formatting import count_text
from workbench.app.graph_selection import tree_row_of_node
from workbench.app.graph_tab import GraphTab
from workbench.app.layer_panel import LayerPanel
from workbench.app.menus import APP_NAME, MAX_RECENT, RecentMenu, build_actions, build_menus, build_toolbar
from workbench.app.sensitivity_tab import SensitivityTab
from workbench.app.status import JobStatus, LogPanel, install_excepthook
from workbench.app.tree_model import COLUMN_WIDTHS
from workbench.app.tree_widget import ModelTreeWidget
from workbench.app.view_memory import ViewMemory, ViewState
from workbench.app.window_jobs import JobCommandsMixin
from workbench.app.wizard import NewProjectWizard

logger = logging.getLogger(__name__)

__all__ = ["MainWindow", "LogPanel", "JobStatus", "install_excepthook", "APP_NAME", "MAX_RECENT"]

PROJECT_FILTER = "Quant Workbench projects (*.qwb);;All files (*)"

# the tabs after "Layer": (class, tab title)
TABS: tuple[tuple[type[QWidget], str], ...] = ((SensitivityTab, "Sensitivity"), (GraphTab, "Graph"),
                                              (FinetuneTab, "Fine-tune"), (EnginePanel, "TensorRT"))


class MainWindow(QMainWindow, JobCommandsMixin):
    """The workbench window. ``settings`` (QSettings) holds recent projects and the window layout."""

    def __init__(self, controller: Controller | None = None, settings: QSettings | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller or Controller(self)
        self.controller.confirm_save = self.confirm_save_for_workers
        self.settings = settings if settings is not None else QSettings()
        self.view_memory = ViewMemory(self.settings)
        self.error_dialogs: list[ErrorDialog] = []
        self.dialog: QWidget | None = None  # the last dialog opened (tests and screenshots reach it here)
        self.wizard: NewProjectWizard | None = None
        self.export_report_dialog: QWidget | None = None
        self._pending_request: Callable[[bool], bool] | None = None
        self._closing = False
        self.setWindowTitle(APP_NAME)
        self.resize(1480, 920)
        self.setDockNestingEnabled(True)

        groups = build_actions(self)
        self.project_actions = groups["project"]  # need an open project and no running job
        self.idle_actions = groups["idle"]  # need no running job
        self._make_widgets()
        self.recent_menu = RecentMenu(self.settings, self.open_project, self)
        build_menus(self, self.recent_menu)
        self.device_combo = DeviceSelector(self.controller, self)
        self.device_combo.device_set.connect(self._device_changed)
        self.toolbar = build_toolbar(self, self.device_combo)
        self._connect()
        self._restore_layout()
        self._update_title()
        self._update_actions()

    # ----- construction -------------------------------------------------------------------------------

    def _make_widgets(self) -> None:
        self.tree = ModelTreeWidget(self.controller, self, self.settings)
        self.tree.columns_fitted.connect(self._widen_tree_dock)
        self.tree_dock = QDockWidget("Model", self)
        self.tree_dock.setObjectName("modelDock")
        self.tree_dock.setWidget(self.tree)
        self.tree_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                                   | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                                   | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.tree_dock)

        self.log_panel = LogPanel(self)
        self.log_dock = QDockWidget("Log", self)
        self.log_dock.setObjectName("logDock")
        self.log_dock.setWidget(self.log_panel)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_dock)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.layer_panel = LayerPanel(self.controller, self)
        self.tabs.addTab(self.layer_panel, "Layer")
        self.extra_tabs: dict[str, QWidget] = {}
        for cls, title in TABS:
            self._add_tab(cls, title)
        self.setCentralWidget(self.tabs)
        self._sized = False

        self.job_status = JobStatus(self.controller, self)
        self.summary_label = QLabel()
        self.summary_label.setObjectName("summary")
        self.statusBar().addPermanentWidget(self.job_status)
        self.statusBar().addPermanentWidget(self.summary_label)

    def _add_tab(self, cls: type[QWidget], title: str) -> None:
        try:
            widget = cls(self.controller, self)  # type: ignore[call-arg]
        except Exception as error:  # noqa: BLE001 - one broken tab must not stop the app
            details, message = traceback.format_exc(), f"{type(error).__name__}: {error}"
            logger.error("The %s tab could not be loaded: %s", title, message)
            QTimer.singleShot(0, lambda: self.show_error(f"The {title} tab could not be loaded", message, details))
            return
        self.extra_tabs[title] = widget
        self.tabs.addTab(widget, title)

    def _connect(self) -> None:
        c = self.controller
        c.error.connect(self.show_error)
        c.log.connect(self.log_panel.append)
        c.trust_needed.connect(self._trust_needed)
        c.busy_changed.connect(lambda _busy: self._update_actions())
        # the hover text of the button that started the job (Export) would stay beside the job's label
        c.busy_changed.connect(lambda busy: self.statusBar().clearMessage() if busy else None)
        c.dirty_changed.connect(lambda _dirty: self._update_title())
        c.session_changed.connect(self._session_changed)
        for signal in (c.layers_changed, c.calibration_changed, c.sensitivity_changed, c.settings_changed):
            signal.connect(lambda *_args: self._update_summary())
        c.export_finished.connect(self._export_finished)
        c.disk.changed.connect(self.offer_reload)
        c.jobs.finished.connect(self._job_finished)
        c.jobs.cancelled.connect(lambda name, _e: self.statusBar().showMessage(f"{name} cancelled", 5000))
        graph = self.extra_tabs.get("Graph")
        if isinstance(graph, GraphTab):
            graph.node_clicked.connect(self._graph_node_clicked)

    def _restore_layout(self) -> None:
        geometry = self.settings.value("window/geometry")
        state = self.settings.value("window/state")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if state is not None:
            self._sized = self.restoreState(state)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self._sized:
            # first run: dock sizes only count once the window has its size (not in the constructor)
            self._sized = True
            QTimer.singleShot(0, self._default_dock_sizes)
        graph = self.extra_tabs.get("Graph")
        if isinstance(graph, GraphTab):
            graph.preload_soon()  # a project's export is drawn in the background, not on the first switch

    def _graph_node_clicked(self, node_names: list[str]) -> None:
        """A node clicked in netron: its module (or the nearest one the tree shows) is selected in the tree."""
        for node in node_names:
            row = tree_row_of_node(node, self.tree.has_row)
            if row is not None:
                self.tree.select_row(row)
                return
        self.statusBar().showMessage(f"{node_names[0]} belongs to no module of the tree" if node_names else "", 5000)

    def _widen_tree_dock(self, width: int) -> None:
        """A model whose columns need more room widens the tree's dock, up to 60% of the window (the layer panel
        keeps the rest); a user's own wider dock stays."""
        wanted = min(width, int(self.width() * 0.6))
        if self.tree_dock.width() < wanted and not self.tree_dock.isFloating():
            self.resizeDocks([self.tree_dock], [wanted], Qt.Orientation.Horizontal)

    def _default_dock_sizes(self) -> None:
        width = min(sum(COLUMN_WIDTHS) + 28, int(self.width() * 0.42))
        self.resizeDocks([self.tree_dock], [width], Qt.Orientation.Horizontal)
        self.resizeDocks([self.log_dock], [max(110, int(self.height() * 0.14))], Qt.Orientation.Vertical)

    # ----- state shown ----------------------------------------------------------------------------------

    def project_label(self) -> str:
        session = self.controller.session
        if session is None:
            return ""
        if session.path is not None:
            return Path(session.path).name
        return f"{session.project.name or 'project'} (not saved)"

    def _update_title(self) -> None:
        label = self.project_label()
        self.setWindowTitle(f"{label}[*] — {APP_NAME}" if label else APP_NAME)
        self.setWindowModified(self.controller.dirty)

    def _update_actions(self) -> None:
        busy = self.controller.busy
        has_project = self.controller.session is not None
        for action in self.project_actions:
            action.setEnabled(has_project and not busy)
        for action in self.idle_actions:
            action.setEnabled(not busy)
        self.recent_menu.setEnabled(not busy)
        self.cancel_action.setEnabled(busy)
        self.device_combo.setEnabled(has_project and not busy)
        for action in self.tree.editing_actions:
            action.setEnabled(has_project and not busy)

    def _update_summary(self) -> None:
        session = self.controller.session
        if session is None:
            self.summary_label.setText("No project: File ▸ New, Open, or Open Demo Project")
            return
        layers = session.project.layers
        quantized = sum(1 for d in layers.values() if d.quantize)
        run = session.project.current_calibration
        if run is None:
            calibration = "not calibrated"
        else:
            sqnr = f", output SQNR {run.output_sqnr_db:.1f} dB" if run.output_sqnr_db is not None else ""
            if sqnr and run.state_digest is not None and run.state_digest != session.state_digest():
                # measured on the calibrated state: an edit, another amax method or a fallback changed it since
                sqnr += " as calibrated, changed since"
            calibration = f"calibrated ({run.method}, {count_text(run.num_batches, 'batch', 'batches')}{sqnr})"
        stale = len(session.build_report.stale)
        verb = "needs" if stale == 1 else "need"
        stale_text = f" · {count_text(stale, 'quantizer')} {verb} recalibrating" if stale else ""
        workers = self.controller.workers
        device = f"{workers} processes ({session.device} for the other jobs)" if workers > 1 else str(session.device)
        self.summary_label.setText(f"{quantized}/{len(layers)} layers quantized · {calibration}{stale_text}"
                                   f" · {device}")

    def _device_changed(self) -> None:
        self.device_combo.show_session_device()  # unchanged if the session refused
        self._update_summary()

    def _session_changed(self) -> None:
        session = self.controller.session
        if session is not None:
            run = session.project.current_calibration
            opened = "read back " if self.controller.reloaded else "opened "  # reloaded: after worker processes
            self.log_panel.append("info", f"{opened + str(session.path) if session.path else 'new project'}: "
                                  f"{session.project.model.label}, {len(session.project.layers)} quantizable layers"
                                  f"{', calibrated (' + run.method + ')' if run else ', not calibrated yet'}")
            self.device_combo.show_session_device()
        self._update_title()
        self._update_actions()
        self._update_summary()

    # ----- errors, trust, logging -------------------------------------------------------------------------

    def show_error(self, title: str, message: str, details: str = "") -> ErrorDialog | None:
        """A readable, non-blocking dialog; the same error already on screen is not stacked twice."""
        for dialog in self.error_dialogs:
            if dialog.title == title and dialog.message == message and dialog.isVisible():
                return dialog
        line = f"{title}: {message}"
        if not self.log_panel.lines or self.log_panel.lines[-1] != ("error", line):  # the controller may have
            self.log_panel.append("error", line)                                     # logged it already
        dialog = ErrorDialog(title, message, details, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(lambda _result, d=dialog: self._forget_error(d))
        self.error_dialogs.append(dialog)
        dialog.open()
        return dialog

    def _forget_error(self, dialog: ErrorDialog) -> None:
        if dialog in self.error_dialogs:
            self.error_dialogs.remove(dialog)

    def _trust_needed(self, kind: str, target: str, message: str) -> None:
        what = "this project's code" if kind == "project" else f"the code of {target}"
        answer = QMessageBox.warning(
            self, "Run code from outside Quant Workbench?",
            f"{message}\n\nLoading {what} runs Python code on this machine (an entry point or an unpickled model). "
            "Only continue if you trust where it comes from.\n\nRun it?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
        if answer == QMessageBox.StandardButton.Yes and self._pending_request is not None:
            self.log_panel.append("warning", f"trusting {target}: its code runs now")
            self._pending_request(True)
        else:
            self.log_panel.append("info", f"not trusted: {target} was not loaded")

    # ----- projects ---------------------------------------------------------------------------------------

    def confirm_save_for_workers(self, question: str) -> bool:
        """Whether the user lets the open project's unsaved changes be saved for a job in worker processes."""
        answer = QMessageBox.question(self, "Save for the worker processes?", question,
                                      QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Cancel,
                                      QMessageBox.StandardButton.Save)
        return answer == QMessageBox.StandardButton.Save

    def confirm_discard(self, action: str) -> bool:
        """True when it is fine to drop the open project (saved, or the user said so)."""
        if not self.controller.dirty:
            return True
        answer = QMessageBox.question(
            self, "Unsaved changes",
            f"{self.project_label() or 'The project'} has unsaved changes. Save them before {action}?",
            QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Save)
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def new_project(self) -> NewProjectWizard | None:
        if self.controller.busy or not self.confirm_discard("creating a new project"):
            return None
        wizard = NewProjectWizard(self)
        wizard.accepted.connect(lambda: self._create_from_wizard(wizard))
        self.wizard = wizard
        wizard.open()
        return wizard

    def _create_from_wizard(self, wizard: NewProjectWizard) -> None:
        try:
            request = wizard.request()
        except Exception as error:  # noqa: BLE001 - the pages validated; anything left is still shown
            self.show_error("New project", str(error))
            return
        self.start_new_project(**request)

    def start_new_project(self, model: Any, calibration: Any, evaluation: Any = None, *, trust_code: bool = False,
                          input_shape: tuple[int, ...] | None = None, name: str | None = None,
                          settings: dict[str, Any] | None = None, save_to: str | None = None,
                          select_first: bool = False) -> bool:
        """Create a project in the background (asking for trust and retrying if its code needs it)."""
        base_dir = Path(save_to).expanduser().resolve().parent if save_to else None

        def done(session: Any) -> None:
            if save_to:
                saved = self.controller.save(save_to)
                if saved is not None:
                    self.recent_menu.add(saved)
                    self._update_title()
            if select_first and session.project.layers:
                self.controller.select([next(iter(session.project.layers))])

        def request(trust: bool) -> bool:
            return self.controller.new_project(model, calibration, evaluation, trust_code=trust,
                                               input_shape=input_shape, name=name, base_dir=base_dir,
                                               settings=settings, on_done=done)

        self._pending_request = request
        return request(trust_code)

    def open_demo(self) -> bool:
        """The demo digits project (what ``workbench demo`` uses), unsaved and ready to calibrate."""
        from workbench.demo_run import demo_project_specs

        if self.controller.busy or not self.confirm_discard("opening the demo"):
            return False
        return self.start_new_project(**demo_project_specs(), select_first=True)

    def open_project_dialog(self) -> bool:
        if self.controller.busy or not self.confirm_discard("opening another project"):
            return False
        start = str(self.settings.value("last_dir", "") or "")
        path, _ = QFileDialog.getOpenFileName(self, "Open project", start, PROJECT_FILTER)
        if not path:
            return False
        return self.open_project(path, confirmed=True)

    def open_project(self, path: str | Path, trust_code: bool = False, confirmed: bool = False) -> bool:
        """Open ``path`` in the background; asks about unsaved changes unless ``confirmed``."""
        if not confirmed and not self.confirm_discard("opening another project"):
            return False
        # absolute: the view kept for the file, its title and later saves do not depend on where the app started
        path = Path(path).expanduser().resolve()
        if not path.exists():
            self.show_error("Could not open the project", f"{path} does not exist.")
            self.recent_menu.remove(path)
            return False

        self.remember_view()  # the project shown now reopens as it is left

        def done(session: Any) -> None:
            self.recent_menu.add(path)
            if not self.restore_view(session):
                layers = session.project.layers
                if layers:
                    self.controller.select([next(iter(layers))])

        def request(trust: bool) -> bool:
            return self.controller.open_project(path, trust_code=trust, on_done=done)

        self._pending_request = request
        return request(trust_code)

    def offer_reload(self, path: str) -> bool:
        """Another process saved the open project: reload it from disk, or keep working on this copy."""
        session = self.controller.session
        if session is None or self.controller.busy or not self.isVisible():
            return False
        unsaved = " Changes made here since the last save would be lost." if session.dirty else ""
        answer = QMessageBox.question(
            self, "Project changed on disk",
            f"{Path(path).name} was saved by another process since it was opened here.\n\nReload it from disk?"
            f"{unsaved} (Keep working here, and a save keeps what the other process changed where the two do not "
            "overlap, or says what overlaps.)",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes)
        if answer != QMessageBox.StandardButton.Yes:
            return False
        return self.open_project(path, trust_code=session.trust_code, confirmed=True)

    def event(self, event: QEvent) -> bool:
        """Qt's event handler; a new native window brings the open dialogs back on top."""
        if event.type() == QEvent.Type.WinIdChange:
            # the native window is made again when QtWebEngine's view first joins it (the graph tab's preload,
            # a second after an export): without a window manager the new window maps over every open dialog,
            # and the export report sat behind the main window. Once the new window is up, they come back on top.
            QTimer.singleShot(0, self._dialogs_to_front)
        if event.type() == QEvent.Type.StatusTip and self.controller.busy:
            # a hovered action's status tip would take the status bar's message area, squeezed beside the job's
            # label and progress ("Write and valid|Exporting: ..."): while a job runs the bar tells the job only
            # (the action's tooltip still names what it does)
            self.statusBar().clearMessage()
            event.accept()
            return True
        return super().event(event)

    def _dialogs_to_front(self) -> None:
        """Raise and activate this window's visible dialogs (the export report, a question)."""
        for widget in QApplication.topLevelWidgets():
            if isinstance(widget, QDialog) and widget.isVisible() and widget.parentWidget() is self:
                self._bring_to_front(widget)

    def changeEvent(self, event: Any) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow():
            self.controller.disk.check()  # back from another window (a terminal): was the project saved there?

    def save(self) -> bool:
        session = self.controller.session
        if session is None:
            return False
        if session.path is None:
            return self.save_as()
        saved = self.controller.save()
        if saved is None:
            return False
        self.remember_view()
        self.recent_menu.add(saved)
        self._update_title()
        return True

    def save_as(self) -> bool:
        session = self.controller.session
        if session is None:
            return False
        start = str(session.path) if session.path is not None else str(
            Path(str(self.settings.value("last_dir", "") or Path.cwd())) / f"{session.project.name or 'project'}.qwb")
        path, _ = QFileDialog.getSaveFileName(self, "Save project as", start, PROJECT_FILTER)
        if not path:
            return False
        saved = self.controller.save(path)
        if saved is None:
            return False
        self.remember_view()
        self.recent_menu.add(saved)
        self._update_title()
        return True

    # ----- the view of a project, as it was left -------------------------------------------------------------

    def view_state(self) -> ViewState:
        """What the window shows of the project now: the tab, the tree's filter and the selected layers."""
        text, regex, type_name = self.tree.filter_state()
        return ViewState(tab=self.tabs.tabText(self.tabs.currentIndex()), filter_text=text, regex=regex,
                         type_name=type_name, selection=list(self.controller.selection))

    def remember_view(self) -> None:
        """Keep :meth:`view_state` for the project's file (a project never saved has none to keep)."""
        session = self.controller.session
        if session is not None and session.path is not None:
            self.view_memory.remember(session.path, self.view_state())

    def restore_view(self, session: Any) -> bool:
        """Show ``session``'s project as it was left here (tab, filter, selection); False for one never left here."""
        state = self.view_memory.recall(session.path)
        if state is None:
            return False
        for index in range(self.tabs.count()):
            if self.tabs.tabText(index) == state.tab:
                self.tabs.setCurrentIndex(index)
        self.tree.set_filter(state.filter_text, state.regex, state.type_name)
        self.controller.select([name for name in state.selection if name in session.project.layers])
        return True

    # ----- closing ------------------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.confirm_discard("quitting"):
            event.ignore()
            return
        if self.controller.busy:
            answer = QMessageBox.question(self, "A job is running",
                                          f"'{self.controller.jobs.job_name}' is still running. Cancel it and quit?",
                                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                          QMessageBox.StandardButton.No)
            if answer != QMessageBox.StandardButton.Yes:
                event.ignore()
                return
        self.remember_view()
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/state", self.saveState())
        self.shutdown()
        event.accept()

    def shutdown(self) -> None:
        """Stop the job thread before widgets go (a running QThread outliving its objects aborts Qt)."""
        self.tree.remember_layout()
        for widget in self.extra_tabs.values():
            stop = getattr(widget, "shutdown", None)
            if callable(stop):
                try:
                    stop()
                except Exception:  # noqa: BLE001 - closing must go on
                    logger.exception("shutting down a tab failed")
        self.controller.shutdown()
