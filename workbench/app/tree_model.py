"""The model tree's data: a flat-array ``QAbstractItemModel`` over the session's module tree, and its filter.

Why flat arrays: a model with 10,000 modules must open and scroll without a stall. The session's
:class:`~workbench.graph.ModelTree` lists modules in pre-order, so one pass builds parallel lists
(parent, children, row, one display string per column) and every subtree is a contiguous range
``[node, end[node])``. ``data()`` is then a couple of list look-ups, the tri-state of every container
comes from two prefix sums (quantized layers and layers in the range), and a subtree's layers are a
slice. A node's id is its pre-order position, stored in the index's ``internalId``.

Edits never touch the arrays directly: a check box calls ``controller.set_quantize`` for the whole
subtree; the controller announces ``layers_changed`` and the model re-reads the session's rows,
emitting ``dataChanged`` only for the rows that differ. The view around it is
:mod:`workbench.app.tree_widget`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QFont, QIcon
from PySide6.QtWidgets import QApplication, QStyle

from workbench.app.controller import Controller
from workbench.app.engine_panel import engine_cell
from workbench.graph import ModelTree
from workbench.session import LayerView

__all__ = ["ModuleTreeModel", "LayerFilterProxy", "COLUMNS", "PRECISION"]

COLUMNS = ("Name", "Type", "Quantize", "Precision", "Input", "Weight", "amax", "Rank", "Engine")
NAME, TYPE, QUANT, PRECISION, INPUT, WEIGHT, AMAX, RANK, ENGINE = range(len(COLUMNS))
_COLUMN_COUNT = len(COLUMNS)
COLUMN_WIDTHS = (140, 170, 74, 70, 178, 150, 56, 44, 110)  # the Engine column shows after an engine report
NAME_ROLE = Qt.ItemDataRole.UserRole + 1     # the qualified module name
NODE_ROLE = Qt.ItemDataRole.UserRole + 2     # the node id (pre-order position)
ENGINE_SHARE_ROLE = Qt.ItemDataRole.UserRole + 3  # the engine layer's time over the slowest one's (0..1)
EXPAND_ALL_MATCHES = 500  # a filter with more matches opens only the top levels (expanding is what costs)
_NO_PARENT = QModelIndex()  # Qt's invisible root (a default argument, made once)
_ROOT = -1  # the invisible root's id (the model itself is node 0, shown as the one top-level row)

_CHECKED, _UNCHECKED, _PARTIAL = Qt.CheckState.Checked, Qt.CheckState.Unchecked, Qt.CheckState.PartiallyChecked


def _check_value(value: Any) -> Qt.CheckState:
    """PySide6 hands check states to setData as an enum or as a plain int, depending on the caller."""
    if isinstance(value, Qt.CheckState):
        return value
    return Qt.CheckState(int(value))


class ModuleTreeModel(QAbstractItemModel):
    """Rows are modules (the model itself on top); columns are :data:`COLUMNS`.

    Only quantizable layers and containers holding some are checkable; a container's check state
    and its "Quantize" text (``quantized/total``) are computed from its descendants.
    """

    refreshed = Signal()  # the rows were re-read (after a reset or an update)

    def __init__(self, controller: Controller | None = None, parent: Any = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._read_only = False
        self._clear()

    # ----- building -----------------------------------------------------------------------------

    def _clear(self) -> None:
        self._names: list[str] = []
        self._parent: list[int] = []
        self._children: list[list[int]] = [[]]  # index 0 here is the invisible root's list (shifted by one)
        self._row: list[int] = []
        self._end: np.ndarray = np.zeros(0, dtype=np.int64)
        self._is_layer: np.ndarray = np.zeros(0, dtype=bool)
        self._quantized: np.ndarray = np.zeros(0, dtype=bool)
        self._text: list[list[str]] = [[] for _ in COLUMNS]
        self._check: list[Qt.CheckState | None] = []
        self._float: list[bool] = []
        self._node_of: dict[str, int] = {}
        self._types: list[str] = []       # the module types from the tree
        self._shown_types: list[str] = []  # the same, with layers' quantized types (the type filter's values)
        self._notes: list[str] = []       # what a transformation did to the module ("folded bn1")
        self._engine_colour: list[QColor | None] = []  # by the precision TensorRT ran the module in
        self._engine_share: list[float | None] = []
        self._lint: list[str] = []  # the fusion lint's warnings naming the module, as its tooltip shows them
        self._lint_icon: list[QIcon | None] = []
        self._lint_stale = False

    def set_views(self, tree: ModelTree | None, layers: Sequence[LayerView]) -> None:
        """Show ``tree`` with ``layers``' rows; a different module list resets the model, else rows update."""
        rows = _rows(tree, layers)
        notes = {m.name: ", ".join(m.notes) for m in tree.modules if m.notes} if tree is not None else {}
        if [name for name, _, _, _ in rows] != self._names:
            self.beginResetModel()
            self._build(rows, layers, notes)
            self.endResetModel()
        else:
            # same modules, but a type may have changed (a BatchNorm folded into an Identity)
            self._types = [type_name for _, type_name, _, _ in rows]
            self._notes = [notes.get(name, "") for name in self._names]
            self._update(layers)
        self.refreshed.emit()

    def set_engine(self, report: Any) -> None:
        """Show an imported engine report (:class:`workbench.engine.EngineReport`, None: none) in the Engine
        column: the precision each module ran in, coloured, and its engine layer's time."""
        count = len(self._names)
        text, colours, shares = [""] * count, [None] * count, [None] * count
        if report is not None and count:
            slowest = max((o.time_ms for o in report.layers if o.time_ms), default=0.0)
            for outcome in report.layers:
                i = self._node_of.get(outcome.module)
                if i is None:
                    continue
                text[i], colours[i] = engine_cell(outcome)
                if outcome.time_ms is not None and slowest > 0:
                    shares[i] = outcome.time_ms / slowest
        changed = [i for i in range(count) if self._text[ENGINE][i] != text[i] or self._engine_share[i] != shares[i]]
        self._text[ENGINE], self._engine_colour, self._engine_share = text, colours, shares
        self._emit_changed(changed)

    def set_lint(self, by_module: dict[str, list[Any]], stale: bool = False) -> None:
        """Show the fusion lint's warnings (:class:`workbench.export.lint.LintWarning` by module) as a warning
        icon on the module's name with the messages as its tooltip; ``stale`` greys the icons (the project
        changed since the lint)."""
        count = len(self._names)
        texts: list[str] = [""] * count
        icons: list[QIcon | None] = [None] * count
        for module, warnings in by_module.items():
            i = self._node_of.get(module)
            if i is None or not warnings:
                continue
            lines = [f"{'⚠' if w.severity == 'warning' else 'ℹ'} {w.message}"
                     + (f"\n    fix: {w.fix.description}" if w.fix is not None else "") for w in warnings]
            if stale:
                lines.insert(0, "(from before the last change: lint again)")
            texts[i] = "\n".join(lines)
            icons[i] = _lint_icon(any(w.severity == "warning" for w in warnings), stale)
        restyled = stale != self._lint_stale  # the same warnings, greyed or not: their rows repaint
        changed = [i for i in range(count) if self._lint[i] != texts[i] or (restyled and texts[i])]
        self._lint, self._lint_icon, self._lint_stale = texts, icons, stale
        self._emit_changed(changed)

    def lint_text(self, name: str) -> str:
        """The lint warnings shown on ``name``'s row ("" for none)."""
        node = self._node_of.get(name)
        return self._lint[node] if node is not None else ""

    def lint_icon(self, name: str) -> QIcon | None:
        node = self._node_of.get(name)
        return self._lint_icon[node] if node is not None else None

    def _build(self, rows: list[tuple[str, str, str | None, int]], layers: Sequence[LayerView],
               notes: dict[str, str]) -> None:
        self._clear()
        if not rows:
            return
        count = len(rows)
        self._names = [name for name, _, _, _ in rows]
        self._node_of = {name: i for i, name in enumerate(self._names)}
        self._types = [type_name for _, type_name, _, _ in rows]
        self._notes = [notes.get(name, "") for name in self._names]
        parent = [_ROOT] * count
        children: list[list[int]] = [[] for _ in range(count + 1)]  # children[p + 1] for parent p
        row = [0] * count
        node_of = self._node_of
        for i, (_name, _type, parent_name, _depth) in enumerate(rows):
            p = _ROOT if parent_name is None else node_of[parent_name]
            parent[i] = p
            siblings = children[p + 1]
            row[i] = len(siblings)
            siblings.append(i)
        # subtree end in pre-order: the next node whose depth is not greater (one pass with a stack)
        end = np.empty(count, dtype=np.int64)
        depth = [d for _, _, _, d in rows]
        stack: list[int] = []
        for i in range(count):
            while stack and depth[stack[-1]] >= depth[i]:
                end[stack.pop()] = i
            stack.append(i)
        for i in stack:
            end[i] = count
        self._parent, self._children, self._row, self._end = parent, children, row, end
        labels = [name.rsplit(".", 1)[-1] if name else type_name for name, type_name, _, _ in rows]
        self._text = [labels, list(self._types)] + [[""] * count for _ in COLUMNS[2:]]
        self._is_layer = np.zeros(count, dtype=bool)
        self._quantized = np.zeros(count, dtype=bool)
        self._check = [None] * count
        self._float = [False] * count
        self._engine_colour, self._engine_share = [None] * count, [None] * count
        self._lint, self._lint_icon = [""] * count, [None] * count
        self._amax_tip = [""] * count  # how the amax method was chosen ("auto"), and calibration warnings
        self._update(layers, emit=False)

    def _update(self, layers: Sequence[LayerView], emit: bool = True) -> None:
        count = len(self._names)
        if count == 0:
            return
        is_layer = np.zeros(count, dtype=bool)
        quantized = np.zeros(count, dtype=bool)
        columns = {c: [""] * count for c in (QUANT, PRECISION, INPUT, WEIGHT, AMAX, RANK)}
        types = list(self._types)
        is_float = [False] * count
        amax_tips = [""] * count
        node_of = self._node_of
        for layer in layers:
            i = node_of.get(layer.name)
            if i is None:
                continue
            is_layer[i] = True
            quantized[i] = layer.quantize
            is_float[i] = not layer.quantize
            types[i] = layer.type
            columns[PRECISION][i] = layer.precision
            columns[INPUT][i] = layer.input_summary
            columns[WEIGHT][i] = layer.weight_summary
            columns[AMAX][i] = layer.amax_summary
            tip = "\n".join(([f"auto picked {layer.amax_reason}"] if layer.amax_reason else [])
                             + [f"warning: {w}" for w in layer.warnings])
            amax_tips[i] = f"amax {layer.amax_summary}\n{tip}" if tip else ""
            columns[RANK][i] = "" if layer.sensitivity_rank is None else str(layer.sensitivity_rank)
        # subtree counts from prefix sums over the pre-order: O(n) in numpy, no per-node Python loop
        layer_prefix = np.concatenate(([0], np.cumsum(is_layer)))
        quant_prefix = np.concatenate(([0], np.cumsum(quantized)))
        starts = np.arange(count)
        total = layer_prefix[self._end] - layer_prefix[starts]
        on = quant_prefix[self._end] - quant_prefix[starts]
        check: list[Qt.CheckState | None] = [None] * count
        quant_text = columns[QUANT]
        for i in np.flatnonzero(total).tolist():
            t, q = int(total[i]), int(on[i])
            check[i] = _CHECKED if q == t else _UNCHECKED if q == 0 else _PARTIAL
            if not is_layer[i] or t > 1:
                quant_text[i] = f"{q}/{t}"
        # containers show the best (lowest) sensitivity rank inside them
        ranks = columns[RANK]
        best: dict[int, int] = {}
        for i in np.flatnonzero(is_layer).tolist():
            if not ranks[i]:
                continue
            rank, p = int(ranks[i]), self._parent[i]
            while p != _ROOT:
                if not is_layer[p]:
                    if best.get(p, rank + 1) <= rank:
                        break  # this ancestor (and every one above it) already shows a better rank
                    best[p] = rank
                p = self._parent[p]
        for p, rank in best.items():
            ranks[p] = f"{rank}"
        old_rows = None
        if emit:
            shown = (QUANT, PRECISION, INPUT, WEIGHT, AMAX, RANK)
            old_rows = list(zip(self._check, types, *[self._text[c] for c in shown],
                                self._float))
        self._is_layer, self._quantized, self._check, self._float = is_layer, quantized, check, is_float
        self._amax_tip = amax_tips
        self._shown_types = types
        self._text[TYPE] = [f"{t} ({note})" if note else t for t, note in zip(types, self._notes)]
        types = self._text[TYPE]
        for c, values in columns.items():
            self._text[c] = values
        if emit and old_rows is not None:
            new_rows = zip(check, types, *[columns[c] for c in (QUANT, PRECISION, INPUT, WEIGHT, AMAX, RANK)], is_float)
            changed = [i for i, (old, new) in enumerate(zip(old_rows, new_rows)) if old != new]
            self._emit_changed(changed)

    def _emit_changed(self, nodes: Iterable[int]) -> None:
        """One dataChanged per parent (spanning the changed rows), not one per row."""
        spans: dict[int, list[int]] = {}
        for i in nodes:
            r = self._row[i]
            span = spans.setdefault(self._parent[i], [r, r])
            span[0], span[1] = min(span[0], r), max(span[1], r)
        last = len(COLUMNS) - 1
        for p, (first, final) in spans.items():
            parent = QModelIndex() if p == _ROOT else self.createIndex(self._row[p], 0, p)
            self.dataChanged.emit(self.index(first, 0, parent), self.index(final, last, parent))

    # ----- queries (for the view, the filter and tests) ------------------------------------------

    def node_count(self) -> int:
        return len(self._names)

    def column_texts(self, column: int) -> list[str]:
        """What every row shows in ``column`` (for sizing the column to its content)."""
        return list(self._text[column]) if self._names else []

    def depths(self) -> list[int]:
        """Each node's depth (the model itself: 0), in pre-order."""
        depths: list[int] = []
        for p in self._parent:
            depths.append(0 if p == _ROOT else depths[p] + 1)
        return depths

    def is_layer_font(self, node: int) -> bool:
        """Whether the Name cell of ``node`` is drawn bold (a quantizable layer)."""
        return bool(self._is_layer[node])

    def name_of(self, node: int) -> str:
        return self._names[node]

    def node_of(self, name: str) -> int | None:
        return self._node_of.get(name)

    def parent_of(self, node: int) -> int:
        return self._parent[node]

    def index_of(self, name: str, column: int = 0) -> QModelIndex:
        node = self._node_of.get(name)
        if node is None:
            return QModelIndex()
        return self.createIndex(self._row[node], column, node)

    def is_layer(self, node: int) -> bool:
        return bool(self._is_layer[node])

    def type_of(self, node: int) -> str:
        """The type name of ``node`` (without notes such as "folded bn1")."""
        return self._shown_types[node]

    def types(self) -> list[str]:
        """The distinct type names shown (for the type filter)."""
        return sorted(set(self._shown_types))

    def names(self) -> list[str]:
        return list(self._names)

    def subtree_layers(self, node: int) -> list[str]:
        """Quantizable layers in the subtree of ``node`` (itself included), in model order."""
        start, stop = node, int(self._end[node])
        return [self._names[i] for i in (start + np.flatnonzero(self._is_layer[start:stop])).tolist()]

    def check_state(self, name: str) -> Qt.CheckState | None:
        node = self._node_of.get(name)
        return None if node is None else self._check[node]

    def text(self, name: str, column: int) -> str:
        node = self._node_of.get(name)
        return "" if node is None else self._text[column][node]

    def set_read_only(self, read_only: bool) -> None:
        """While a job runs, check boxes do not react (the session is busy)."""
        if read_only != self._read_only:
            self._read_only = read_only
            count = len(self._children[0])
            if count:
                self.dataChanged.emit(self.index(0, QUANT), self.index(count - 1, QUANT))

    # ----- QAbstractItemModel --------------------------------------------------------------------

    def index(self, row: int, column: int, parent: QModelIndex | QPersistentModelIndex = _NO_PARENT) -> QModelIndex:
        # the hottest method of the model (the filter and the view call it for every row they map)
        siblings = self._children[parent.internalId() + 1 if parent.isValid() else 0]
        if 0 <= row < len(siblings) and 0 <= column < _COLUMN_COUNT:
            return self.createIndex(row, column, siblings[row])
        return QModelIndex()

    def parent(self, index: QModelIndex | QPersistentModelIndex = _NO_PARENT) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        p = self._parent[index.internalId()]
        if p == _ROOT:
            return QModelIndex()
        return self.createIndex(self._row[p], 0, p)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = _NO_PARENT) -> int:
        if parent.isValid():
            if parent.column() != 0:
                return 0
            return len(self._children[parent.internalId() + 1])
        return len(self._children[0])

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = _NO_PARENT) -> int:
        return len(COLUMNS)

    def hasChildren(self, parent: QModelIndex | QPersistentModelIndex = _NO_PARENT) -> bool:
        return self.rowCount(parent) > 0

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        node, column = index.internalId(), index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text[column][node]
        if role == Qt.ItemDataRole.CheckStateRole:
            return self._check[node] if column == QUANT else None
        if role == Qt.ItemDataRole.ForegroundRole:
            return _FLOAT_BRUSH if self._float[node] else None
        if role == Qt.ItemDataRole.BackgroundRole:
            return self._engine_colour[node] if column == ENGINE else None
        if role == ENGINE_SHARE_ROLE:
            return self._engine_share[node]
        if role == Qt.ItemDataRole.DecorationRole:
            return self._lint_icon[node] if column == NAME else None
        if role == Qt.ItemDataRole.ToolTipRole:
            if column == NAME:
                name = self._names[node] or "(the model)"
                return f"{name}\n\nTensorRT lint:\n{self._lint[node]}" if self._lint[node] else name
            if column == AMAX and self._amax_tip[node]:
                return self._amax_tip[node]
            return self._text[column][node] or None
        if role == Qt.ItemDataRole.FontRole:
            return _LAYER_FONT if column == NAME and self._is_layer[node] else None
        if role == NAME_ROLE:
            return self._names[node]
        if role == NODE_ROLE:
            return node
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.column() == QUANT and self._check[index.internalId()] is not None and not self._read_only:
            flags |= Qt.ItemFlag.ItemIsUserCheckable
        if index.column() == PRECISION and self._is_layer[index.internalId()] and not self._read_only:
            flags |= Qt.ItemFlag.ItemIsEditable  # a combo of the precisions (workbench.app.precision_menu)
        return flags

    def setData(self, index: QModelIndex | QPersistentModelIndex, value: Any,
                role: int = Qt.ItemDataRole.EditRole) -> bool:
        """Ticking a row quantizes every layer of its subtree; unticking leaves them all in float. The Precision
        cell of a layer takes a precision's value (``int8``...): the layer runs in it."""
        if (role == Qt.ItemDataRole.EditRole and index.isValid() and index.column() == PRECISION
                and self._controller is not None and not self._read_only and self._is_layer[index.internalId()]):
            if str(value) == self._text[PRECISION][index.internalId()]:
                return False
            return self._controller.set_precision([self._names[index.internalId()]], str(value)) is not None
        if (role != Qt.ItemDataRole.CheckStateRole or not index.isValid() or self._controller is None
                or self._read_only):
            return False
        node = index.internalId()
        if self._check[node] is None:
            return False
        names = self.subtree_layers(node)
        return self._controller.set_quantize(names, _check_value(value) == _CHECKED) is not None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal:
            if role == Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return _HEADER_TIPS[section]
        return None


