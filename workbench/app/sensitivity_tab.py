"""The sensitivity tab: which layers cost the metric when quantized, and which to leave in float.

Everything the tab does goes through the :class:`~workbench.app.controller.Controller` (sensitivity,
fallback, set_quantize, apply_fallback, select), so each action has a headless twin in the session
and the CLI. The tab only reads stored results (``controller.latest_sensitivity()``,
``controller.latest_fallback()``) and the layer decisions, to draw them.

Layout: run controls on top; a sorted horizontal bar chart (one bar per unit, the most sensitive on
top) beside a sortable table; "leave the worst N in float"; below them the fallback search
(:mod:`workbench.app.fallback_panel`).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QItemSelection, QItemSelectionModel, QObject, QPointF, Qt, QTimer, Slot
from PySide6.QtGui import QCursor, QFontMetrics, QPalette, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableView,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from workbench.analysis.metrics import DEFAULT_METRIC, builtin_metric_labels
from workbench.analysis.results import SensitivityResult, UnitResult
from workbench.app.controller import Controller
from workbench.app.controller_edits import UPDATE_JOB
from workbench.app.controller_jobs import CALIBRATION_JOB, FALLBACK_JOB, LADDER_JOB, SENSITIVITY_JOB
from workbench.app.fallback_panel import FallbackPanel
from workbench.app.formatting import count_text, elide_name, format_delta, format_number, job_count_text, job_times_text
from workbench.app.plot_style import style_plot
from workbench.app.sensitivity_bars import (
    FLOAT,
    NEUTRAL,
    SELECTED_PEN,
    bar_colour,
    finite_clip,
    sensitivity_scores,
    table_row,
)
from workbench.app.tree_layout import FrontElidedDelegate

__all__ = ["SensitivityTab", "BUILTIN_METRIC_LABELS"]

# The metrics offered besides the project's own; top-1 only when the evaluation data has labels.
BUILTIN_METRIC_LABELS: dict[str, str] = builtin_metric_labels()
SCHEME_LABELS = {
    "one-off": "one-off: all quantized, one unit at a time in float",
    "one-on": "one-on: all float, one unit at a time quantized",
}
JOB_NAMES = (SENSITIVITY_JOB, FALLBACK_JOB, LADDER_JOB)  # the tab's own jobs: their progress shows in the tab
APPLY_JOBS = (UPDATE_JOB, CALIBRATION_JOB)  # what an Apply of the tab starts: shown in the tab while it applies
VISIBLE_BARS = 30          # rows the chart shows at once; the wheel scrolls through the rest
VALUE_LABELS_UP_TO = 40    # numbers at the end of the bars only while they stay readable
LABEL_WIDTH_PX = 220       # unit names longer than this are elided at the front, keeping the block index
LABEL_SHARE_MAX = 0.4      # ... and than this share of the chart's width: the bars keep the rest (a GPT-2's names
                           # took 150 of the chart's 266 px beside the table, its bars were 70 px and their values cut)
UNIT_COLUMN_MAX_PX = 460   # the table's Unit column: sized to its names up to this, then elided at the front
UNIT_COLUMN_MIN_PX = 120   # ... and never narrower than this in a narrow tab
CHART_MIN_HEIGHT = 240   # px: the bar chart (and its worst-units row) keeps room for a readable few bars
TABLE_SHARE_MAX = 0.6      # the table takes the room its columns need beside the chart, up to this share

class SensitivityTab(QWidget):
    """Sensitivity analysis and fallback search over the controller.

    Attributes a test or the main window may use: ``chart`` (pyqtgraph PlotWidget of the bars),
    ``bars`` (its BarGraphItem), ``table`` (QTableView), ``table_model``, ``fallback_panel`` (the
    :class:`FallbackPanel` below them); :meth:`bar_clicked` is what a click on a bar calls.
    """

    COLUMNS = ("Unit", "Metric", "Δ vs quantized", "Δ vs FP32", "Rank")

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.result: SensitivityResult | None = None
        self.chart_units: list[UnitResult] = []      # in chart order: rank 1 first (on top)
        self._scores: dict[str, float] = {}
        self._layers: dict[str, list[str]] = {}      # unit name -> layers it switches
        self._value_labels: list[pg.TextItem] = []
        self._bar_span = (0.0, 1.0)  # the bars' value range (their numbers' room is added on the right)
        self._syncing = False                        # True while the view follows the controller
        self._build()
        controller.session_changed.connect(self._on_session_changed)
        controller.sensitivity_changed.connect(self.refresh)
        controller.selection_changed.connect(self._follow_selection)
        controller.layers_changed.connect(self._decisions_changed)
        controller.busy_changed.connect(self._busy_changed)
        controller.jobs.started.connect(self._job_started)
        controller.jobs.progress.connect(self._job_progress)
        self._on_session_changed()

    # ----- construction ---------------------------------------------------------------------------

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)

        # run controls
        controls = QHBoxLayout()
        self.scheme_box = QComboBox()
        for key, label in SCHEME_LABELS.items():
            self.scheme_box.addItem(key, key)
            self.scheme_box.setItemData(self.scheme_box.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
        self.scheme_box.setToolTip("one-off: how much leaving each unit in float regains;\n"
                                   "one-on: how much quantizing each unit alone loses")
        self.metric_box = QComboBox()
        self.metric_box.setToolTip("The number each unit is ranked by (top-1 needs labelled evaluation data)")
        self.metric_box.currentIndexChanged.connect(self._metric_changed)
        self.batches_spin = QSpinBox()
        self.batches_spin.setRange(0, 100000)
        self.batches_spin.setSpecialValueText("all")
        self.batches_spin.setToolTip("Evaluation batches per pass (all: every batch of the evaluation data)")
        self.run_button = QPushButton("Run sensitivity")
        self.run_button.clicked.connect(self.run_sensitivity)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.controller.cancel_job)
        self.cancel_button.setEnabled(False)
        # the job's one count and clock, as the status bar shows them (one formula, one reading)
        self.progress = QProgressBar()
        self.progress.setMinimumWidth(QFontMetrics(self.font()).horizontalAdvance(
            "888/888 · 88 min 88 s elapsed · ETA 88 min 88 s") + 24)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self._job_clock = QTimer(self)
        self._job_clock.setInterval(500)
        self._job_clock.timeout.connect(self._show_job_progress)
        self._job_started_at = time.monotonic()
        self._last_progress: Any = None
        for label, widget in (("Scheme", self.scheme_box), ("Metric", self.metric_box),
                              ("Batches", self.batches_spin)):
            controls.addWidget(QLabel(label))
            controls.addWidget(widget)
        controls.addWidget(self.run_button)
        controls.addWidget(self.cancel_button)
        controls.addStretch(1)
        layout.addLayout(controls)
        # the job's progress on a row of its own: in the controls' row its width (shown only while a job runs)
        # widened the whole tab, and the window took that width from the model tree's dock after every run
        layout.addWidget(self.progress)
        self.summary_label = QLabel()
        self.summary_label.setWordWrap(True)
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary_label)

        splitter = QSplitter(Qt.Orientation.Vertical)
        layout.addWidget(splitter, 1)

        # chart and table
        top = QSplitter(Qt.Orientation.Horizontal)
        self.chart = pg.PlotWidget()
        style_plot(self.chart)
        self.chart.setMouseEnabled(x=False, y=True)
        self.chart.invertY(True)  # rank 1 on top
        self.chart.hideButtons()
        self.chart.setMenuEnabled(False)
        self.chart.getAxis("left").setStyle(tickLength=0)
        # pyqtgraph 0.14 fails on empty pens/brushes lists: start with shared ones
        self.bars = pg.BarGraphItem(x0=[], y=[], height=0.72, width=[], pen=None, brush=NEUTRAL)
        self.chart.addItem(self.bars)
        self.chart.scene().sigMouseClicked.connect(self._chart_clicked)
        self.chart.scene().sigMouseMoved.connect(self._chart_hovered)
        self.chart.installEventFilter(self)  # its names and values are fitted to its width whenever that changes
        top.addWidget(self.chart)

        self.table_model = QStandardItemModel(0, len(self.COLUMNS), self)
        self.table_model.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.table_model.setSortRole(Qt.ItemDataRole.UserRole)
        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideLeft)  # a narrow Unit column keeps the layer's end
        self.table.setItemDelegateForColumn(0, FrontElidedDelegate(self.table))  # ... and its block index
        header = self.table.horizontalHeader()
        # the Unit column sized to its names (_fit_table), not squeezed to what the number columns leave over
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        for column in range(1, len(self.COLUMNS) - 1):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        # the last (Rank) fills what is left: sized to its contents by _fit_table, stretched by the header
        header.setSectionResizeMode(len(self.COLUMNS) - 1, QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.table.selectionModel().selectionChanged.connect(self._table_selection_changed)
        top.addWidget(self.table)
        top.setStretchFactor(0, 1)  # a wider tab widens the chart; the table keeps what its columns need
        top.setStretchFactor(1, 0)
        top.setSizes([600, 500])
        self.chart_table_splitter = top
        self._table_sized_by_user = False  # a splitter the user dragged stays where it was put
        top.splitterMoved.connect(self._table_resized_by_user)

        chart_panel = QWidget()
        chart_layout = QVBoxLayout(chart_panel)
        chart_layout.setContentsMargins(0, 0, 0, 0)
        chart_layout.addWidget(top, 1)
        worst = QHBoxLayout()
        self.worst_spin = QSpinBox()
        self.worst_spin.setRange(1, 1)
        self.worst_spin.valueChanged.connect(self._update_worst_button)
        self.ignore_button = QPushButton("Leave the worst 1 in float")
        self.ignore_button.setToolTip("Untick the most sensitive units (their layers stay in float on export)")
        self.ignore_button.clicked.connect(self.ignore_worst)
        worst.addWidget(QLabel("Ignore the worst"))
        worst.addWidget(self.worst_spin)
        worst.addWidget(self.ignore_button)
        self.ignore_label = QLabel()
        self.ignore_label.setWordWrap(True)
        worst.addWidget(self.ignore_label, 1)
        chart_layout.addLayout(worst)
        splitter.addWidget(chart_panel)

        self.fallback_panel = FallbackPanel(self.controller, self.current_metric, lambda: self.result)
        # a fallback or ladder result (its text, its plot) must not squeeze the bar chart to a few pixels: the
        # panel scrolls within what the splitter gives it, and the chart keeps room for its labels
        fallback_area = QScrollArea()
        fallback_area.setWidget(self.fallback_panel)
        fallback_area.setWidgetResizable(True)
        fallback_area.setFrameShape(QFrame.Shape.NoFrame)
        fallback_area.setMinimumHeight(160)
        chart_panel.setMinimumHeight(CHART_MIN_HEIGHT)
        splitter.addWidget(fallback_area)
        splitter.setChildrenCollapsible(False)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 0)
        splitter.setSizes([520, 300])
        self.chart_splitter = splitter

    # ----- session and results ------------------------------------------------------------------

    @property
    def session(self) -> Any:
        return self.controller.session

    @Slot()
    def _on_session_changed(self) -> None:
        self._fill_metric_box()
        self.refresh()
        self._busy_changed(self.controller.busy)

    def _fill_metric_box(self) -> None:
        """Built-in metrics (top-1 only with labels) plus the project's own when it is user code."""
        self.metric_box.blockSignals(True)
        self.metric_box.clear()
        project_metric, has_labels = DEFAULT_METRIC, False
        if self.session is not None:
            project_metric = self.session.settings.metric.name
            try:
                has_labels = self.controller.evaluation_has_labels()
            except Exception as error:  # noqa: BLE001 - missing data: the analysis itself will say so
                self.controller.log.emit("warning", f"evaluation data: {error}")
        for key, label in BUILTIN_METRIC_LABELS.items():
            if key == "top1" and not has_labels:
                continue
            self.metric_box.addItem(label, key)
        if project_metric not in BUILTIN_METRIC_LABELS:
            self.metric_box.addItem(f"project: {project_metric}", None)  # None: the session's metric()
        index = self.metric_box.findData(project_metric if project_metric in BUILTIN_METRIC_LABELS else None)
        self.metric_box.setCurrentIndex(max(index, 0))
        self.metric_box.blockSignals(False)
        self._metric_changed()

    def current_metric(self) -> str | None:
        """The metric the next run uses: a built-in name, or None for the project's metric."""
        return self.metric_box.currentData()

    @Slot()
    def refresh(self) -> None:
        """Show the latest stored sensitivity result (after a run, or when a project opens)."""
        result = None
        if self.session is not None:
            try:
                result = self.controller.latest_sensitivity()
            except Exception as error:  # noqa: BLE001 - a stored result from another version, say
                self.controller.error.emit("Stored sensitivity result", f"Could not read it: {error}", "")
        self.show_result(result)

    def show_result(self, result: SensitivityResult | None) -> None:
        """Draw ``result`` as bars and table rows (None clears both)."""
        # the same result redrawn (layer decisions changed): keep where the user scrolled and sorted
        same = result is not None and result is self.result
        self.result = result
        self.chart_units = result.ranked() if result is not None else []
        self._layers = {}
        if result is not None and self.session is not None:
            for unit in result.units:
                self._layers[unit.name] = self.controller.layers_of(unit) or [unit.name]
        scores, title = sensitivity_scores(result) if result is not None else ([], "")
        self._scores = {u.name: s for u, s in zip(result.units, scores)} if result is not None else {}
        self._draw_bars(title, keep_view=same)
        self._fill_table(keep_sort=same)
        self._update_summary()
        count = len(self.chart_units)
        self.worst_spin.setRange(1, max(count, 1))
        self._update_worst_button()
        self._busy_changed(self.controller.busy)
        self._follow_selection(self.controller.selection)

    def _update_summary(self) -> None:
        result = self.result
        if result is None:
            self.summary_label.setText("No sensitivity run yet: calibrate, then Run sensitivity to rank the "
                                       "quantized units by how much they cost the metric.")
            return
        partial = "" if result.complete else " <b>(cancelled: partial result)</b>"
        self.summary_label.setText(
            f"<b>{result.scheme}</b> by <b>{result.metric_name}</b> "
            f"({'higher' if result.higher_is_better else 'lower'} is better): FP32 {format_number(result.fp32)}, "
            f"all quantized {format_number(result.quantized)} &middot; {count_text(len(result.units), 'unit')} "
            "&middot; "
            f"{count_text(result.num_batches, 'batch', 'batches')} &middot; {result.wall_time_s:.2f} s{partial}")

    def _is_float(self, unit: UnitResult) -> bool:
        """Whether every layer of the unit is now left in float (drawn apart: it is already dealt with)."""
        if self.session is None:
            return False
        decisions = self.session.project.layers
        layers = [layer for layer in self._layers.get(unit.name, []) if layer in decisions]
        return bool(layers) and all(not decisions[layer].quantize for layer in layers)

    def _draw_bars(self, title: str, keep_view: bool = False) -> None:
        for item in self._value_labels:
            self.chart.removeItem(item)
        self._value_labels = []
        units = self.chart_units
        raw = [self._scores.get(u.name, 0.0) for u in units]
        widths, _ = finite_clip(raw)
        positive = [w for w in widths if w > 0]
        high = max(positive) if positive else 1.0
        brushes, pens = [], []
        for unit, width in zip(units, widths):
            colour = FLOAT if self._is_float(unit) else (bar_colour(width / high) if width > 0 else NEUTRAL)
            brushes.append(pg.mkBrush(colour))
            pens.append(pg.mkPen(colour.darker(130), width=1))
        self.bars.setOpts(x0=np.zeros(len(units)), y=np.arange(len(units), dtype=float),
                          width=np.asarray(widths, dtype=float), brushes=brushes or None, pens=pens or None,
                          pen=None, brush=NEUTRAL)
        self._bar_pens = pens
        self.chart.setLabel("bottom", title)
        low = min([0.0] + widths)
        span = (high if positive else 1.0) - low
        if len(units) <= VALUE_LABELS_UP_TO:
            for index, (width, score) in enumerate(zip(widths, raw)):
                text = pg.TextItem(format_delta(score) if math.isfinite(score) else format_number(score),
                                   color=self.palette().color(QPalette.ColorRole.Text), anchor=(0, 0.5))
                text.setPos(max(width, 0.0) + 0.01 * span, index)
                self.chart.addItem(text)
                self._value_labels.append(text)
        self._bar_span = (low, high if positive else 1.0)
        self._fit_chart_labels()
        self.chart.setLimits(xMin=None, xMax=None, yMin=-0.6, yMax=max(len(units), 1) - 0.4)
        if not keep_view:
            self.chart.setYRange(-0.6, min(len(units), VISIBLE_BARS) - 0.4, padding=0)

    def _fill_table(self, keep_sort: bool = False) -> None:
        header = self.table.horizontalHeader()
        column, order = header.sortIndicatorSection(), header.sortIndicatorOrder()
        if not keep_sort or not 0 <= column < len(self.COLUMNS):
            column, order = 4, Qt.SortOrder.AscendingOrder  # by rank
        self.table.setSortingEnabled(False)
        self.table_model.removeRows(0, self.table_model.rowCount())
        result = self.result
        metric = result.metric_name if result is not None else "Metric"
        self.table_model.setHorizontalHeaderLabels(["Unit", metric, "Δ vs quantized", "Δ vs FP32", "Rank"])
        # SQNR against FP32 is infinite: every delta to it would read -inf, so the column goes
        self.table.setColumnHidden(3, result is not None and not math.isfinite(result.fp32))
        for unit in self.chart_units:
            self.table_model.appendRow(table_row(unit, self._layers.get(unit.name, []), self._is_float(unit)))
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(column, order)
        self._fit_table()

    def unit_column_width(self) -> int:
        """The Unit column's width for the names shown: the widest, up to :data:`UNIT_COLUMN_MAX_PX` (longer
        ones are elided at the front, keeping the layer's end; the tooltip has the full path)."""
        metrics = self.table.fontMetrics()
        padding = 2 * self.table.style().pixelMetric(self.table.style().PixelMetric.PM_FocusFrameHMargin) + 16
        widest = max((metrics.horizontalAdvance(self.table_model.item(row, 0).text())
                      for row in range(self.table_model.rowCount())), default=0)
        least = self.table.horizontalHeader().fontMetrics().horizontalAdvance("Unit") + 24
        return min(UNIT_COLUMN_MAX_PX, max(least, widest + padding))

    def _fit_chart_labels(self) -> None:
        """Name the bars within :data:`LABEL_SHARE_MAX` of the chart's width (elided at the front), and leave room on
        the right for the longest value, in pixels: at any width the bars and their numbers stay readable."""
        units = self.chart_units
        axis = self.chart.getAxis("left")
        metrics = QFontMetrics(axis.font())
        limit = max(60, min(LABEL_WIDTH_PX, int(self.chart.width() * LABEL_SHARE_MAX)))
        while True:  # wider only as far as every unit still tells itself apart ("…0.….dense" twice in a BERT)
            def fits(text: str, limit: int = limit) -> bool:
                return metrics.horizontalAdvance(text) <= limit

            labels = [(float(i), elide_name(u.name, fits)) for i, u in enumerate(units)]
            if limit >= LABEL_WIDTH_PX or len({text for _, text in labels}) == len(labels):
                break
            limit = min(LABEL_WIDTH_PX, limit + 20)
        axis.setTicks([labels, []])
        widest = max((metrics.horizontalAdvance(text) for _, text in labels), default=40)
        axis.setWidth(min(widest, limit) + 14)
        low, high = self._bar_span
        span = high - low
        if not units:
            self.chart.setXRange(0.0, 1.0, padding=0)
            return
        # each number sits right of its bar: the range ends where the one reaching furthest ends, in the plot's own
        # pixels (a fixed 22% cut "+7.75" to "+" in a narrow plot, and a share for the widest number wasted room)
        plot_px = max(self.chart.width() - axis.width() - 36, 40)  # less the plot's margins and frame
        start = low - 0.02 * span
        end = high + 0.05 * span
        for item in self._value_labels:
            text_px = item.textItem.boundingRect().width() + 16
            reach = item.pos().x() - start
            end = max(end, start + reach / max(1.0 - text_px / plot_px, 0.25))
        self.chart.setXRange(start, end, padding=0)

    def _fit_table(self) -> None:
        """Give the table the room its columns need beside the chart (up to :data:`TABLE_SHARE_MAX` of the tab),
        and the Unit column its names' width, or what is left in a narrow tab (never a horizontal scroll that
        hides the names when a row is selected); the names are elided at the front."""
        for column in range(1, len(self.COLUMNS)):
            self.table.resizeColumnToContents(column)
        header = self.table.horizontalHeader()
        others = sum(header.sectionSize(c) for c in range(1, len(self.COLUMNS)) if not header.isSectionHidden(c))
        chrome = self.table.verticalScrollBar().sizeHint().width() + 2 * self.table.frameWidth() + 6  # + grid
        wanted = self.unit_column_width()
        total = sum(self.chart_table_splitter.sizes())
        if total <= 0:  # not laid out yet: showEvent fits it again
            self.table.setColumnWidth(0, wanted)
            return
        table = min(wanted + others + chrome, int(total * TABLE_SHARE_MAX))
        if not self._table_sized_by_user:
            self.chart_table_splitter.setSizes([total - table, table])
        else:
            table = self.chart_table_splitter.sizes()[1]
        self.table.setColumnWidth(0, max(UNIT_COLUMN_MIN_PX, min(wanted, table - others - chrome)))

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._fit_table()  # a dock widened or narrowed beside the tab

    def _table_resized_by_user(self, *_args: Any) -> None:
        self._table_sized_by_user = True
        self._fit_table()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        # getattr: Qt delivers events to the filter while the tab is still being built (PySide6 6.11), before
        # ``chart`` exists
        if watched is getattr(self, "chart", None) and event.type() == QEvent.Type.Resize:
            self._fit_chart_labels()  # the splitter gave the chart another width (after the tab's own resize)
        return super().eventFilter(watched, event)

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self._fit_table()  # the splitter has its real width only now

    # ----- selection ----------------------------------------------------------------------------

    def bar_clicked(self, index: int) -> None:
        """Select the layers of the unit drawn at ``index`` (0: the top bar, the most sensitive)."""
        if 0 <= index < len(self.chart_units):
            self.controller.select(self._layers.get(self.chart_units[index].name, []))

    def _row_at(self, scene_pos: QPointF) -> int | None:
        """The bar row under a scene position: on the bar, right of it, or on its label."""
        view = self.chart.getPlotItem().getViewBox()
        axis = self.chart.getAxis("left")
        in_view = view.sceneBoundingRect().contains(scene_pos)
        on_axis = axis.sceneBoundingRect().contains(scene_pos)
        if not (in_view or on_axis):
            return None
        row = int(round(view.mapSceneToView(scene_pos).y()))
        return row if 0 <= row < len(self.chart_units) else None

    def _chart_clicked(self, event: Any) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        row = self._row_at(event.scenePos())
        if row is not None:
            event.accept()
            self.bar_clicked(row)

    def _chart_hovered(self, scene_pos: QPointF) -> None:
        row = self._row_at(scene_pos)
        if row is None or self.result is None:
            QToolTip.hideText()
            return
        unit = self.chart_units[row]
        QToolTip.showText(QCursor.pos(), (
            f"<b>{unit.name}</b> (rank {unit.rank})<br>{self.result.metric_name}: {format_number(unit.value)}"
            f"<br>Δ vs all quantized: {format_delta(unit.delta_vs_quantized)}"
            f"<br>Δ vs FP32: {format_delta(unit.delta_vs_fp32)}<br>layers: {', '.join(self._layers[unit.name])}"),
            self.chart)

    def _table_selection_changed(self, *_: Any) -> None:
        if self._syncing:
            return
        names: list[str] = []
        for index in self.table.selectionModel().selectedRows(0):
            names += self._layers.get(str(index.data(Qt.ItemDataRole.UserRole)), [])
        if names:
            self.controller.select(list(dict.fromkeys(names)))

    @Slot(list)
    def _follow_selection(self, names: list[str]) -> None:
        """Highlight the units of the selected layers in the chart and the table."""
        chosen = set(names)
        hit = [i for i, u in enumerate(self.chart_units) if chosen & set(self._layers.get(u.name, []))]
        pens = list(getattr(self, "_bar_pens", []))
        for i in hit:
            if i < len(pens):
                pens[i] = SELECTED_PEN
        if pens:
            self.bars.setOpts(pens=pens)
        self._syncing = True
        try:
            selection = QItemSelection()
            hit_names = {self.chart_units[i].name for i in hit}
            first = None
            for row in range(self.table_model.rowCount()):
                item = self.table_model.item(row, 0)
                if item.data(Qt.ItemDataRole.UserRole) in hit_names:
                    left = self.table_model.index(row, 0)
                    right = self.table_model.index(row, len(self.COLUMNS) - 1)
                    selection.select(left, right)
                    first = first or left
            self.table.selectionModel().select(selection, QItemSelectionModel.SelectionFlag.ClearAndSelect)
            if first is not None:
                self.table.scrollTo(first)
        finally:
            self._syncing = False
        if hit:  # bring the first selected bar into view when the chart is scrolled elsewhere
            view = self.chart.getPlotItem().getViewBox()
            low, high = view.viewRange()[1]
            if not low <= hit[0] <= high:
                rows = high - low
                start = max(-0.6, hit[0] - rows / 2)
                self.chart.setYRange(start, start + rows, padding=0)

    def selected_units(self) -> list[str]:
        """Units whose bars are highlighted (those holding a selected layer)."""
        chosen = set(self.controller.selection)
        return [u.name for u in self.chart_units if chosen & set(self._layers.get(u.name, []))]

    # ----- actions ------------------------------------------------------------------------------

    def run_sensitivity(self) -> bool:
        """Start a sensitivity run with the chosen scheme, metric and number of batches."""
        batches = self.batches_spin.value() or None
        return self.controller.sensitivity(scheme=self.scheme_box.currentData(), metric=self.current_metric(),
                                           num_batches=batches)

    def worst_layers(self, count: int) -> list[str]:
        """The layers of the ``count`` most sensitive units (in rank order)."""
        names: list[str] = []
        for unit in self.chart_units[:max(count, 0)]:
            names += self._layers.get(unit.name, [])
        return list(dict.fromkeys(names))

    def ignore_worst(self) -> list[str] | None:
        """Leave the worst N units' layers in float (through the controller, so the tree follows)."""
        layers = self.worst_layers(self.worst_spin.value())
        if not layers:
            return None
        changed = self.controller.set_quantize(layers, False)
        if changed is not None:
            self.ignore_label.setText(f"In float now: {', '.join(layers)}" if changed else
                                      f"Already in float: {', '.join(layers)}")
        return changed

    def _update_worst_button(self, *_: Any) -> None:
        count = self.worst_spin.value()
        self.ignore_button.setText(f"Leave the worst {count} in float")
        layers = self.worst_layers(count)
        self.ignore_button.setToolTip("Untick: " + ", ".join(layers) if layers else "Run sensitivity first")

    # ----- metric and goal ----------------------------------------------------------------------

    def _metric_changed(self, *_: Any) -> None:
        self.fallback_panel.metric_changed()

    # ----- state --------------------------------------------------------------------------------

    @Slot()
    def _decisions_changed(self) -> None:
        """Layers went to float or back: recolour their bars and mark their rows."""
        if self.result is not None:
            self.show_result(self.result)

    @Slot(bool)
    def _busy_changed(self, busy: bool) -> None:
        has_session = self.session is not None
        ours = busy and self._ours(self.controller.jobs.job_name)
        self.run_button.setEnabled(has_session and not busy)
        self.ignore_button.setEnabled(has_session and not busy and self.result is not None)
        self.cancel_button.setEnabled(ours)
        self.progress.setVisible(ours)
        if not busy:
            self._job_clock.stop()
            self.progress.reset()

    def _ours(self, name: str) -> bool:
        """Whether the job ``name``'s progress shows in the tab: its own jobs, and the model update and calibration
        an Apply of its search started (the Apply said nothing for seconds while they ran)."""
        return name in JOB_NAMES or (self.fallback_panel.applying and name in APPLY_JOBS)

    def _job_started(self, name: str) -> None:
        if not self._ours(name):
            return
        self._job_started_at = time.monotonic()
        self._last_progress = None
        self.progress.setRange(0, 0)  # a moving busy bar until the first report gives the count
        self._job_clock.start()
        self._show_job_progress()

    def _job_progress(self, progress: Any) -> None:
        if not self._ours(progress.name):
            return
        self._last_progress = progress
        self.progress.setVisible(True)
        if progress.total > 1:
            self.progress.setRange(0, progress.total)
            self.progress.setValue(min(progress.done, progress.total))
        else:
            self.progress.setRange(0, 0)
        self.progress.setToolTip(progress.message)
        self._show_job_progress()

    def _show_job_progress(self) -> None:
        """The count of the last report and the moving clock, in the words of the status bar."""
        if not self.controller.busy or not self._ours(self.controller.jobs.job_name):
            self._job_clock.stop()
            return
        progress = self._last_progress
        elapsed = time.monotonic() - self._job_started_at
        if progress is None:
            count, times = "", job_times_text(elapsed, None, 0.0)
        else:
            count = job_count_text(progress.done, progress.total)
            times = job_times_text(elapsed, progress.eta_s, elapsed - progress.elapsed_s)
        self.progress.setFormat(f"{count} · {times}" if count else times)
