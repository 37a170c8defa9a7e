"""The model tree's view: the left dock (filter box, regex toggle, type filter, the tree and its context
menu) and the ignore-by-pattern dialog, over :mod:`workbench.app.tree_model`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from PySide6.QtCore import (
    QItemSelection,
    QItemSelectionModel,
    QModelIndex,
    QSettings,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QFont, QGuiApplication, QKeySequence
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
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.deferred_refresh import DeferredRefresh
from workbench.app.engine_panel import TimeBarDelegate
from workbench.app.formatting import count_text
from workbench.app.pinned_tree import PinnedNameTreeView
from workbench.app.precision_menu import PrecisionDelegate, precision_menu
from workbench.app.tree_layout import TreeLayoutMemory, default_widths, fit_columns
from workbench.app.tree_model import (
    COLUMNS,
    ENGINE,
    ENGINE_SHARE_ROLE,
    EXPAND_ALL_MATCHES,
    PRECISION,
    LayerFilterProxy,
    ModuleTreeModel,
)

__all__ = ["ModelTreeWidget", "IgnorePatternDialog"]


class ModelTreeWidget(QWidget):
    columns_fitted = Signal(int)  # the width (px) the tree needs to show every column sized to its content

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

        self.view = PinnedNameTreeView()  # the Name column stays when the others scroll sideways
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
        default_widths(self.view)  # names elided at the front: a deep row keeps its own name ("query")
        self.layout_memory = TreeLayoutMemory(self.view, self.model, self.proxy, settings)
        self._layout_path: Any = None  # the project file whose layout the view shows
        self._time_bars = TimeBarDelegate(ENGINE_SHARE_ROLE, self.view)
        self.view.setItemDelegateForColumn(ENGINE, self._time_bars)
        self._precisions = PrecisionDelegate(
            lambda index: self.model.type_of(self.proxy.mapToSource(index).internalId()), self.view)
        self.view.setItemDelegateForColumn(PRECISION, self._precisions)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                  | QAbstractItemView.EditTrigger.EditKeyPressed)

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
        self._wanted_type = ""  # a type filter to pick once the next project's types are listed (reopening)
        self.view.selectionModel().selectionChanged.connect(self._selection_from_view)
        self.view.customContextMenuRequested.connect(self._context_menu)
        self._make_actions()

        self._refresh = DeferredRefresh(controller, self.refresh, self)
        self._reset_pending = False
        controller.session_changed.connect(self._schedule_reset)
        controller.project_saved.connect(self._saved_as)
        for signal in (controller.layers_changed, controller.calibration_changed, controller.sensitivity_changed,
                       controller.engine_changed):
            signal.connect(self._refresh.schedule)
        controller.selection_changed.connect(self._selection_from_controller)
        controller.busy_changed.connect(self._busy)
        controller.lint_state.changed.connect(self.show_lint)

    # ----- refresh ---------------------------------------------------------------------------------

    def _schedule_reset(self) -> None:
        self.remember_layout()  # the project going away keeps its column widths and open rows
        self._reset_pending = True
        self._refresh.schedule()

    def remember_layout(self) -> None:
        """Keep the column widths and expanded rows of the project shown (its file's path is the key)."""
        self.layout_memory.remember(self._layout_path)

    def _saved_as(self, path: str) -> None:
        self._layout_path = path
        self.remember_layout()

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
            self.show_lint()
            if was_empty:
                self._after_reset()
        self._reset_pending = False
        if self.proxy.active:
            self.proxy.recompute()
        self._update_status()

    def show_lint(self) -> None:
        """The fusion lint's warnings as icons on their rows (greyed once the project changed since)."""
        state = self.controller.lint_state
        self.model.set_lint(state.by_module(), state.stale)

    def _after_reset(self) -> None:
        types = self.model.types()
        current = self.type_combo.currentText()
        self.type_combo.blockSignals(True)
        self.type_combo.clear()
        self.type_combo.addItem("All types")
        self.type_combo.addItems(types)
        wanted, self._wanted_type = self._wanted_type or current, ""
        if wanted in types:
            self.type_combo.setCurrentText(wanted)
        self.type_combo.blockSignals(False)
        session = self.controller.session
        self._layout_path = str(session.path) if session is not None and session.path is not None else None
        restored = self.layout_memory.restore(self._layout_path)
        if not restored:
            self.default_expansion()
        # every project, remembered or not: columns at least as wide as their content, and the dock as wide as
        # they need (a narrow dock left by the last project does not carry over)
        widths = fit_columns(self.view, self.model, keep_wider=restored)
        self.columns_fitted.emit(sum(widths) + 2 * self.view.frameWidth() + 24)
        if self.proxy.active or self.filter_edit.text() or self.type_combo.currentIndex() > 0:
            self.apply_filter()  # the filter set for this project (reopened as it was left) or kept from the last
        # the layers selected while the tree was being read (the first layer of a new project, the remembered
        # ones of a reopened one) show as selected rows, not only in the layer panel
        self.select_layers(self.controller.selection)

    def default_expansion(self) -> None:
        """The model open; a small model entirely, a big one at its top level (deeper levels on demand)."""
        self.view.expandToDepth(0 if self.model.node_count() > 2000 else 1)

    def _update_status(self) -> None:
        total = self.model.node_count()
        layers = int(self.model._is_layer.sum()) if total else 0
        quantized = int(self.model._quantized.sum()) if total else 0
        text = f"{count_text(total, 'module', grouped=True)} · {layers:,} quantizable · {quantized:,} quantized"
        if self.proxy.active:
            text = f"{self.proxy.matches:,} matching · " + text
        if self.proxy.error:
            text = self.proxy.error
        self.status_label.setText(text)
        self.filter_edit.setProperty("invalid", bool(self.proxy.error))
        self.filter_edit.style().unpolish(self.filter_edit)
        self.filter_edit.style().polish(self.filter_edit)

    # ----- filter -----------------------------------------------------------------------------------

    def set_filter(self, text: str, regex: bool, type_name: str) -> None:
        """Show the rows matching ``text`` (a regex with ``regex``) of type ``type_name`` ("": all types), as typed
        in the boxes; a type the tree does not list yet (a project being opened) is picked once it does."""
        self._wanted_type = type_name
        self.regex_box.blockSignals(True)
        self.regex_box.setChecked(regex)
        self.regex_box.blockSignals(False)
        self.filter_edit.setText(text)
        position = self.type_combo.findText(type_name) if type_name else 0
        if position >= 0:
            self.type_combo.setCurrentIndex(position)
        self.apply_filter()

    def filter_state(self) -> tuple[str, bool, str]:
        """The filter as :meth:`set_filter` takes it."""
        type_name = self.type_combo.currentText() if self.type_combo.currentIndex() > 0 else ""
        return self.filter_edit.text(), self.regex_box.isChecked(), type_name

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

    def select_row(self, name: str) -> bool:
        """Select and reveal the row of module ``name`` (a layer or a container) as a click on it would:
        the controller's selection becomes its layers. False when the tree has no such row."""
        if self.model.node_of(name) is None:
            return False
        self.select_layers([name])
        self._selection_from_view()
        return True

    def has_row(self, name: str) -> bool:
        return self.model.node_of(name) is not None

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
        self.fix_actions: list[QAction] = []  # the lint's fixes for the selection, made with each context menu
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
        layers = [(name, self.model.type_of(self.model.node_of(name))) for name in self.selected_layers()]
        self.precision_menu = precision_menu(menu, self.controller, layers, enabled=not busy)
        menu.addMenu(self.precision_menu)
        menu.addSeparator()
        self.fix_actions = self._fix_actions(menu, enabled=not busy)
        if self.fix_actions:
            menu.addSection("TensorRT lint")
            menu.addActions(self.fix_actions)
            menu.addSeparator()
        menu.addActions([self.copy_action, self.expand_action, self.collapse_action])
        return menu

    def _fix_actions(self, menu: QMenu, enabled: bool) -> list[QAction]:
        """One action per fix the lint offers for the selected rows (applied through the controller)."""
        state = self.controller.lint_state
        actions = []
        for fix in state.fixes_for([self.model.name_of(node) for node in self.selected_nodes()]):
            action = QAction(f"Fix: {fix.description}" + (" (lint is stale)" if state.stale else ""), menu)
            action.setToolTip(fix.description)
            action.setEnabled(enabled)
            action.triggered.connect(lambda _checked=False, f=fix: state.apply(f))
            actions.append(action)
        return actions

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
        from workbench.app.descriptor_editor import DescriptorDialog

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
            self._matches = self.controller.ignore_preview(self.patterns())
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