def _rows(tree: ModelTree | None, layers: Sequence[LayerView]) -> list[tuple[str, str, str | None, int]]:
    """(name, type, parent, depth) in pre-order: the tree's modules plus layers the quantized model lacks.

    A functional layer left in float (an fx-inserted add) has no module in the quantized model, yet it
    keeps its decision and must stay in the tree so that it can be ticked again: it is added as the
    last child of its parent.
    """
    if tree is None or not tree.modules:
        return []
    extra: dict[str, list[LayerView]] = {}
    for layer in layers:
        if layer.name not in tree:
            parent = layer.name.rpartition(".")[0]
            while parent and parent not in tree:
                parent = parent.rpartition(".")[0]
            extra.setdefault(parent, []).append(layer)
    if not extra:
        return [(m.name, m.display_type, m.parent, m.depth) for m in tree.modules]
    rows: list[tuple[str, str, str | None, int]] = []
    by_name = tree.by_name
    stack: list[tuple[str, str, str | None, int, bool]] = [(tree.root.name, tree.root.display_type, None, 0, True)]
    while stack:
        name, type_name, parent, depth, is_module = stack.pop()
        rows.append((name, type_name, parent, depth))
        if not is_module:
            continue
        pending = [(c, by_name[c].display_type, name, depth + 1, True) for c in by_name[name].children]
        pending += [(layer.name, getattr(layer, "display_type", layer.type), name, depth + 1, False)
                    for layer in extra.get(name, [])]
        stack.extend(reversed(pending))
    return rows


