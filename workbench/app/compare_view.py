"""The GUI compare view: what changed between another project file and the open project.

The differences are :func:`workbench.project.diff.diff_projects`'s (the same as ``workbench diff``);
this module only arranges them: a per-layer table (decision, descriptor changes, the largest relative
amax change of the layer's quantizers, the sensitivity rank), and one table per section of the diff.
Clicking a row that names a layer selects it in the tree (through ``on_select``).
"""
from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from workbench.export.naming import layer_of_quantizer
from workbench.project import PROJECT_SUFFIX
from workbench.project.diff import AmaxChange, Change, Comparison, show_value

__all__ = ["CompareDialog", "LayerRow", "layer_rows", "LAYER_ROLE",
           "choose_and_compare"]

LAYER_ROLE = Qt.ItemDataRole.UserRole + 1  # the layer a table row stands for (None: not a layer)
_SORT_ROLE = Qt.ItemDataRole.UserRole + 2


def _relative(change: AmaxChange) -> str:
    if change.relative is None:
        return "new" if change.a is None else "gone"
    return f"{change.relative:+.1%}"


class _Layers:
    """Maps names the diff uses (``layer.field``, quantizer names, sensitivity units) to layers."""

    def __init__(self, layers: Sequence[str]) -> None:
        self.names = list(layers)
        self._known = set(layers)
        # longest first: "block.conv1" must win over "block" for "block.conv1.input.num_bits"
        self._by_length = sorted(self.names, key=len, reverse=True)

    def owner(self, where: str) -> str | None:
        """The layer a ``layer.field`` entry belongs to."""
        return next((name for name in self._by_length if where.startswith(name + ".")), None)

    def of_quantizer(self, quantizer: str) -> str | None:
        layer = layer_of_quantizer(quantizer)[0]
        return layer if layer in self._known else None

    def in_unit(self, unit: str) -> list[str]:
        """The layers a sensitivity unit stands for: the layer itself, or those inside the block."""
        if unit in self._known:
            return [unit]
        return [name for name in self.names if name.startswith(unit + ".")]


@dataclass
class LayerRow:
    """One layer's changes, gathered from the diff's sections."""

    layer: str
    status: str = ""                       # "added", "removed" or ""
    decision: str = ""                     # "True -> False"
    descriptors: list[str] = field(default_factory=list)
    amax: float | None = None              # the largest |relative| amax change of its quantizers
    amax_text: str = ""
    rank: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.status or self.decision or self.descriptors or self.amax_text or self.rank)


def layer_rows(comparison: Comparison) -> list[LayerRow]:
    """Every layer of both projects with what the diff says about it (in model order)."""
    diff, lookup = comparison.diff, _Layers(comparison.layers)
    rows = {name: LayerRow(name) for name in comparison.layers}
    for name in diff.layers_added:
        rows[name].status = "added"
    for name in diff.layers_removed:
        rows[name].status = "removed"
    for change in diff.layers:
        owner = lookup.owner(change.where)
        if owner is None:
            continue
        what = change.where[len(owner) + 1:]
        if what == "quantize":
            rows[owner].decision = f"{show_value(change.a)} -> {show_value(change.b)}"
        else:
            rows[owner].descriptors.append(f"{what}: {show_value(change.a)} -> {show_value(change.b)}")
    for change in diff.amax:
        owner = lookup.of_quantizer(change.quantizer)
        if owner is None:
            continue
        row = rows[owner]
        size = abs(change.relative) if change.relative is not None else float("inf")
        if row.amax is None or size > row.amax:
            row.amax, row.amax_text = size, _relative(change)
    for rank in diff.sensitivity:
        for owner in lookup.in_unit(rank.unit):
            rows[owner].rank = f"{show_value(rank.a)} -> {show_value(rank.b)}"
    return list(rows.values())


