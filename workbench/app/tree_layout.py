"""How the model tree is laid out: columns sized to what they hold, names elided at the front, and the column
widths and expanded rows remembered per project file (a deep transformer is read again as it was left).

Sizing comes from the model's own strings and the font's metrics, once per reset: Qt's ResizeToContents
would measure every row of a 10,000-module tree on each layout pass.
"""
from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QStyledItemDelegate, QStyleOptionViewItem, QTreeView

from workbench.app.formatting import elide_name
from workbench.app.tree_model import COLUMN_WIDTHS, COLUMNS, NAME, LayerFilterProxy, ModuleTreeModel
from workbench.app.view_memory import project_key

__all__ = ["fit_columns", "TreeLayoutMemory", "FrontElidedDelegate", "default_widths", "MAX_NAME_WIDTH",
           "MAX_COLUMN_WIDTH"]

MAX_NAME_WIDTH = 460    # px: the Name column never takes the whole dock
MAX_COLUMN_WIDTH = 300  # px: other columns
_PADDING = 18           # px: cell margins (and the sort/resize handle in the header)
_DECORATION = 22        # px: the lint icon next to a name


def fit_columns(view: QTreeView, model: ModuleTreeModel, *, keep_wider: bool = False) -> list[int]:
    """Set every column's width to its widest text (header included), within limits; returns the widths.

    ``keep_wider``: a column the user (or a remembered layout) made wider stays so; none is left narrower than
    its content, so a layout remembered from a narrow dock does not cut this project's columns.

    The Name column counts each row's indentation and the bold font of layers, so a layer ten levels deep
    reads "query", not "...". Texts are measured once each (types and summaries repeat a lot).
    """
    count = model.node_count()
    if count == 0:
        return []
    metrics = view.fontMetrics()
    bold_font = QFont(view.font())
    bold_font.setBold(True)
    bold = QFontMetrics(bold_font)
    header = view.header()
    header_metrics = header.fontMetrics()
    widths = []
    for column, title in enumerate(COLUMNS):
        if header.isSectionHidden(column):
            widths.append(header.sectionSize(column))
            continue
        least = header_metrics.horizontalAdvance(title) + 2 * _PADDING
        if column == NAME:
            indent, depths, texts = view.indentation(), model.depths(), model.column_texts(NAME)
            seen: dict[tuple[str, bool], int] = {}
            widest = 0
            for node, text in enumerate(texts):
                key = (text, model.is_layer_font(node))
                if key not in seen:
                    seen[key] = (bold if key[1] else metrics).horizontalAdvance(text)
                widest = max(widest, indent * (depths[node] + 1) + seen[key])
            width = min(MAX_NAME_WIDTH, max(least, widest + _DECORATION + _PADDING))
        else:
            texts = set(model.column_texts(column))
            widest = max((metrics.horizontalAdvance(text) for text in texts if text), default=0)
            extra = 22 if column == 2 else 0  # the Quantize column's check box
            width = min(MAX_COLUMN_WIDTH, max(least, widest + _PADDING + extra, 40))
        if keep_wider:
            width = max(width, header.sectionSize(column))
        view.setColumnWidth(column, width)
        widths.append(width)
    return widths



class TreeLayoutMemory:
    """Column widths and expanded rows of the tree, per project file, in the application's settings.

    ``remember(path)`` stores the view as it is now; ``restore(path)`` puts it back and returns True, or
    returns False for a project seen for the first time (the caller then sizes columns to content).
    """

    def __init__(self, view: QTreeView, model: ModuleTreeModel, proxy: LayerFilterProxy,
                 settings: QSettings | None) -> None:
        self.view, self.model, self.proxy, self.settings = view, model, proxy, settings

    def remember(self, path: Any) -> None:
        if self.settings is None or path is None or self.model.node_count() == 0:
            return
        expanded = []
        for node in range(self.model.node_count()):
            index = self.proxy.mapFromSource(self.model.index_of(self.model.name_of(node)))
            if index.isValid() and self.model.rowCount(self.model.index_of(self.model.name_of(node))) > 0 \
                    and self.view.isExpanded(index):
                expanded.append(self.model.name_of(node))
        group = f"tree_layout/{project_key(path)}"
        self.settings.setValue(f"{group}/header", self.view.header().saveState())
        self.settings.setValue(f"{group}/expanded", json.dumps(expanded))
        self.settings.setValue(f"{group}/saved", True)

    def restore(self, path: Any) -> bool:
        if self.settings is None or path is None:
            return False
        group = f"tree_layout/{project_key(path)}"
        if not self.settings.value(f"{group}/saved", False, type=bool):
            return False
        state = self.settings.value(f"{group}/header")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.view.header().restoreState(state)
        try:
            names = json.loads(str(self.settings.value(f"{group}/expanded", "[]") or "[]"))
        except ValueError:  # written by hand or by another version: the rows start as by default
            names = []
        self.view.collapseAll()
        for name in names if isinstance(names, list) else []:
            source = self.model.index_of(name)
            if source.isValid():
                index = self.proxy.mapFromSource(source)
                if index.isValid():
                    self.view.expand(index)
        return True


class FrontElidedDelegate(QStyledItemDelegate):
    """Cells elided at the front, keeping a dotted name's block index (``…10.….self.query``, see
    :func:`~workbench.app.formatting.elide_name`): a name's end and its index are what tell rows apart. Other
    columns keep Qt's elision at the end (a descriptor summary starts with what matters: "int8 per-tensor…")."""

    def initStyleOption(self, option: QStyleOptionViewItem, index: Any) -> None:  # noqa: N802 - Qt's name
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideLeft  # what still does not fit (a single long part)
        widget = option.widget
        style = widget.style() if widget is not None else None
        margin = style.pixelMetric(style.PixelMetric.PM_FocusFrameHMargin, None, widget) + 1 if style else 4
        room = option.rect.width() - 2 * margin - (option.decorationSize.width() + margin
                                                   if option.features & option.ViewItemFeature.HasDecoration else 0)
        metrics = option.fontMetrics
        option.text = elide_name(option.text, lambda text: metrics.horizontalAdvance(text) <= room)


def default_widths(view: QTreeView) -> None:
    """The fixed widths used before a model is shown, and the Name column elided at the front."""
    for column, width in zip(range(len(COLUMNS)), COLUMN_WIDTHS):
        view.setColumnWidth(column, width)
    view.setItemDelegateForColumn(NAME, FrontElidedDelegate(view))
