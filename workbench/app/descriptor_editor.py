"""Editing quantizer descriptors: the editor (the fields of one descriptor plus the amax method, remembering
which fields the user touched), applying it through the controller, and the dialog around it.

The editor applies only the fields the user touched: with several layers selected, changing the bits
changes the bits of all of them and leaves their other fields as they were.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDoubleValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.dialogs import percentile_spin_box
from workbench.app.formatting import count_text
from workbench.graph import ModelTree, QuantizerInfo
from workbench.quant.algorithms.tensorrt_rules import tensorrt_check
from workbench.quant.calib.methods import AMAX_METHODS, DEFAULT_AMAX_METHOD, PERCENTILE, AmaxMethod
from workbench.quant.tensor_quant import CALIB_METHODS

__all__ = ["DescriptorEditor", "DescriptorDialog", "apply_editor", "role_of", "layer_quantizers", "METHODS",
           "DESCRIPTOR_FIELDS"]

METHODS = AMAX_METHODS
DESCRIPTOR_FIELDS = ("num_bits", "axis", "unsigned", "narrow_range", "calib_method", "amax")
_FP8 = (4, 3)


def role_of(info: QuantizerInfo) -> str:
    return "weight" if info.attr.startswith("_weight") else "input"


class DescriptorEditor(QWidget):
    """Fields of one quantizer descriptor plus the amax method; remembers which fields the user touched."""

    touched_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.num_bits = QSpinBox()
        self.num_bits.setRange(0, 16)
        self.num_bits.setSpecialValueText("fp8 E4M3")  # 0 stands for the FP8 (4, 3) format
        self.num_bits.setToolTip("Bits of the integer grid (8 for INT8); the lowest step is FP8 E4M3 emulation. "
                                 "Export writes INT8, FP8 E4M3 and INT4 weights in blocks; other widths simulate only")
        # what export will make of the fields as they stand, said while the user edits (not first at Export)
        self.export_note = QLabel()
        self.export_note.setObjectName("exportNote")
        self.export_note.setWordWrap(True)
        self.export_note.setStyleSheet("color: #b00020")
        self.export_note.hide()
        # a quantizer its layer's precision switches off (an INT4 weight-only layer's input): no field applies
        self.state_note = QLabel()
        self.state_note.setObjectName("stateNote")
        self.state_note.setWordWrap(True)
        self.state_note.hide()
        self._role: str | None = None
        self._module_types: list[str] = []
        self._block_size: int | None = None
        self._off = False
        self.axis = QComboBox()
        self.axis.addItem("per-tensor", None)
        self.axis.addItem("per-channel, axis 0", 0)
        self.axis.addItem("per-channel, axis 1", 1)
        self.axis.setToolTip("Per-tensor: one amax. Per-channel: one amax per slice along the axis "
                             "(0: output channels of a conv/linear weight; 1: ConvTranspose weights)")
        self.unsigned = QCheckBox("unsigned")
        self.unsigned.setToolTip("Use [0, 2^bits − 1] (inputs that are never negative, after a ReLU)")
        self.narrow_range = QCheckBox("narrow range")
        self.narrow_range.setToolTip("Use [−127, 127] instead of [−128, 127] (TensorRT's symmetric range)")
        self.calib_method = QComboBox()
        self.calib_method.addItems(list(CALIB_METHODS))
        self.calib_method.setToolTip("Calibrator: running max of |x|, or a histogram (then pick the method below)")
        self.method = QComboBox()
        self.method.addItems(METHODS)
        for index, method in enumerate(AmaxMethod):
            self.method.setItemData(index, method.description, Qt.ItemDataRole.ToolTipRole)
        self.method.setToolTip(f"How amax is chosen from the histogram: {', '.join(METHODS)}. Changing it "
                               "recomputes amax from the stored histogram (no data pass).")
        self.percentile = percentile_spin_box()
        self.amax = QLineEdit()
        self.amax.setPlaceholderText("calibrated")
        self.amax.setValidator(QDoubleValidator(0.0, 1e30, 8))
        self.amax.setToolTip("A fixed range instead of the calibrated one (empty: use calibration). "
                             "Calibrating again replaces it.")

        self._labels: dict[str, QLabel] = {}
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow(self.state_note)
        checks = QWidget()
        checks_layout = QHBoxLayout(checks)
        checks_layout.setContentsMargins(0, 0, 0, 0)
        checks_layout.addWidget(self.unsigned)
        checks_layout.addWidget(self.narrow_range)
        checks_layout.addStretch(1)
        rows = [("num_bits", "Bits", self.num_bits), ("axis", "Granularity", self.axis),
                ("unsigned", "Range", checks), ("calib_method", "Calibrator", self.calib_method),
                ("method", "amax method", self.method), ("percentile", "Percentile", self.percentile),
                ("amax", "amax override", self.amax)]
        for key, text, widget in rows:
            label = QLabel(text)
            self._labels[key] = label
            form.addRow(label, widget)
        self._labels["narrow_range"] = self._labels["unsigned"]
        form.insertRow(2, self.export_note)  # right under Bits (row 0: the state note, row 1: Bits)

        self._touched: set[str] = set()
        self._loading = False
        self.num_bits.valueChanged.connect(lambda _v: self._touch("num_bits"))
        self.axis.currentIndexChanged.connect(lambda _i: self._touch("axis"))
        self.unsigned.toggled.connect(lambda _b: self._touch("unsigned"))
        self.narrow_range.toggled.connect(lambda _b: self._touch("narrow_range"))
        self.calib_method.currentIndexChanged.connect(lambda _i: self._touch("calib_method"))
        self.method.currentIndexChanged.connect(lambda _i: self._touch("method"))
        self.percentile.valueChanged.connect(lambda _v: self._touch("method"))
        self.amax.textEdited.connect(lambda _t: self._touch("amax"))
        self._method_available = False

    # ----- loading ---------------------------------------------------------------------------------

    def set_context(self, role: str | None, module_types: Sequence[str] = ()) -> None:
        """The role ("input"/"weight") and layer types the next :meth:`load` edits: the export check needs them."""
        self._role = role
        self._module_types = list(dict.fromkeys(module_types))

    def load(self, fields: dict[str, Any] | None, mixed: set[str] = frozenset(), method: str | None = None,
             percentile: float | None = None, method_available: bool = False) -> None:
        """Show ``fields`` (a descriptor dict) without marking anything as touched.

        ``mixed`` names the fields whose values differ across the selection (their labels say so).
        """
        self._loading = True
        try:
            fields = fields or {}
            self._off = fields.get("enabled", True) is False
            self._block_size = fields.get("block_size")
            bits = fields.get("num_bits", 8)
            self.num_bits.setValue(0 if isinstance(bits, (list, tuple)) else int(bits))
            axis = fields.get("axis")
            for index in range(self.axis.count() - 1, 2, -1):  # the items a previous load added
                self.axis.removeItem(index)
            position = self.axis.findData(axis)
            if self._block_size is not None:  # what the tree says: blocks, not per-channel
                self.axis.addItem(f"blocks of {self._block_size} (one scale per block of a row)", axis)
                position = self.axis.count() - 1
            elif position < 0:
                self.axis.addItem(f"per-channel, axis {axis}", axis)
                position = self.axis.count() - 1
            self.axis.setCurrentIndex(position)
            self.unsigned.setChecked(bool(fields.get("unsigned")))
            self.narrow_range.setChecked(bool(fields.get("narrow_range")))
            self.calib_method.setCurrentText(fields.get("calib_method", "max"))
            self.method.setCurrentText(method or DEFAULT_AMAX_METHOD.value)
            if percentile is not None:
                self.percentile.setValue(float(percentile))
            amax = fields.get("amax")
            if amax is None:
                self.amax.setText("")
            elif isinstance(amax, (int, float)):
                self.amax.setText(f"{float(amax):.6g}")
            else:
                self.amax.setText("")
                self.amax.setPlaceholderText(f"per-channel ({len(np.ravel(amax))} values)")
            self._method_available = method_available
            self._touched = set()
            for key, label in self._labels.items():
                label.setProperty("mixed", key in mixed)
                label.setToolTip("differs across the selected layers: shown for the first one" if key in mixed
                                 else "")
        finally:
            self._loading = False
        self._restyle()
        self._update_enabled()
        self._update_export_note()

    def _touch(self, key: str) -> None:
        if self._loading:
            return
        self._touched.add(key)
        self._restyle()
        self._update_enabled()
        self._update_export_note()
        self.touched_changed.emit()

    def _restyle(self) -> None:
        for key, label in self._labels.items():
            touched = key in self._touched or (key == "unsigned" and "narrow_range" in self._touched)
            label.setProperty("touched", touched)
            font = label.font()
            font.setBold(touched)
            font.setItalic(bool(label.property("mixed")))
            label.setFont(font)

    def _update_export_note(self) -> None:
        """Say at once when the fields as they stand are not what QDQ export writes (the one rule:
        :func:`workbench.quant.algorithms.tensorrt_rules.tensorrt_check`), before they are applied and calibrated."""
        problems: list[str] = []
        if self._role is not None and not self._off:
            bits = self.num_bits.value()
            num_bits = _FP8 if bits == 0 else bits
            for module_type in self._module_types or ["Linear"]:
                check = tensorrt_check(self._role, num_bits, self.axis.currentData(), module_type,
                                       block_size=self._block_size)
                problem = check.error or check.sim_only
                if problem and problem not in problems:
                    problems.append(problem)
        self.export_note.setText(" ".join(f"Export will refuse this: {p}" for p in problems[:1]))
        self.export_note.setVisible(bool(problems))
        self.num_bits.setStyleSheet("QSpinBox { color: #b00020; }" if problems else "")

    def export_problem(self) -> str:
        """Why export would refuse the fields as they stand ("" when it writes them)."""
        return self.export_note.text() if self.export_note.isVisibleTo(self) else ""

    def _update_enabled(self) -> None:
        off = self._off
        self.state_note.setText("Off: this layer's precision leaves this quantizer's tensor in float (INT4 "
                                "weight-only layers quantize only their weight). Set the layer's precision to "
                                "change it." if off else "")
        self.state_note.setVisible(off)
        for widget in (self.num_bits, self.axis, self.unsigned, self.narrow_range, self.calib_method, self.amax):
            widget.setEnabled(not off)
        histogram = self.calib_method.currentText() == "histogram"
        self.method.setEnabled(histogram and self._method_available and not off)
        takes_percentile = PERCENTILE in AmaxMethod(self.method.currentText()).parameters
        self.percentile.setEnabled(histogram and self._method_available and not off and takes_percentile)
        if not self._method_available:
            self.method.setToolTip("Calibrate with a histogram calibrator first: the method picks amax from it")

    # ----- reading -----------------------------------------------------------------------------------

    def touched(self) -> set[str]:
        return set(self._touched)

    def touched_fields(self) -> dict[str, Any]:
        """The descriptor fields the user changed, as ``set_descriptor`` takes them."""
        values: dict[str, Any] = {}
        bits = self.num_bits.value()
        current = {"num_bits": list(_FP8) if bits == 0 else bits, "axis": self.axis.currentData(),
                   "unsigned": self.unsigned.isChecked(), "narrow_range": self.narrow_range.isChecked(),
                   "calib_method": self.calib_method.currentText()}
        for key in ("num_bits", "axis", "unsigned", "narrow_range", "calib_method"):
            if key in self._touched:
                values[key] = current[key]
        if "amax" in self._touched:
            text = self.amax.text().strip()
            values["amax"] = float(text) if text else None
        return values

    def touched_method(self) -> tuple[str, float] | None:
        """(method, percentile) when the user changed the amax method, else None."""
        if "method" not in self._touched or not self.method.isEnabled():
            return None
        return self.method.currentText(), float(self.percentile.value())


def layer_quantizers(tree: ModelTree | None, name: str) -> list[QuantizerInfo]:
    if tree is None or name not in tree:
        return []
    return list(tree[name].quantizers)


def apply_editor(controller: Controller, editor: DescriptorEditor, names: Sequence[str], role: str) -> bool:
    """Apply what the user touched in ``editor`` to ``names``; False when the controller refused."""
    session = controller.session
    if session is None or controller.refuse_if_busy("Set descriptor"):
        return False
    try:
        descriptors = controller.descriptors(names, role)
    except Exception as error:  # noqa: BLE001 - shown to the user
        controller.error.emit("Set descriptor", str(error), "")
        return False
    targets = [n for n in names if descriptors.get(n) is not None]  # layers without this role are skipped
    ok = True
    method = editor.touched_method()
    if method is not None:
        quantizers = [q.name for n in targets for q in layer_quantizers(controller.tree(), n)
                      if role_of(q) == role and q.calibrator == "HistogramCalibrator" and q.enabled]
        if quantizers:
            ok = controller.recompute_amax(quantizers, method[0], method[1]) is not None
    fields = editor.touched_fields()
    if ok and fields and targets:
        ok = controller.set_descriptor(targets, role, fields) is not None
    return ok


class DescriptorDialog(QDialog):
    """"Set descriptor…" from the tree's context menu: one editor applied to every selected layer."""

    def __init__(self, controller: Controller, names: Sequence[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.names = list(names)
        self.setWindowTitle(f"Set descriptor for {count_text(len(self.names), 'layer')}")
        self.setMinimumWidth(420)
        self.role = QComboBox()
        self.role.addItem("Input quantizer", "input")
        self.role.addItem("Weight quantizer", "weight")
        self.editor = DescriptorEditor()
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setObjectName("hint")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.Apply).clicked.connect(self.apply)
        layout = QVBoxLayout(self)
        names_label = QLabel(", ".join(self.names[:6]) + (f" and {len(self.names) - 6} more" if len(self.names) > 6
                                                          else ""))
        names_label.setWordWrap(True)
        layout.addWidget(names_label)
        layout.addWidget(self.role)
        layout.addWidget(self.editor)
        layout.addWidget(self.note)
        layout.addWidget(buttons)
        self.role.currentIndexChanged.connect(lambda _i: self.load())
        self.load()

    def current_role(self) -> str:
        return self.role.currentData()

    def load(self) -> None:
        session = self.controller.session
        if session is None:
            return
        descriptors = {n: d for n, d in self.controller.descriptors(self.names, self.current_role()).items()
                       if d is not None}
        first = next(iter(descriptors.values()), None)
        mixed = {key for key in DESCRIPTOR_FIELDS
                 if len({repr(d.get(key)) for d in descriptors.values()}) > 1}
        calibrated = session.project.current_calibration is not None
        self.editor.set_context(self.current_role(), [session.project.layers[n].type for n in descriptors
                                                      if n in session.project.layers])
        self.editor.load(first, mixed, method_available=calibrated)
        skipped = len(self.names) - len(descriptors)
        verb, pronoun = ("has", "is") if skipped == 1 else ("have", "are")
        self.note.setText(f"{count_text(skipped, 'selected layer')} {verb} no {self.current_role()} quantizer and "
                          f"{pronoun} skipped."
                          if skipped else "Only the fields you change are applied; the others keep each layer's value.")

    def apply(self) -> bool:
        if not apply_editor(self.controller, self.editor, self.names, self.current_role()):
            return False
        self.load()
        return True

    def accept(self) -> None:
        if self.apply():
            super().accept()
