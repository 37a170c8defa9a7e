"""The model tree: a flat-array ``QAbstractItemModel`` over the session's module tree, its filter and its view.

Why flat arrays: a model with 10,000 modules must open and scroll without a stall. The session's
:class:`~workbench.graph.ModelTree` lists modules in pre-order, so one pass builds parallel lists
(parent, children, row, one display string per column) and every subtree is a contiguous range
``[node, end[node])``. ``data()`` is then a couple of list look-ups, the tri-state of every container
comes from two prefix sums (quantized layers and layers in the range), and a subtree's layers are a
slice. A node's id is its pre-order position, stored in the index's ``internalId``.

Edits never touch the arrays directly: a check box calls ``controller.set_quantize`` for the whole
subtree; the controller announces ``layers_changed`` and the model re-reads the session's rows,
emitting ``dataChanged`` only for the rows that differ.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QAbstractItemModel,
    QItemSelection,
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    QSettings,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QBrush, QColor, QFont, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QMenu,
    QPlainTextEdit,
    QSplitter,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller, DeferredRefresh
from workbench.app.engine_panel import TimeBarDelegate, engine_cell
from workbench.graph import ModelTree
from workbench.session import LayerView

__all__ = ["ModuleTreeModel", "LayerFilterProxy", "ModelTreeWidget", "IgnorePatternDialog", "COLUMNS"]

COLUMNS = ("Name", "Type", "Quantize", "Input", "Weight", "amax", "Rank", "Engine")
NAME, TYPE, QUANT, INPUT, WEIGHT, AMAX, RANK, ENGINE = range(len(COLUMNS))
_COLUMN_COUNT = len(COLUMNS)
COLUMN_WIDTHS = (140, 170, 74, 178, 150, 56, 44, 110)  # the Engine column shows after an engine report
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
        self._update(layers, emit=False)

    def _update(self, layers: Sequence[LayerView], emit: bool = True) -> None:
        count = len(self._names)
        if count == 0:
            return
        is_layer = np.zeros(count, dtype=bool)
        quantized = np.zeros(count, dtype=bool)
        columns = {c: [""] * count for c in (QUANT, INPUT, WEIGHT, AMAX, RANK)}
        types = list(self._types)
        is_float = [False] * count
        node_of = self._node_of
        for layer in layers:
            i = node_of.get(layer.name)
            if i is None:
                continue
            is_layer[i] = True
            quantized[i] = layer.quantize
            is_float[i] = not layer.quantize
            types[i] = layer.type
            columns[INPUT][i] = layer.input_summary
            columns[WEIGHT][i] = layer.weight_summary
            columns[AMAX][i] = layer.amax_summary
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
            old_rows = list(zip(self._check, types, *[self._text[c] for c in (QUANT, INPUT, WEIGHT, AMAX, RANK)],
                                self._float))
        self._is_layer, self._quantized, self._check, self._float = is_layer, quantized, check, is_float
        self._shown_types = types
        self._text[TYPE] = [f"{t} ({note})" if note else t for t, note in zip(types, self._notes)]
        types = self._text[TYPE]
        for c, values in columns.items():
            self._text[c] = values
        if emit and old_rows is not None:
            new_rows = zip(check, types, *[columns[c] for c in (QUANT, INPUT, WEIGHT, AMAX, RANK)], is_float)
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

    def name_of(self, node: int) -> str:
        return self._names[node]

    def node_of(self, name: str) -> int | None:
        return self._node_of.get(name)

    def parent_of(self, node: int) -> int:
        return self._parent[node]

    def child_node(self, row: int, parent: QModelIndex) -> int:
        """The node at ``row`` under ``parent`` (used by the filter without building an index)."""
        p = parent.internalId() if parent.isValid() else _ROOT
        return self._children[p + 1][row]

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
        if role == Qt.ItemDataRole.ToolTipRole:
            if column == NAME:
                return self._names[node] or "(the model)"
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
        return flags

    def setData(self, index: QModelIndex | QPersistentModelIndex, value: Any,
                role: int = Qt.ItemDataRole.EditRole) -> bool:
        """Ticking a row quantizes every layer of its subtree; unticking leaves them all in float."""
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
        return [(m.name, m.type_name, m.parent, m.depth) for m in tree.modules]
    rows: list[tuple[str, str, str | None, int]] = []
    by_name = tree.by_name
    stack: list[tuple[str, str, str | None, int, bool]] = [(tree.root.name, tree.root.type_name, None, 0, True)]
    while stack:
        name, type_name, parent, depth, is_module = stack.pop()
        rows.append((name, type_name, parent, depth))
        if not is_module:
            continue
        pending = [(c, by_name[c].type_name, name, depth + 1, True) for c in by_name[name].children]
        pending += [(layer.name, layer.type, name, depth + 1, False) for layer in extra.get(name, [])]
        stack.extend(reversed(pending))
    return rows


_HEADER_TIPS = (
    "Module name (the model itself on top)",
    "Module type (the float type for quantizable layers)",
    "Quantize the layer (ticked) or leave it in float; containers: quantized layers / layers inside",
    "Input quantizer: bits, per-tensor or per-channel, calibrator/method",
    "Weight quantizer: bits, per-tensor or per-channel, calibrator",
    "Calibrated input amax (range) of the layer",
    "Sensitivity rank from the latest analysis (1 = hurts most when quantized)",
    "What TensorRT ran the module in (imported engine report): INT8, FP16, FP32 or not in the engine, and "
    "its engine layer's time (the bar: against the slowest layer)",
)
_FLOAT_BRUSH = QBrush(QColor("#8a8a8a"))
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


class ModelTreeWidget(QWidget):
    """The left dock: filter box, regex toggle, type filter, and the tree view with its context menu.

    Selecting rows selects layers through ``controller.select`` (a container stands for the layers in
    it); a selection made elsewhere (the sensitivity chart) selects and reveals the rows here.
    """

    def __init__(self, controller: Controller, parent: QWidget | None = None,
                 settings: QSettings | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self._settings = settings
        self.model = ModuleTreeModel(controller, self)
        self.proxy = LayerFilterProxy(self)
        self.proxy.setSourceModel(self.model)

        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter layers by name…")
        self.filter_edit.setClearButtonEnabled(True)
        self.regex_box = QCheckBox("Regex")
        self.regex_box.setToolTip("Match names with a regular expression instead of a substring")
        self.type_combo = QComboBox()
        self.type_combo.setToolTip("Show only modules of this type (and the containers around them)")
        self.type_combo.setMinimumContentsLength(10)
        self.type_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.status_label = QLabel()
        self.status_label.setObjectName("treeStatus")

        self.view = QTreeView()
        self.view.setModel(self.proxy)
        self.view.setUniformRowHeights(True)  # the view never measures 10,000 rows one by one
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setAlternatingRowColors(True)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.setAllColumnsShowFocus(True)
        header = self.view.header()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)  # ResizeToContents would scan every row
        header.setStretchLastSection(False)
        for column, width in zip(range(len(COLUMNS)), COLUMN_WIDTHS):
            self.view.setColumnWidth(column, width)
        self._time_bars = TimeBarDelegate(ENGINE_SHARE_ROLE, self.view)
        self.view.setItemDelegateForColumn(ENGINE, self._time_bars)

        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.regex_box)
        top.addWidget(self.type_combo)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.status_label)

        self._filter_timer = QTimer(self)
        self._filter_timer.setSingleShot(True)
        self._filter_timer.setInterval(120)  # typing in the box re-filters once the user pauses
        self._filter_timer.timeout.connect(self.apply_filter)
        self.filter_edit.textChanged.connect(lambda _text: self._filter_timer.start())
        self.regex_box.toggled.connect(lambda _on: self.apply_filter())
        self.type_combo.currentIndexChanged.connect(lambda _i: self.apply_filter())

        self._syncing = False
        self._emitted: list[str] | None = None
        self.view.selectionModel().selectionChanged.connect(self._selection_from_view)
        self.view.customContextMenuRequested.connect(self._context_menu)
        self._make_actions()

        self._refresh = DeferredRefresh(controller, self.refresh, self)
        self._reset_pending = False
        controller.session_changed.connect(self._schedule_reset)
        for signal in (controller.layers_changed, controller.calibration_changed, controller.sensitivity_changed,
                       controller.engine_changed):
            signal.connect(self._refresh.schedule)
        controller.selection_changed.connect(self._selection_from_controller)
        controller.busy_changed.connect(self._busy)

    # ----- refresh ---------------------------------------------------------------------------------

    def _schedule_reset(self) -> None:
        self._reset_pending = True
        self._refresh.schedule()

    def refresh(self) -> None:
        """Re-read the session's tree and rows (once per batch of change signals).

        Never while a job runs: the session is not thread-safe, and reading it can rebuild its
        quantized model under the job's feet. The refresh happens when the job ends.
        """
        if not self._refresh.begin():
            return
        session = self.controller.session
        if session is None:
            self.model.set_views(None, [])
        else:
            try:
                tree, layers = self.controller.views()
            except Exception as error:  # noqa: BLE001 - the tree shows nothing; the user sees why
                self.controller.error.emit("Could not read the model's layers", str(error), "")
                return
            was_empty = self.model.node_count() == 0 or self._reset_pending
            self.model.set_views(tree, layers)
            self.model.set_engine(self.controller.engine_report())
            if was_empty:
                self._after_reset()
        self._reset_pending = False
        if self.proxy.active:
            self.proxy.recompute()
        self._update_status()

    def _after_reset(self) -> None:
        types = self.model.types()
        current = self.type_combo.currentText()
        self.type_combo.blockSignals(True)
        self.type_combo.clear()
        self.type_combo.addItem("All types")
        self.type_combo.addItems(types)
        if current in types:
            self.type_combo.setCurrentText(current)
        self.type_combo.blockSignals(False)
        self.default_expansion()

    def default_expansion(self) -> None:
        """The model open; a small model entirely, a big one at its top level (deeper levels on demand)."""
        self.view.expandToDepth(0 if self.model.node_count() > 2000 else 1)

    def _update_status(self) -> None:
        total = self.model.node_count()
        layers = int(self.model._is_layer.sum()) if total else 0
        quantized = int(self.model._quantized.sum()) if total else 0
        text = f"{total:,} modules · {layers:,} quantizable · {quantized:,} quantized"
        if self.proxy.active:
            text = f"{self.proxy.matches:,} matching · " + text
        if self.proxy.error:
            text = self.proxy.error
        self.status_label.setText(text)
        self.filter_edit.setProperty("invalid", bool(self.proxy.error))
        self.filter_edit.style().unpolish(self.filter_edit)
        self.filter_edit.style().polish(self.filter_edit)

    # ----- filter -----------------------------------------------------------------------------------

    def apply_filter(self) -> None:
        self._filter_timer.stop()
        type_name = self.type_combo.currentText() if self.type_combo.currentIndex() > 0 else None
        # collapsed while the filter re-maps: the view then tracks a handful of rows, not thousands
        self.view.collapseAll()
        self.proxy.set_filter(self.filter_edit.text(), self.regex_box.isChecked(), type_name)
        if self.proxy.active and self.proxy.matches <= EXPAND_ALL_MATCHES:
            self.view.expandAll()  # every match in sight
        else:
            self.default_expansion()
        self._update_status()
        self._emitted = None
        self._selection_from_controller(self.controller.selection)

    # ----- selection ----------------------------------------------------------------------------------

    def selected_nodes(self) -> list[int]:
        rows = self.view.selectionModel().selectedRows(0)
        return sorted({self.proxy.mapToSource(index).internalId() for index in rows})

    def selected_layers(self) -> list[str]:
        """Layers the selected rows stand for (a container: every layer inside it), in model order."""
        names: list[str] = []
        for node in self.selected_nodes():
            names += [self.model.name_of(node)] if self.model.is_layer(node) else self.model.subtree_layers(node)
        return list(dict.fromkeys(names))

    def _selection_from_view(self, *_args: Any) -> None:
        if self._syncing:
            return
        names = self.selected_layers()
        self._emitted = names
        self.controller.select(names)

    def _selection_from_controller(self, names: list[str]) -> None:
        if self._syncing or names == self._emitted:
            return
        self.select_layers(names)

    def select_layers(self, names: Iterable[str]) -> None:
        """Select and reveal the rows of ``names`` (without echoing the selection back)."""
        selection = QItemSelection()
        first: QModelIndex | None = None
        last_column = len(COLUMNS) - 1
        for name in names:
            source = self.model.index_of(name)
            index = self.proxy.mapFromSource(source)
            if not index.isValid():
                continue  # filtered out
            selection.select(index, index.siblingAtColumn(last_column))
            parent = index.parent()
            while parent.isValid():
                self.view.expand(parent)
                parent = parent.parent()
            first = first or index
        self._syncing = True
        try:
            self.view.selectionModel().select(selection, QItemSelectionModel.SelectionFlag.ClearAndSelect
                                              | QItemSelectionModel.SelectionFlag.Rows)
            if first is not None:
                self.view.selectionModel().setCurrentIndex(first, QItemSelectionModel.SelectionFlag.NoUpdate)
                self.view.scrollTo(first)
        finally:
            self._syncing = False
        self._emitted = list(names)

    # ----- context menu -------------------------------------------------------------------------------

    def _make_actions(self) -> None:
        self.quantize_action = QAction("Quantize", self)
        self.quantize_action.triggered.connect(lambda: self._set_quantize(True))
        self.ignore_action = QAction("Ignore (leave in float)", self)
        self.ignore_action.triggered.connect(lambda: self._set_quantize(False))
        self.descriptor_action = QAction("Set descriptor…", self)
        self.descriptor_action.triggered.connect(self.set_descriptor_dialog)
        self.reset_action = QAction("Reset to default", self)
        self.reset_action.triggered.connect(self._reset)
        self.pattern_action = QAction("Ignore by pattern…", self)
        self.pattern_action.triggered.connect(self.ignore_pattern_dialog)
        self.copy_action = QAction("Copy name", self)
        self.copy_action.setShortcut(QKeySequence.StandardKey.Copy)
        self.copy_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.copy_action.triggered.connect(self._copy_names)
        self.view.addAction(self.copy_action)
        self.expand_action = QAction("Expand all", self)
        self.expand_action.triggered.connect(self.view.expandAll)
        self.collapse_action = QAction("Collapse all", self)
        self.collapse_action.triggered.connect(lambda: (self.view.collapseAll(), self.view.expandToDepth(0)))
        self.editing_actions = [self.quantize_action, self.ignore_action, self.descriptor_action, self.reset_action,
                                self.pattern_action]

    def context_menu(self) -> QMenu:
        """The menu for the current selection (built fresh so its enabled states are right)."""
        has_layers = bool(self.selected_layers())
        busy = self.controller.busy or self.controller.session is None
        for action in (self.quantize_action, self.ignore_action, self.descriptor_action, self.reset_action):
            action.setEnabled(has_layers and not busy)
        self.pattern_action.setEnabled(not busy)
        menu = QMenu(self)
        menu.addActions([self.quantize_action, self.ignore_action])
        menu.addSeparator()
        menu.addActions([self.descriptor_action, self.reset_action])
        menu.addSeparator()
        menu.addAction(self.pattern_action)
        menu.addSeparator()
        menu.addActions([self.copy_action, self.expand_action, self.collapse_action])
        return menu

    def _context_menu(self, position: Any) -> None:
        self.context_menu().popup(self.view.viewport().mapToGlobal(position))

    def _set_quantize(self, quantize: bool) -> None:
        names = self.selected_layers()
        if names:
            self.controller.set_quantize(names, quantize)

    def _reset(self) -> None:
        names = self.selected_layers()
        if names:
            self.controller.reset_descriptor(names)

    def _copy_names(self) -> None:
        names = [self.model.name_of(node) for node in self.selected_nodes()]
        QGuiApplication.clipboard().setText("\n".join(names))

    def set_descriptor_dialog(self) -> QDialog | None:
        from workbench.app.layer_panel import DescriptorDialog

        names = self.selected_layers()
        if not names or self.controller.session is None:
            return None
        dialog = DescriptorDialog(self.controller, names, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.descriptor_dialog = dialog
        return dialog

    def ignore_pattern_dialog(self) -> IgnorePatternDialog | None:
        if self.controller.session is None:
            return None
        patterns = []
        if self._settings is not None:
            patterns = [p for p in str(self._settings.value("ignore_patterns", "") or "").split("\n") if p]
        dialog = IgnorePatternDialog(self.controller, patterns, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._remember_patterns(dialog.patterns()))
        dialog.open()
        self.pattern_dialog = dialog
        return dialog

    def _remember_patterns(self, patterns: list[str]) -> None:
        if self._settings is not None:
            self._settings.setValue("ignore_patterns", "\n".join(patterns))

    def _busy(self, busy: bool) -> None:
        self.model.set_read_only(busy)


class IgnorePatternDialog(QDialog):
    """An ignore policy as regexes, one per line, with a live preview of the layers it leaves in float.

    The preview is ``session.ignore_preview`` (the CLI's ``--ignore`` matching); OK leaves the matches
    in float through ``controller.apply_ignore_policy``.
    """

    def __init__(self, controller: Controller, patterns: Sequence[str] = (), parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setWindowTitle("Ignore by pattern")
        self.resize(640, 420)
        self.editor = QPlainTextEdit("\n".join(patterns))
        self.editor.setPlaceholderText("One regular expression per line, e.g.\n.*downsample.*\n^fc$")
        font = QFont("monospace")
        font.setStyleHint(QFont.StyleHint.Monospace)
        self.editor.setFont(font)
        self.preview = QListWidget()
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.quantize_others = QCheckBox("Quantize every other layer")
        self.quantize_others.setToolTip("Also tick the layers the patterns do not match (the policy is then the "
                                        "whole decision, as on the command line)")
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(QLabel("Patterns (Python regular expressions, matched like the ignore policy):"))
        left_layout.addWidget(self.editor)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(QLabel("Layers left in float:"))
        right_layout.addWidget(self.preview)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Ignore matches")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.summary)
        layout.addWidget(self.quantize_others)
        layout.addWidget(self.buttons)
        self._matches: list[str] = []
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(150)
        self._timer.timeout.connect(self.update_preview)
        self.editor.textChanged.connect(self._timer.start)
        self.update_preview()

    def patterns(self) -> list[str]:
        return [line.strip() for line in self.editor.toPlainText().splitlines() if line.strip()]

    def matches(self) -> list[str]:
        return list(self._matches)

    def update_preview(self) -> None:
        self._timer.stop()
        session = self.controller.session
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.preview.clear()
        if session is None:
            return
        try:
            self._matches = session.ignore_preview(self.patterns())
        except Exception as error:  # noqa: BLE001 - a bad regex is shown in the dialog, not raised
            self._matches = []
            self.summary.setText(f"<span style='color:#c0392b'>{error}</span>")
            ok.setEnabled(False)
            return
        self.preview.addItems(self._matches)
        total = len(session.project.layers)
        self.summary.setText(f"{len(self._matches)} of {total} quantizable layers match.")
        ok.setEnabled(bool(self.patterns()))

    def accept(self) -> None:
        self.update_preview()
        if not self.patterns():
            return
        # one edit: two set_quantize calls would have the second refused while the first one's
        # background rebuild runs (on a big model)
        if self.controller.apply_ignore_policy(self.patterns(), self.quantize_others.isChecked()) is None:
            return  # the controller showed why; the dialog stays open
        super().accept()