_HEADER_TIPS = (
    "Module name (the model itself on top)",
    "Module type (the float type for quantizable layers)",
    "Quantize the layer (ticked) or leave it in float; containers: quantized layers / layers inside",
    "The precision the layer runs in (int8, fp8, int4w weight-only, nvfp4, float; custom: descriptors matching none): "
    "double-click to change it, or choose one for many layers from the context menu",
    "Input quantizer: bits, per-tensor or per-channel, calibrator/method",
    "Weight quantizer: bits, per-tensor or per-channel, calibrator",
    "Calibrated input amax (range) of the layer",
    "Sensitivity rank from the latest analysis (1 = hurts most when quantized)",
    "What TensorRT ran the module in (imported engine report): INT8, FP16, FP32 or not in the engine, and "
    "its engine layer's time (the bar: against the slowest layer)",
)
_FLOAT_BRUSH = QBrush(QColor("#8a8a8a"))
_LINT_ICONS: dict[tuple[bool, bool], QIcon] = {}


def _lint_icon(warning: bool, stale: bool) -> QIcon:
    """The style's warning (or information) icon; greyed when the lint is stale. Made once each, on first use
    (a style needs the application)."""
    key = (warning, stale)
    if key not in _LINT_ICONS:
        pixmap = (QStyle.StandardPixmap.SP_MessageBoxWarning if warning
                  else QStyle.StandardPixmap.SP_MessageBoxInformation)
        icon = QApplication.style().standardIcon(pixmap)
        _LINT_ICONS[key] = QIcon(icon.pixmap(16, QIcon.Mode.Disabled)) if stale else icon
    return _LINT_ICONS[key]
