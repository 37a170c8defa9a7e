"""What TensorRT did with the model, in the GUI: the tree's Engine column and the hazards list.

The TensorRT tab has two halves: before building, the fusion lint (:mod:`workbench.app.lint_view`);
after building, the imported engine report.

The engine report comes from the session (``controller.engine_report()``); importing one is the
"Import TensorRT report…" action of the main window. Clicking a hazard selects its layers, so the tree,
the layer panel and the sensitivity view show them.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QGroupBox,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSplitter,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.formatting import count_text
from workbench.app.lint_view import LintPanel
from workbench.engine import HAZARD_KINDS

__all__ = ["PRECISION_COLOURS", "NOT_IN_ENGINE", "engine_cell", "TimeBarDelegate", "EnginePanel"]

NOT_IN_ENGINE = "not in engine"
# by workbench.engine.PRECISIONS: INT8 green, half precisions amber, FP32 red, absent grey
PRECISION_COLOURS = {
    "INT8": QColor("#c8e6c9"), "FP8": QColor("#dcedc8"), "FP16": QColor("#ffe0b2"), "BF16": QColor("#ffe0b2"),
    "FP32": QColor("#ffcdd2"), NOT_IN_ENGINE: QColor("#e0e0e0"),
}
_BAR_COLOUR = QColor(70, 110, 200, 110)


def engine_cell(outcome: Any) -> tuple[str, QColor | None]:
    """The Engine column's text and colour for a :class:`workbench.engine.ModuleOutcome`."""
    if not outcome.in_engine:
        return (NOT_IN_ENGINE, PRECISION_COLOURS[NOT_IN_ENGINE]) if outcome.quantized is not None else ("", None)
    precision = outcome.engine_precision or "?"
    text = precision if outcome.time_ms is None else f"{precision} {outcome.time_ms:.3f} ms"
    note = outcome.precision_note  # an INT8 layer reading or writing float says which
    return (f"{text} [{note}]" if note else text), PRECISION_COLOURS.get(precision)


class TimeBarDelegate(QStyledItemDelegate):
    """Draws the engine layer's time as a bar under the cell's text (``share_role``: 0..1 of the slowest)."""

    def __init__(self, share_role: int, parent: Any = None) -> None:
        super().__init__(parent)
        self.share_role = share_role

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        super().paint(painter, option, index)
        share = index.data(self.share_role)
        if share:
            rect = option.rect
            bar = QRect(rect.left() + 1, rect.bottom() - 3, max(1, int((rect.width() - 2) * min(share, 1.0))), 3)
            painter.fillRect(bar, _BAR_COLOUR)


class EnginePanel(QWidget):
    """The fusion lint's warnings (before building) above the latest engine report's summary and hazards
    (after building); clicking a warning or a hazard selects its layers."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.summary = QLabel("No TensorRT report imported. Project ▸ Import TensorRT Report… reads what "
                              "`trtexec --exportLayerInfo=… --profilingVerbosity=detailed --exportProfile=…` wrote.")
        self.summary.setWordWrap(True)
        self.hazards = QListWidget()
        self.hazards.setWordWrap(True)
        self.hazards.itemClicked.connect(self._select)
        self.lint = LintPanel(controller)
        lint_box = QGroupBox("Before building: fusion lint")
        QVBoxLayout(lint_box).addWidget(self.lint)
        engine_box = QGroupBox("After building: the engine's report")
        engine_layout = QVBoxLayout(engine_box)
        engine_layout.addWidget(self.summary)
        engine_layout.addWidget(self.hazards, 1)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(lint_box)
        splitter.addWidget(engine_box)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)
        controller.engine_changed.connect(self.refresh)
        controller.session_changed.connect(self.refresh)

    def refresh(self) -> None:
        self.hazards.clear()
        report = self.controller.engine_report()
        if report is None:
            self.summary.setText("No TensorRT report imported.")
            return
        counts = ", ".join(f"{n} {k}" for k, n in report.precision_counts().items())
        time = f", {report.total_time_ms:.3f} ms per run" if report.total_time_ms is not None else ""
        costs = "".join(("\n    – " + line.strip()) if line.startswith(" ") else f"\n• {line}"
                        for line in report.cost_lines())
        self.summary.setText(f"{report.source}: {report.engine_layers} engine layers{time}. "
                             f"{report.mapping_text()} Layers: {counts}.{costs}\n"
                             + count_text(len(report.hazards), 'hazard')
                             + (": click one to select its layers." if report.hazards else "."))
        self.summary.setToolTip("\n".join(f"{name}: {why}" for name, why in report.unmapped_why.items()))
        for hazard in report.hazards:
            item = QListWidgetItem(f"{HAZARD_KINDS.get(hazard.kind, hazard.kind)}: {', '.join(hazard.modules)}\n"
                                   f"{hazard.advice}")
            item.setData(Qt.ItemDataRole.UserRole, list(hazard.modules))
            item.setToolTip(f"engine layer: {hazard.engine_layer}")
            self.hazards.addItem(item)

    def _select(self, item: QListWidgetItem) -> None:
        modules = item.data(Qt.ItemDataRole.UserRole) or []
        session = self.controller.session
        layers = [m for m in modules if session is not None and m in session.project.layers]
        self.controller.select(layers or modules)
