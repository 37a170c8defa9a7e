"""The fusion lint's list, in the TensorRT tab: run lint, read its warnings, apply a warning's fix.

The warnings come from ``controller.lint_state`` (:class:`workbench.app.lint_state.LintState`); the
same warnings put icons on the tree's rows. Clicking a warning selects its layers; "Apply fix" applies
the selected warning's fix through the controller, after which the project is linted again.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.export.lint import LINT_KINDS, count_text

__all__ = ["LintPanel", "warning_text", "lint_or_offer_calibration"]

_WARNING_ROLE = Qt.ItemDataRole.UserRole


def warning_text(warning: Any) -> str:
    """A warning as the list shows it: what, where, and the fix on offer."""
    lines = [f"{LINT_KINDS.get(warning.kind, warning.kind)}: {', '.join(warning.modules)}", warning.message]
    if warning.fix is not None:
        lines.append(f"Fix: {warning.fix.description}")
    return "\n".join(lines)


class LintPanel(QWidget):
    """The last lint's warnings with a Lint button and an Apply fix button for the selected warning."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.state = controller.lint_state
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.lint_button = QPushButton("Lint for TensorRT")
        self.lint_button.setToolTip("Export a preview and check its Q/DQ placement against TensorRT's fusion rules "
                                    "(no GPU needed); the warnings also show as icons in the tree")
        self.lint_button.clicked.connect(lambda: self.state.run())
        self.calibrate_button = QPushButton("Calibrate, then lint")
        self.calibrate_button.clicked.connect(lambda: self.state.run(calibrate_first=True))
        self.fix_button = QPushButton("Apply fix")
        self.fix_button.setToolTip("Apply the selected warning's fix to the project, then lint again")
        self.fix_button.clicked.connect(self.apply_selected)
        self.warnings = QListWidget()
        self.warnings.setWordWrap(True)
        self.warnings.setAlternatingRowColors(True)
        self.warnings.itemClicked.connect(self._select)
        self.warnings.itemSelectionChanged.connect(self._update_buttons)
        self.warnings.itemDoubleClicked.connect(lambda _item: self.apply_selected())
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(self.lint_button)
        buttons.addWidget(self.calibrate_button)
        buttons.addWidget(self.fix_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.summary)
        layout.addWidget(self.warnings, 1)
        self.state.changed.connect(self.refresh)
        controller.busy_changed.connect(lambda _busy: self._update_buttons())
        controller.session_changed.connect(self._update_buttons)
        self.refresh()

    def refresh(self) -> None:
        state = self.state
        self.warnings.clear()
        for warning in state.warnings or ():
            item = QListWidgetItem(warning_text(warning))
            item.setData(_WARNING_ROLE, warning)
            item.setToolTip(f"ONNX nodes: {', '.join(warning.nodes)}" if warning.nodes else warning.kind)
            if state.stale:
                item.setForeground(Qt.GlobalColor.gray)
            self.warnings.addItem(item)
        if state.problem:
            text = state.problem
        elif state.warnings is None:
            text = ("Not linted yet. Lint predicts where TensorRT will not fuse the Q/DQ placement (standalone Scale "
                    "layers, residual adds, Concat scales, isolated INT8 layers, channel alignment) before you build.")
        elif not state.warnings:
            text = "No fusion warnings: the Q/DQ placement suits TensorRT."
        else:
            text = (f"{count_text(state.warnings)}: click one to select its layers; Apply fix (or the tree's "
                    "context menu) changes the project.")
        if state.stale and state.warnings is not None:
            text = "The project changed since this lint: Lint again for current warnings. " + text
        self.summary.setText(text)
        self._update_buttons()

    def selected_warning(self) -> Any:
        items = self.warnings.selectedItems()
        return items[0].data(_WARNING_ROLE) if items else None

    def apply_selected(self) -> list[str] | None:
        warning = self.selected_warning()
        if warning is None or warning.fix is None:
            return None
        return self.state.apply(warning.fix)

    def _update_buttons(self) -> None:
        idle = self.controller.session is not None and not self.controller.busy
        self.lint_button.setEnabled(idle)
        self.calibrate_button.setVisible(self.state.needs_calibration)
        self.calibrate_button.setEnabled(idle)
        warning = self.selected_warning()
        self.fix_button.setEnabled(idle and warning is not None and warning.fix is not None)

    def _select(self, item: QListWidgetItem) -> None:
        warning = item.data(_WARNING_ROLE)
        session = self.controller.session
        layers = [m for m in warning.modules if session is not None and m in session.project.layers]
        self.controller.select(layers or list(warning.modules))


def lint_or_offer_calibration(parent: QWidget, controller: Controller) -> bool:
    """Project ▸ Lint for TensorRT: lint now, or (not calibrated yet) offer to calibrate first and lint after."""
    state = controller.lint_state
    problem = state.calibration_problem()
    if problem:
        answer = QMessageBox.question(
            parent, "Lint for TensorRT", problem + "\n\nCalibrate now with the project's settings and lint "
            "afterwards?", QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.Yes)
        return state.run(calibrate_first=answer == QMessageBox.StandardButton.Yes)
    return state.run()
