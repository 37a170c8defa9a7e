"""The main window's job commands and the dialogs they open: calibrate, export, evaluate, settings,
TensorRT report and lint, project comparison, about.

A mixin of :class:`workbench.app.main_window.MainWindow`: each handler turns a menu or toolbar
command into a controller call, asking first where the user must decide (overwrite a file?) and
showing what came back (the export report, the evaluation summary).
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import torch
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox, QWidget

from workbench.app.compare_view import choose_and_compare
from workbench.app.dialogs import CalibrateDialog, ProjectSettingsDialog
from workbench.app.export_dialog import ExportReportDialog, ExportSettingsDialog
from workbench.app.formatting import format_seconds
from workbench.app.lint_view import lint_or_offer_calibration
from workbench.app.menus import APP_NAME

__all__ = ["JobCommandsMixin"]


class JobCommandsMixin:
    """Job commands of the main window (``MainWindow`` mixes this in)."""

    def calibrate(self) -> bool:
        return self.controller.calibrate()

    def calibrate_dialog(self) -> CalibrateDialog | None:
        session = self.controller.session
        if session is None:
            return None
        alphas = [r.alpha for r in session.project.smoothing.values() if r.method == "smoothquant"]
        dialog = CalibrateDialog(session.settings.calibration, self, smoothquant=alphas[0] if alphas else None)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._calibrate_with(dialog.options(), dialog.smoothing()))
        self.dialog = dialog
        dialog.open()
        return dialog

    def _calibrate_with(self, options: dict[str, Any], smoothing: dict[str, Any] | None = None) -> None:
        # the options become the project's: the toolbar's Calibrate repeats them (the smoothing is per layer,
        # recorded in the project by the calibration itself); the fields the dialog does not show (the INT4
        # blocks' method, ...) stay as they were
        self.controller.update_setting("calibration", options)
        self.controller.calibrate(**options, **(smoothing or {}))

    def export(self) -> bool:
        force = self._confirm_overwrite(None)
        return force is not None and self.controller.export(force=force)

    def _confirm_overwrite(self, path: str | Path | None) -> bool | None:
        """True: overwrite a file this project did not write (the user said so); False: nothing to confirm;
        None: the user declined."""
        session = self.controller.session
        reason = session.overwrite_refusal(path) if session is not None else None
        if reason is None:
            return False
        answer = QMessageBox.question(self, "Overwrite the file?", f"{reason.split(';')[0]}.\n\nOverwrite it?",
                                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                      QMessageBox.StandardButton.No)
        return True if answer == QMessageBox.StandardButton.Yes else None

    def export_dialog(self) -> QWidget | None:
        if self.controller.session is None:
            return None
        dialog = ExportSettingsDialog(self.controller, self)
        dialog.accepted.connect(lambda: self._export_with(dialog))
        self.dialog = dialog
        dialog.open()
        return dialog

    def _export_with(self, dialog: Any) -> None:
        options = dict(dialog.settings() or {})
        path = options.pop("path", None)
        force = self._confirm_overwrite(path)
        if force is not None:
            self.controller.export(path, force=force, **options)

    def _export_finished(self, report: Any) -> None:
        self.statusBar().showMessage(f"Exported {getattr(report, 'path', '')}", 8000)
        try:
            dialog = ExportReportDialog(report, self)
        except Exception as error:  # noqa: BLE001 - the export worked; only showing the report failed
            self.show_error("Could not show the export report", str(error), traceback.format_exc())
            return
        self.export_report_dialog = dialog
        dialog.open()
        # in front, with the focus: the job's end re-activates the main window (its status bar, its actions), and
        # without a window manager keeping a dialog over its parent the report opened behind it
        QTimer.singleShot(0, lambda: self._bring_to_front(dialog))

    @staticmethod
    def _bring_to_front(dialog: QWidget) -> None:
        try:
            if dialog.isVisible():
                dialog.raise_()
                dialog.activateWindow()
        except RuntimeError:  # closed (and deleted) before the event loop came back: nothing to raise
            pass

    def import_engine_report(self, layer_info: str | None = None, profile: str | None = None,
                             ask_profile: bool = True) -> bool:
        """Import trtexec's report; without paths, file dialogs ask (the profile is optional)."""
        if self.controller.session is None:
            return False
        folder = str(self.controller.session.base_dir)
        if layer_info is None:
            layer_info, _ = QFileDialog.getOpenFileName(self, "TensorRT layer information (--exportLayerInfo)",
                                                        folder, "JSON (*.json);;All files (*)")
            if not layer_info:
                return False
            if ask_profile and profile is None:
                profile, _ = QFileDialog.getOpenFileName(self, "TensorRT profile (--exportProfile; Cancel: none)",
                                                         str(Path(layer_info).parent), "JSON (*.json);;All files (*)")
        refused: list[str] = []
        report = self.controller.import_engine_report(layer_info, profile or None, refused=refused)
        if report is None and refused:  # not this model's engine, as far as its names tell: offer the ways on
            choice = self.ask_how_to_map_engine(refused[0])
            if choice == "force":
                report = self.controller.import_engine_report(layer_info, profile or None, force=True)
            elif choice == "onnx":
                onnx_file, _ = QFileDialog.getOpenFileName(self, "The ONNX file the engine was built from",
                                                           str(Path(layer_info).parent), "ONNX (*.onnx);;All files (*)")
                if onnx_file:
                    report = self.controller.import_engine_report(layer_info, profile or None, onnx_file=onnx_file)
        if report is None:
            return False
        panel = self.extra_tabs.get("TensorRT")
        if panel is not None:
            self.tabs.setCurrentWidget(panel)
        return True

    def ask_how_to_map_engine(self, message: str) -> str:
        """An engine too little of this model is found in: "onnx" (map its names through the ONNX file it was
        built from), "force" (report it anyway) or "cancel" (nothing is stored)."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Not this model's engine?", message, parent=self)
        onnx = box.addButton("Map Through ONNX File…", QMessageBox.ButtonRole.AcceptRole)
        force = box.addButton("Report Anyway", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        clicked = box.clickedButton()
        return "onnx" if clicked is onnx else "force" if clicked is force else "cancel"

    def lint(self) -> bool:
        """Lint for TensorRT (offering to calibrate first); the TensorRT tab shows the warnings."""
        panel = self.extra_tabs.get("TensorRT")
        if panel is not None:
            self.tabs.setCurrentWidget(panel)
        return lint_or_offer_calibration(self, self.controller)

    def compare_with_project(self, path: str | None = None) -> bool:
        """Compare another project file with this one (a file dialog asks without ``path``)."""
        def shown(dialog: QWidget) -> None:
            self.dialog = dialog

        return choose_and_compare(self, self.controller, path, on_shown=shown)

    def evaluate(self) -> bool:
        def done(evaluation: Any) -> None:
            self.log_panel.append("info", f"evaluation: {evaluation.summary()}")
            self.statusBar().showMessage(f"Evaluation: {evaluation.summary()}", 15000)

        return self.controller.evaluate(done)

    def cancel_job(self) -> None:
        if self.controller.busy:
            self.job_status.cancel()

    def _job_finished(self, name: str, _result: Any) -> None:
        elapsed = f" in {format_seconds(time.monotonic() - self.job_status.started_at)}"
        self.statusBar().showMessage(f"{name} done{elapsed}", 5000)
        self._update_summary()

    def settings_dialog(self) -> ProjectSettingsDialog | None:
        session = self.controller.session
        if session is None:
            return None
        dialog = ProjectSettingsDialog(session.settings, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._apply_settings(dialog.changes()))
        self.dialog = dialog
        dialog.open()
        return dialog

    def _apply_settings(self, changes: dict[str, Any]) -> None:
        # one edit: on a big model each edit starts a background rebuild that refuses the next edit
        self.controller.set_settings(changes)
        self._update_summary()

    def about(self) -> None:
        from workbench import __version__

        QMessageBox.about(self, f"About {APP_NAME}",
                          f"<b>{APP_NAME}</b> {__version__}<br>INT8 post-training quantization of PyTorch models "
                          "for TensorRT: layer selection, calibration, sensitivity, QDQ ONNX export.<br><br>"
                          f"PyTorch {torch.__version__} · Qt {QApplication.instance().applicationVersion() or ''}")
