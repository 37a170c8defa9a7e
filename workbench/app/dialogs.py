"""Small dialogs of the main window: errors with details, calibration options, project settings.

Every dialog opens with ``open()`` (window-modal, not a nested event loop), so jobs keep reporting
progress behind it and tests can drive it.
"""
from __future__ import annotations

import copy
import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from workbench.analysis.metrics import BUILTIN_METRICS, DEFAULT_METRIC
from workbench.app.export_dialog import opset_spin_box
from workbench.project.settings import EXPORT_CHECKS, FUNCTIONAL_SWITCHES, CalibrationSettings, ProjectSettings
from workbench.quant.calib.methods import AMAX_METHODS, PERCENTILE, AmaxMethod

__all__ = ["ErrorDialog", "CalibrateDialog", "CalibrationOptions", "ProjectSettingsDialog", "CALIBRATION_METHODS",
           "percentile_spin_box"]

CALIBRATION_METHODS = AMAX_METHODS


def _takes_percentile(method: str) -> bool:
    return method in AMAX_METHODS and PERCENTILE in AmaxMethod(method).parameters


def percentile_spin_box(value: float | None = None) -> QDoubleSpinBox:
    """The percentile of the ``percentile`` amax method, in %, as every form edits it."""
    box = QDoubleSpinBox()
    box.setDecimals(4)
    box.setRange(PERCENTILE.low + 10 ** -box.decimals() if PERCENTILE.low_open else PERCENTILE.low, PERCENTILE.high)
    box.setSingleStep(0.01)
    box.setValue(float(value or PERCENTILE.default))
    box.setToolTip(f"{PERCENTILE.help}: {PERCENTILE.describe()}")
    box.setSuffix(" %")
    return box


