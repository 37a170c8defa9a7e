"""The tree's Precision column and menu: a layer's precision chosen from the one registry
(:mod:`workbench.quant.algorithms.precision`), per row with a combo box, or for many rows from the context menu.

Only the precisions that apply to a layer are offered (INT4 weight-only to GEMMs); changing one is the
session's ``set_precision`` through the controller, one edit like any other.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtWidgets import QComboBox, QMenu, QStyledItemDelegate, QStyleOptionViewItem, QWidget

from workbench.app.controller import Controller
from workbench.app.formatting import count_text
from workbench.quant.algorithms.precision import PRECISIONS, Precision, applies_to

__all__ = ["precision_choices", "PrecisionDelegate", "precision_menu", "split_by_precision", "busy_free"]


def precision_choices(layer_type: str) -> list[Precision]:
    """The precisions a layer of ``layer_type`` can run in, in the registry's order."""
    return [p for p in PRECISIONS if applies_to(p, layer_type, has_weight=True) is None]


def split_by_precision(precision: Precision, layers: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(layers ``precision`` applies to, layers it does not) of ``(name, type)`` pairs."""
    fits = [name for name, layer_type in layers if applies_to(precision, layer_type, has_weight=True) is None]
    chosen = set(fits)
    return fits, [name for name, _ in layers if name not in chosen]


class PrecisionDelegate(QStyledItemDelegate):
    """A combo box of the precisions that apply to the row's layer; choosing one sets it (the model's setData)."""

    def __init__(self, type_of: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._type_of = type_of  # index -> the layer's type (the tree model knows it)

    def createEditor(self, parent: QWidget, option: QStyleOptionViewItem,  # noqa: N802 - Qt's name
                     index: QModelIndex | QPersistentModelIndex) -> QWidget:
        combo = QComboBox(parent)
        for precision in precision_choices(self._type_of(index)):
            info = precision.info
            combo.addItem(info.label, precision.value)
            combo.setItemData(combo.count() - 1, info.description, Qt.ItemDataRole.ToolTipRole)
        # one choice is one edit: no Enter needed
        combo.activated.connect(lambda _i, c=combo: (self.commitData.emit(c), self.closeEditor.emit(c)))
        return combo

    def setEditorData(self, editor: QWidget, index: QModelIndex | QPersistentModelIndex) -> None:  # noqa: N802
        current = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        position = editor.findData(current)
        if position >= 0:
            editor.setCurrentIndex(position)

    def setModelData(self, editor: QWidget, model: QAbstractItemModel,  # noqa: N802 - Qt's name
                     index: QModelIndex | QPersistentModelIndex) -> None:
        value = editor.currentData()
        if value is not None:
            model.setData(index, value, Qt.ItemDataRole.EditRole)


def precision_menu(parent: QWidget, controller: Controller, layers: Sequence[tuple[str, str]],
                   enabled: bool) -> QMenu:
    """"Precision ▸ INT8 / FP8 / INT4 W / float" for the selected ``(name, type)`` layers: each applies to the
    layers it fits, and the log names the ones it skipped."""
    menu = QMenu("Precision", parent)
    menu.setToolTipsVisible(True)
    for precision, info in PRECISIONS.items():
        fits, skipped = split_by_precision(precision, layers)
        # the session's own check too: an INT4 block TensorRT builds must divide the layer's input features
        problems = controller.precision_problems(fits, precision.value) if fits and busy_free(controller) else {}
        fits = [name for name in fits if name not in problems]
        skipped += list(problems)
        share = f" ({len(fits)} of {count_text(len(layers), 'layer')})" if skipped and fits else ""
        action = menu.addAction(info.label + share)
        action.setToolTip(info.description)
        action.setEnabled(enabled and bool(fits))
        action.setData(precision.value)
        action.triggered.connect(lambda _checked=False, p=precision, f=fits, s=skipped: _apply(controller, p, f, s))
    menu.setEnabled(enabled and bool(layers))
    return menu


def busy_free(controller: Controller) -> bool:
    """Whether the session may be asked now (a running job owns it)."""
    return controller.session is not None and not controller.busy


def _apply(controller: Controller, precision: Precision, fits: list[str], skipped: list[str]) -> None:
    if controller.set_precision(fits, precision.value) is not None and skipped:
        controller.log.emit("info", f"{precision.info.label} does not apply to {', '.join(skipped[:8])}"
                                    f"{'…' if len(skipped) > 8 else ''}: left as they were")
