"""A tree view whose first column (the model tree's Name) stays in place when the other columns scroll sideways.

Qt's frozen-column pattern (the ``frozencolumn`` example of QTableView), for a tree: a second QTreeView that
shows only column 0 lies over the first column of the main one. Both share the model, the selection and the
vertical scroll position; rows expanded or collapsed in either are expanded or collapsed in the other. The
main view stays the one the rest of the app talks to (selection, scrolling to a row, header state); its
expand and collapse calls reach the pinned view as well.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPoint, Qt
from PySide6.QtWidgets import QAbstractItemView, QFrame, QHeaderView, QStyledItemDelegate, QTreeView, QWidget

__all__ = ["PinnedNameTreeView"]


class PinnedNameTreeView(QTreeView):
    """A QTreeView with column 0 pinned at the left edge (see the module's docstring)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pinned = QTreeView(self)
        self.pinned.setObjectName("pinnedNameColumn")
        self.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        pinned = self.pinned
        pinned.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the keyboard stays with the main view
        pinned.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        pinned.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        pinned.setFrameShape(QFrame.Shape.NoFrame)
        pinned.setUniformRowHeights(True)
        pinned.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        pinned.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        pinned.setStyleSheet("QTreeView#pinnedNameColumn { border-right: 1px solid palette(mid); }")
        pinned.header().setStretchLastSection(False)
        pinned.header().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.viewport().stackUnder(pinned)
        # one vertical position, one width of the Name column, one set of expanded rows
        pinned.verticalScrollBar().valueChanged.connect(self.verticalScrollBar().setValue)
        self.verticalScrollBar().valueChanged.connect(pinned.verticalScrollBar().setValue)
        pinned.header().sectionResized.connect(self._pinned_resized)
        self.header().sectionResized.connect(self._main_resized)
        pinned.expanded.connect(self._expand_main)
        pinned.collapsed.connect(self._collapse_main)
        self.expanded.connect(pinned.expand)
        self.collapsed.connect(pinned.collapse)
        pinned.customContextMenuRequested.connect(self._pinned_menu)

    # ----- wiring ---------------------------------------------------------------------------------------

    def setModel(self, model: QAbstractItemModel) -> None:  # noqa: N802 - Qt's name
        super().setModel(model)
        self.pinned.setModel(model)
        self.pinned.setSelectionModel(self.selectionModel())
        self._hide_pinned_columns()
        model.modelReset.connect(self._hide_pinned_columns)
        model.columnsInserted.connect(self._hide_pinned_columns)

    def _hide_pinned_columns(self) -> None:
        model = self.model()
        for column in range(1, model.columnCount() if model is not None else 0):
            self.pinned.setColumnHidden(column, True)
        self._place()

    def setItemDelegateForColumn(self, column: int, delegate: QStyledItemDelegate) -> None:  # noqa: N802
        super().setItemDelegateForColumn(column, delegate)
        if column == 0:
            self.pinned.setItemDelegateForColumn(0, delegate)

    def setSelectionMode(self, mode: QAbstractItemView.SelectionMode) -> None:  # noqa: N802
        super().setSelectionMode(mode)
        self.pinned.setSelectionMode(mode)

    def setSelectionBehavior(self, behavior: QAbstractItemView.SelectionBehavior) -> None:  # noqa: N802
        super().setSelectionBehavior(behavior)
        self.pinned.setSelectionBehavior(behavior)

    def setAlternatingRowColors(self, enable: bool) -> None:  # noqa: N802
        super().setAlternatingRowColors(enable)
        self.pinned.setAlternatingRowColors(enable)

    # ----- expansion: the app's calls reach both views ----------------------------------------------------

    def expand(self, index: QModelIndex) -> None:
        super().expand(index)
        self.pinned.expand(index)

    def collapse(self, index: QModelIndex) -> None:
        super().collapse(index)
        self.pinned.collapse(index)

    def expandAll(self) -> None:  # noqa: N802
        super().expandAll()
        self.pinned.expandAll()

    def collapseAll(self) -> None:  # noqa: N802
        super().collapseAll()
        self.pinned.collapseAll()

    def expandToDepth(self, depth: int) -> None:  # noqa: N802
        super().expandToDepth(depth)
        self.pinned.expandToDepth(depth)

    def _expand_main(self, index: QModelIndex) -> None:
        if not self.isExpanded(index):
            super().expand(index)

    def _collapse_main(self, index: QModelIndex) -> None:
        if self.isExpanded(index):
            super().collapse(index)

    # ----- geometry -------------------------------------------------------------------------------------

    def _pinned_resized(self, column: int, _old: int, new: int) -> None:
        if column == 0 and self.columnWidth(0) != new:
            self.setColumnWidth(0, new)
        self._place()

    def _main_resized(self, column: int, _old: int, new: int) -> None:
        if column == 0 and self.pinned.columnWidth(0) != new:
            self.pinned.setColumnWidth(0, new)
        self._place()

    def _place(self) -> None:
        frame = self.frameWidth()
        width = self.columnWidth(0)
        if self.pinned.columnWidth(0) != width:
            self.pinned.setColumnWidth(0, width)
        if self.pinned.indentation() != self.indentation():
            self.pinned.setIndentation(self.indentation())
        if self.pinned.rootIsDecorated() != self.rootIsDecorated():
            self.pinned.setRootIsDecorated(self.rootIsDecorated())
        self.pinned.setGeometry(frame, frame, width, self.viewport().height() + self.header().height())
        self.pinned.setVisible(not self.isHeaderHidden() and width > 0)

    def updateGeometries(self) -> None:  # noqa: N802 - Qt's virtual
        super().updateGeometries()
        self._place()

    def resizeEvent(self, event: Any) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._place()

    def scrollTo(self, index: QModelIndex,  # noqa: N802
                 hint: QAbstractItemView.ScrollHint = QAbstractItemView.ScrollHint.EnsureVisible) -> None:
        """Rows are revealed vertically only: the main view must not scroll sideways to show a name the pinned
        column shows anyway (which would move the other columns away from where the user left them)."""
        offset = self.horizontalScrollBar().value()
        super().scrollTo(index, hint)
        if index.column() == 0:
            self.horizontalScrollBar().setValue(offset)

    def _pinned_menu(self, position: QPoint) -> None:
        """A right click on a pinned name is a right click on the tree (the menu acts on the selection)."""
        where = self.pinned.viewport().mapToGlobal(position)
        self.customContextMenuRequested.emit(self.viewport().mapFromGlobal(where))