_LAYER_FONT = QFont()
_LAYER_FONT.setBold(True)


class LayerFilterProxy(QSortFilterProxyModel):
    """Filters by name (substring or regex) and by type, keeping the ancestors of every match.

    The accepted set is computed in one pass when the filter changes (a regex search per module and
    a walk up to the first already-kept ancestor); ``filterAcceptsRow`` is then a set look-up.
    """

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._accepted: set[int] | None = None
        self._text = ""
        self._regex = False
        self._type: str | None = None
        self.error = ""  # why the regex is invalid, for the filter box
        self.matches = 0

    def source(self) -> ModuleTreeModel:
        return self.sourceModel()  # type: ignore[return-value]

    def set_filter(self, text: str = "", regex: bool = False, type_name: str | None = None) -> None:
        self._text, self._regex, self._type = text, regex, type_name or None
        self.recompute()

    def recompute(self) -> None:
        """Re-evaluate the filter (after the filter or the rows changed)."""
        model = self.source()
        self.error = ""
        text, type_name = self._text.strip(), self._type
        if model is None or (not text and not type_name):
            self._set_accepted(None, 0)
            return
        names = model.names()
        if text and self._regex:
            try:
                pattern = re.compile(text, re.IGNORECASE)
            except re.error as error:
                self.error = f"invalid regular expression: {error}"
                pattern = None
            name_ok = (lambda name: True) if pattern is None else (lambda name: pattern.search(name) is not None)
        elif text:
            lowered = text.lower()
            name_ok = lambda name: lowered in name.lower()  # noqa: E731 - chosen once, called per module
        else:
            name_ok = lambda name: True  # noqa: E731
        accepted: set[int] = set()
        matches = 0
        for node, name in enumerate(names):
            if type_name and model.type_of(node) != type_name:
                continue
            if not name_ok(name):
                continue
            matches += 1
            while node != _ROOT and node not in accepted:
                accepted.add(node)
                node = model.parent_of(node)
        self._set_accepted(accepted, matches)

    def _set_accepted(self, accepted: set[int] | None, matches: int) -> None:
        # invalidate() re-maps in one layout change; an incremental row-filter change announces every
        # removed range separately, and a view with thousands of expanded rows then relayouts
        # thousands of times (minutes on 10,000 modules)
        self._accepted, self.matches = accepted, matches
        self.invalidate()

    @property
    def active(self) -> bool:
        return self._accepted is not None

    def filterAcceptsRow(self, source_row: int, source_parent: QModelIndex | QPersistentModelIndex) -> bool:
        accepted = self._accepted
        if accepted is None:
            return True
        # called once per row: the node id straight from the arrays, no index built
        p = source_parent.internalId() if source_parent.isValid() else _ROOT
        return self._children_of_source[p + 1][source_row] in accepted

    @property
    def _children_of_source(self) -> list[list[int]]:
        return self.sourceModel()._children  # type: ignore[attr-defined]