class _Item(QTableWidgetItem):
    """A cell that sorts by its number (amax changes, ranks) when it has one."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(_SORT_ROLE), other.data(_SORT_ROLE)
        if mine is not None and theirs is not None:
            return mine < theirs
        if mine is not None or theirs is not None:
            return theirs is None  # numbers before blanks
        return self.text() < other.text()


def _table(headers: Sequence[str], rows: Iterable[tuple[str | None, Sequence[Any]]]) -> QTableWidget:
    """A read-only sortable table; each row is (its layer or None, its cells); a cell is text or (text, number)."""
    rows = list(rows)
    table = QTableWidget(len(rows), len(headers))
    table.setHorizontalHeaderLabels(list(headers))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.verticalHeader().setVisible(False)
    table.setWordWrap(False)
    for r, (layer, cells) in enumerate(rows):
        for c, cell in enumerate(cells):
            text, number = cell if isinstance(cell, tuple) else (cell, None)
            item = _Item(text)
            item.setToolTip(text)
            item.setData(LAYER_ROLE, layer)
            if number is not None:
                item.setData(_SORT_ROLE, float(number))
            table.setItem(r, c, item)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    header.setStretchLastSection(True)
    table.resizeColumnsToContents()
    header.setSortIndicator(-1, Qt.SortOrder.AscendingOrder)  # the diff's own order until a header is clicked
    table.setSortingEnabled(True)
    return table


def _change_rows(changes: Sequence[Change], lookup: _Layers | None = None) -> list[tuple[str | None, list[Any]]]:
    return [(lookup.owner(c.where) if lookup is not None else None, [c.where, show_value(c.a), show_value(c.b)])
            for c in changes]


class CompareDialog(QDialog):
    """The differences between two projects, by section; non-modal, so the tree stays usable beside it."""

    def __init__(self, comparison: Comparison, on_select: Callable[[list[str]], None] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.comparison = comparison
        self._on_select = on_select
        diff = comparison.diff
        lookup = _Layers(comparison.layers)
        self.setWindowTitle(f"Compare {diff.a} with {diff.b}")
        self.resize(980, 620)

        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter rows by name…")
        self.filter_edit.setClearButtonEnabled(True)
        self.only_changed = QCheckBox("Only changed layers")
        self.only_changed.setChecked(True)
        self.only_changed.setToolTip("Hide the layers the two projects treat alike")

        self.rows = layer_rows(comparison)
        self.layers_table = _table(
            ["Layer", "Added/removed", "Quantize", "Descriptors", "amax (relative)", "Sensitivity rank"],
            [(row.layer if row.status != "removed" else None,
              [row.layer, row.status, row.decision, "; ".join(row.descriptors),
               (row.amax_text, row.amax) if row.amax_text else "", row.rank]) for row in self.rows])
        self.settings_table = _table(["Setting", diff.a, diff.b],
                                     _change_rows(diff.settings) + _change_rows(diff.calibration))
        self.amax_table = _table(
            ["Quantizer", diff.a, diff.b, "Relative change"],
            [(lookup.of_quantizer(c.quantizer),
              [c.quantizer, show_value(c.a), show_value(c.b),
               (_relative(c), abs(c.relative) if c.relative is not None else float("inf"))]) for c in diff.amax])
        self.sensitivity_table = _table(
            ["Unit", f"rank in {diff.a}", f"rank in {diff.b}"],
            [(next(iter(lookup.in_unit(r.unit)), None),
              [r.unit, (show_value(r.a), r.a), (show_value(r.b), r.b)]) for r in diff.sensitivity])
        self.reports_table = _table(["Report field", diff.a, diff.b],
                                    [(None, [f"export: {c.where}", show_value(c.a), show_value(c.b)])
                                     for c in diff.export]
                                    + [(None, [f"engine: {c.where}", show_value(c.a), show_value(c.b)])
                                       for c in diff.engine])
        self.tables = {"Layers": self.layers_table, "Settings": self.settings_table, "amax": self.amax_table,
                       "Sensitivity": self.sensitivity_table, "Export and engine reports": self.reports_table}
        self.tabs = QTabWidget()
        for title, table in self.tables.items():
            count = table.rowCount() if table is not self.layers_table else sum(r.changed for r in self.rows)
            self.tabs.addTab(table, f"{title} ({count})")
            table.itemSelectionChanged.connect(lambda t=table: self._row_selected(t))
        self.amax_table.sortItems(3, Qt.SortOrder.DescendingOrder)  # the largest change (either way) first

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        top = QHBoxLayout()
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.only_changed)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addLayout(top)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(buttons)
        self.filter_edit.textChanged.connect(lambda _text: self.apply_filter())
        self.only_changed.toggled.connect(lambda _on: self.apply_filter())
        self._set_summary()
        self.apply_filter()

    def _set_summary(self) -> None:
        diff = self.comparison.diff
        title = f"<b>{html.escape(diff.a)}</b> → <b>{html.escape(diff.b)}</b>"
        if diff.empty:
            self.summary.setText(f"{title}: no differences.")
            return
        parts = [f"{n} {what}" for n, what in (
            (len(diff.settings) + len(diff.calibration), "settings"),
            (sum(r.changed for r in self.rows), "layers"), (len(diff.amax), "amax values"),
            (len(diff.sensitivity), "sensitivity ranks"), (len(diff.export) + len(diff.engine), "report fields")) if n]
        self.summary.setText(f"{title}: {', '.join(parts)} differ. Click a layer's row to select it in the tree.")

    def apply_filter(self) -> None:
        """Hide rows whose first cell does not contain the filter text (and unchanged layers when asked)."""
        text = self.filter_edit.text().strip().lower()
        changed = {row.layer: row.changed for row in self.rows}
        for table in self.tables.values():
            for r in range(table.rowCount()):
                name = table.item(r, 0).text()
                hidden = bool(text) and text not in name.lower()
                if table is self.layers_table and self.only_changed.isChecked():
                    hidden = hidden or not changed.get(name, False)
                table.setRowHidden(r, hidden)

    def visible_rows(self, table: QTableWidget) -> list[list[str]]:
        """The shown rows' texts, top to bottom (what a user reads)."""
        return [[table.item(r, c).text() for c in range(table.columnCount())]
                for r in range(table.rowCount()) if not table.isRowHidden(r)]

    def _row_selected(self, table: QTableWidget) -> None:
        items = table.selectedItems()
        layer = items[0].data(LAYER_ROLE) if items else None
        if layer and self._on_select is not None:
            self._on_select([layer])


def choose_and_compare(parent: QWidget, controller: Any, path: str | Path | None = None,
                       on_shown: Callable[[CompareDialog], None] | None = None) -> bool:
    """File ▸ Compare with Project…: pick a project file (unless ``path``), diff it against the open project in
    the background, then show the differences; clicking a layer's row selects it in the tree. A file that is no
    project (or from a newer version) is the controller's error dialog."""
    session = controller.session
    if session is None:
        return False
    if path is None:
        folder = str(session.path.parent if session.path is not None else session.base_dir)
        path, _ = QFileDialog.getOpenFileName(parent, "Compare with project", folder,
                                              f"Quant Workbench projects (*{PROJECT_SUFFIX});;All files (*)")
        if not path:
            return False

    def show(comparison: Comparison) -> None:
        dialog = CompareDialog(comparison, controller.select, parent)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        if on_shown is not None:
            on_shown(dialog)

    return controller.compare_with(path, show)