class CalibrationOptions(QWidget):
    """amax method, batches and percentile (the project's ``calibration`` setting), as a form.

    The Calibrate dialog and the project settings edit the same three values the same way.
    """

    def __init__(self, settings: CalibrationSettings | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        settings = settings or CalibrationSettings()
        self.method = QComboBox()
        self.method.addItems(CALIBRATION_METHODS)
        self.method.setCurrentText(AmaxMethod(settings.method).value)
        for index, method in enumerate(AmaxMethod):
            self.method.setItemData(index, method.description, Qt.ItemDataRole.ToolTipRole)
        self.method.setToolTip("How histogram quantizers choose amax (max-calibrated ones, such as weights, use "
                               "their max). Each can be changed afterwards from its histogram without recalibrating.")
        self.num_batches = QSpinBox()
        self.num_batches.setRange(0, 1_000_000)
        self.num_batches.setSpecialValueText("all")
        self.num_batches.setValue(settings.num_batches or 0)
        self.percentile = percentile_spin_box(settings.percentile)
        self.sequential = QCheckBox("One block at a time")
        self.sequential.setChecked(settings.sequential)
        self.sequential.setToolTip("Sequential calibration: only one decoder block's weights in memory at a time, "
                                   "activations kept on disk beyond a budget; the same amax. Models "
                                   "without repeated blocks are calibrated whole.")
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("amax method", self.method)
        form.addRow("Batches", self.num_batches)
        form.addRow("Percentile", self.percentile)
        form.addRow("Sequential", self.sequential)
        self.method.currentTextChanged.connect(lambda m: self.percentile.setEnabled(_takes_percentile(m)))
        self.percentile.setEnabled(_takes_percentile(self.method.currentText()))

    def options(self) -> dict[str, Any]:
        """``session.calibrate`` keyword arguments (and the project's calibration setting)."""
        return {"method": self.method.currentText(), "num_batches": self.num_batches.value() or None,
                "percentile": float(self.percentile.value()), "sequential": self.sequential.isChecked()}


class ErrorDialog(QMessageBox):
    """A readable error: what failed (title), why (message), and the traceback behind "Show Details…"."""

    def __init__(self, title: str, message: str, details: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setIcon(QMessageBox.Icon.Critical)
        self.setWindowTitle(title)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setText(f"<b>{html.escape(title)}</b>")
        self.setInformativeText(html.escape(message or "No message.").replace("\n", "<br>"))
        if details:
            self.setDetailedText(details)
        self.setStandardButtons(QMessageBox.StandardButton.Close)
        # QMessageBox sizes itself from its text: a minimum label width keeps long messages readable
        self.setStyleSheet("QLabel#qt_msgbox_informativelabel { min-width: 460px; }")
        for edit in self.findChildren(QTextEdit):  # the details: a traceback reads best unwrapped, monospace
            font = QFont("monospace")
            font.setStyleHint(QFont.StyleHint.Monospace)
            edit.setFont(font)
            edit.setLineWrapMode(QTextEdit.LineWrapMode.NoWrap)
            edit.setMinimumSize(640, 220)
        self.title, self.message, self.details = title, message, details


class CalibrateDialog(QDialog):
    """Calibrate…: amax method, batches and percentile; they become the project's calibration settings."""

    def __init__(self, settings: CalibrationSettings, parent: QWidget | None = None, *,
                 smoothquant: float | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Calibrate")
        self.form = CalibrationOptions(settings)
        self.method, self.num_batches, self.percentile = self.form.method, self.form.num_batches, self.form.percentile
        # SmoothQuant: on when the project's layers are smoothed now (``smoothquant`` is their alpha)
        self._smoothed_before = smoothquant is not None
        self.smoothquant = QCheckBox("SmoothQuant: move outlier activation channels into the weights first")
        self.smoothquant.setChecked(self._smoothed_before)
        self.alpha = QDoubleSpinBox()
        self.alpha.setRange(0.0, 1.0)
        self.alpha.setSingleStep(0.05)
        self.alpha.setDecimals(2)
        self.alpha.setValue(0.5 if smoothquant is None else smoothquant)
        self.alpha.setToolTip("SmoothQuant's strength alpha: s = max|X|^alpha / max|W|^(1-alpha) per input channel "
                              "(0.5 is the paper's default; higher moves more range into the weights)")
        self.alpha.setEnabled(self._smoothed_before)
        self.smoothquant.toggled.connect(self.alpha.setEnabled)
        smooth_row = QHBoxLayout()
        smooth_row.addWidget(self.smoothquant)
        smooth_row.addWidget(QLabel("alpha"))
        smooth_row.addWidget(self.alpha)
        note = QLabel("Calibration runs in the background; Cancel in the status bar stops it.")
        note.setObjectName("hint")
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Calibrate")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.form)
        layout.addLayout(smooth_row)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def options(self) -> dict[str, Any]:
        """``session.calibrate`` keyword arguments (and the project's calibration setting)."""
        return self.form.options()

    def smoothing(self) -> dict[str, Any]:
        """``session.calibrate``'s ``smoothquant`` argument: the alpha, ``"off"`` to drop the smoothing the
        project has, or nothing when it stays as it is (off and never on)."""
        if self.smoothquant.isChecked():
            return {"smoothquant": round(float(self.alpha.value()), 4)}
        return {"smoothquant": "off"} if self._smoothed_before else {}


class ProjectSettingsDialog(QDialog):
    """Project settings (the ``settings`` of the project file, as ``workbench set`` changes them)."""

    def __init__(self, settings: ProjectSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Project settings")
        self._original = settings.to_stored()
        self._export = settings.export

        input_default = settings.defaults.input or {}
        self.input_calibrator = QComboBox()
        self.input_calibrator.addItems(["histogram", "max"])
        # a descriptor without calib_method calibrates with max (QuantDescriptor's default)
        self.input_calibrator.setCurrentText(input_default.get("calib_method", "max"))
        self.input_unsigned = QCheckBox("unsigned inputs")
        self.input_unsigned.setChecked(bool(input_default.get("unsigned")))
        default_box = QGroupBox("Default input descriptor")
        default_form = QFormLayout(default_box)
        default_form.addRow("Calibrator", self.input_calibrator)
        default_form.addRow("", self.input_unsigned)

        # one check box per functional switch, from the settings' one definition of them
        self.functional = {}
        for name, text in FUNCTIONAL_SWITCHES.items():
            box = QCheckBox(f"quantize {text}")
            box.setChecked(getattr(settings.functional, name))
            self.functional[name] = box
        self.add, self.concat = self.functional["add"], self.functional["concat"]
        self.rule_concat = QCheckBox("inputs of a concat share one quantizer")
        self.rule_concat.setChecked(settings.rules.concat)
        self.rule_maxpool = QCheckBox("a max-pool's input and output quantizers match")
        self.rule_maxpool.setChecked(settings.rules.maxpool)
        self.rule_residual = QCheckBox("quantize the identity branch of a residual add")
        self.rule_residual.setChecked(settings.rules.residual)
        graph_box = QGroupBox("Functional quantizers and TensorRT placement rules")
        graph_layout = QVBoxLayout(graph_box)
        for box in (*self.functional.values(), self.rule_concat, self.rule_maxpool, self.rule_residual):
            graph_layout.addWidget(box)

        self.calibration = CalibrationOptions(settings.calibration)
        self.method = self.calibration.method
        calibration_box = QGroupBox("Calibration")
        QVBoxLayout(calibration_box).addWidget(self.calibration)

        self.metric_box = QComboBox()
        self.metric_box.setEditable(True)
        self.metric_box.addItems(list(BUILTIN_METRICS))
        self.metric_box.setCurrentText(settings.metric.name)
        self.direction = QComboBox()
        for text, value in (("set by the metric", None), ("higher is better", "higher"),
                            ("lower is better", "lower")):
            self.direction.addItem(text, value)
        direction = settings.metric.direction
        self.direction.setCurrentIndex(max(0, self.direction.findData(None if direction is None else direction.value)))
        self.direction.setToolTip("Only for a user metric (module:function): which way is better")
        self.metric_box.currentTextChanged.connect(self._metric_changed)
        self._metric_changed(self.metric_box.currentText())
        self.export_path = QLineEdit(settings.export.path or "")
        self.export_path.setPlaceholderText("next to the project")
        self.opset = opset_spin_box(settings.export.opset)
        other_box = QGroupBox("Metric and export")
        other_form = QFormLayout(other_box)
        other_form.addRow("Metric", self.metric_box)
        other_form.addRow("Direction", self.direction)
        other_form.addRow("Export path", self.export_path)
        other_form.addRow("Opset", self.opset)
        # the export's parity checks, from the settings' one definition of them (EXPORT_CHECKS)
        self.min_cosine = QDoubleSpinBox()
        self.min_cosine.setRange(-1.0, 1.0)
        self.min_cosine.setDecimals(6)
        self.min_cosine.setSingleStep(0.0001)
        self.min_cosine.setValue(settings.export.min_cosine)
        self.min_cosine.setToolTip(EXPORT_CHECKS["min_cosine"])
        other_form.addRow("Parity: min cosine", self.min_cosine)
        self.parity_batches = QSpinBox()
        self.parity_batches.setRange(0, 1000)
        self.parity_batches.setValue(settings.export.parity_batches)
        self.parity_batches.setToolTip(EXPORT_CHECKS["parity_batches"])
        other_form.addRow("Parity: batches", self.parity_batches)

        note = QLabel("Changing the default descriptor, functional quantizers or rules rebuilds the quantized model; "
                      "quantizers whose descriptor changed need calibrating again.")
        note.setWordWrap(True)
        note.setObjectName("hint")
        self.problem = QLabel()  # why OK did not close the dialog
        self.problem.setStyleSheet("color: #b00020")
        self.problem.setWordWrap(True)
        self.problem.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        for widget in (default_box, graph_box, calibration_box, other_box, note, self.problem, buttons):
            layout.addWidget(widget)
        # a group box's size hint ignores its title: wide enough for the longest one
        self.setMinimumWidth(self.fontMetrics().horizontalAdvance(graph_box.title()) + 80)

    def _metric_changed(self, name: str) -> None:
        """A built-in metric knows its direction; only a user function (``module:function``) needs one."""
        user_function = ":" in name
        self.direction.setEnabled(user_function)
        # no guess for a user function: left unset, OK asks for it (accept below)
        self.direction.setItemText(0, "choose which way is better" if user_function else "set by the metric")
        if not user_function:
            self.direction.setCurrentIndex(0)

    def accept(self) -> None:
        """Close only with settings the session will take, so that no other change in the form is lost."""
        if self.direction.isEnabled() and self.direction.currentData() is None:
            self.problem.setText(f"Say whether a higher or a lower value of {self.metric_box.currentText()} is better.")
            self.problem.show()
            self.direction.setFocus()
            return
        super().accept()

    def changes(self) -> dict[str, Any]:
        """Settings that differ from the ones the dialog opened with: ``{key: new value}``."""
        original = self._original
        new: dict[str, Any] = {}
        defaults = copy.deepcopy(original.get("defaults") or {"input": None, "weight": None})
        input_default = dict(defaults.get("input") or {})
        input_default["calib_method"] = self.input_calibrator.currentText()
        if self.input_unsigned.isChecked():
            input_default["unsigned"] = True
        else:
            input_default.pop("unsigned", None)
        if input_default.get("calib_method") == "max":
            input_default.pop("calib_method")
        defaults["input"] = input_default or None
        new["defaults"] = defaults
        new["functional"] = {name: box.isChecked() for name, box in self.functional.items()}
        new["rules"] = {"concat": self.rule_concat.isChecked(), "maxpool": self.rule_maxpool.isChecked(),
                        "residual": self.rule_residual.isChecked()}
        # the fields the form shows over the stored ones (the INT4 blocks' method stays); "sequential" off is the
        # default a file that never set it does not store
        stored = dict(original.get("calibration") or {})
        new["calibration"] = {**stored, **self.calibration.options()}
        if not new["calibration"].get("sequential") and "sequential" not in stored:
            del new["calibration"]["sequential"]
        new["metric"] = {"name": self.metric_box.currentText().strip() or DEFAULT_METRIC,
                         "direction": self.direction.currentData()}
        export = dict(original.get("export") or {})
        export["path"] = self.export_path.text().strip() or None
        export["opset"] = self.opset.value()
        for name, box in (("min_cosine", self.min_cosine), ("parity_batches", self.parity_batches)):
            if box.value() != getattr(self._export, name):  # a file that never set it keeps its bytes
                export[name] = box.value()
        new["export"] = export
        return {key: value for key, value in new.items() if value != original.get(key)}
