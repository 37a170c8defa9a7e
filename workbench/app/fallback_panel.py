"""The fallback search panel of the sensitivity tab: the fewest units to leave in float.

The goal (a tolerance to FP32, or a target value), the search over the controller, and its curve of
metric against number of units left in float, with the FP32 line, the tolerance band and Apply. The
tab owns the metric choice and the sensitivity result; the panel asks it for both through the two
callables it is given, so the goal's defaults follow the metric and the last run.
"""
from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QWidget,
)

from workbench.analysis.goals import SUGGESTED_SQNR_GAIN_DB, tolerance_meaning
from workbench.analysis.ladder import DEFAULT_LADDER, LADDER_PRESETS, LadderResult, ladder_text, parse_ladder
from workbench.analysis.metrics import DEFAULT_METRIC, builtin_metric_name
from workbench.analysis.results import FallbackResult, SensitivityResult
from workbench.app.controller import Controller
from workbench.app.controller_jobs import CALIBRATION_JOB
from workbench.app.formatting import count_text, format_number
from workbench.app.plot_style import style_plot
from workbench.app.wheel_guard import guard_wheel

__all__ = ["FallbackPanel", "CURVE_LABELS_UP_TO"]

CURVE_LABELS_UP_TO = 12    # unit names along the fallback curve, while they stay readable
NO_SEARCH_TEXT = "Run a search to see how the metric recovers as units go back to float."


class FallbackPanel(QGroupBox):
    """The fallback search over the controller.

    ``metric()`` is the metric the next search uses (None: the project's own), ``sensitivity()`` the
    sensitivity result shown (its all-quantized value seeds the goal). Attributes a test may use:
    ``goal_box``, ``goal_spin``, ``max_units_spin``, ``fallback_button``, ``fallback_label``,
    ``apply_button``, ``fallback_plot``, ``fallback_curve``, ``fallback_band``, ``fp32_line``,
    ``target_line``, ``chosen_marker``; ``result`` is the search shown.
    """

    def __init__(self, controller: Controller, metric: Callable[[], str | None],
                 sensitivity: Callable[[], SensitivityResult | None], parent: QWidget | None = None) -> None:
        super().__init__("Fallback search: the fewest units to leave in float", parent)
        self.controller = controller
        self._metric = metric
        self._sensitivity = sensitivity
        self.result: FallbackResult | None = None
        self.ladder_result: LadderResult | None = None
        self._curve_labels: list[pg.TextItem] = []
        # an Apply is under way: its edit, then the model update and calibration it starts (busy cursor meanwhile)
        self.applying = False
        self._build()
        controller.session_changed.connect(self._on_session_changed)
        controller.fallback_changed.connect(self.show_fallback)
        controller.ladder_changed.connect(self.show_ladder)
        controller.search_partial.connect(self._show_partial)
        controller.busy_changed.connect(self._busy_changed)
        self._on_session_changed()

    def _build(self) -> None:
        group_layout = QHBoxLayout(self)
        form = QFormLayout()
        self.goal_box = QComboBox()
        self.goal_box.addItem("within a tolerance of FP32", "tolerance")
        self.goal_box.addItem("reach a target value", "target")
        self.goal_box.addItem("best metric within a weight budget (bytes)", "budget_bytes")
        self.goal_box.currentIndexChanged.connect(self._goal_changed)
        self.goal_spin = QDoubleSpinBox()
        self.goal_spin.setDecimals(4)
        self.goal_spin.setRange(-1e9, 1e9)
        self.goal_spin.setSingleStep(0.01)
        self.max_units_spin = QSpinBox()
        self.max_units_spin.setRange(0, 100000)
        self.max_units_spin.setSpecialValueText("no limit")
        self.fallback_button = QPushButton("Search")
        self.fallback_button.clicked.connect(self.run_fallback)
        self.goal_label = QLabel("Tolerance")
        # the ladder of precisions, cheapest first (int8,float: the fallback search)
        self.ladder_box = QComboBox()
        self.ladder_box.setEditable(True)
        self.ladder_box.addItems(list(LADDER_PRESETS))
        self.ladder_box.setToolTip("Precisions each unit may take, cheapest first: every unit starts on the first "
                                   "and climbs one rung per pass until the goal is met (int8,float: leave layers in "
                                   "float)")
        form.addRow("Ladder", self.ladder_box)
        form.addRow("Goal", self.goal_box)
        form.addRow(self.goal_label, self.goal_spin)
        form.addRow("Max units", self.max_units_spin)
        self.revisit_box = QCheckBox("Search layers set by hand too")
        self.revisit_box.setToolTip("A ladder keeps the layers whose precision or descriptors you set by hand "
                                    "(pins); tick to let it search them too")
        form.addRow(self.revisit_box)
        # the panel sits in the tab's scrolled pane: a wheel turn on the way down must not change the goal
        guard_wheel(self.ladder_box, self.goal_box, self.goal_spin, self.max_units_spin)
        form.addRow(self.fallback_button)
        self.fallback_label = QLabel(NO_SEARCH_TEXT)
        self.fallback_label.setWordWrap(True)
        self.fallback_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.fallback_label.setMinimumWidth(220)
        self.fallback_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self.fallback_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.apply_button = QPushButton("Apply")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self.apply_fallback)
        # the ladder's Apply can be undone (the layers' decisions from before it come back)
        self.undo_apply_button = QPushButton("Undo apply")
        self.undo_apply_button.setEnabled(False)
        self.undo_apply_button.setToolTip("Put the layers back as they were before the ladder's Apply")
        self.undo_apply_button.clicked.connect(self.undo_apply)
        # asked before an Apply overrides layers the user set by hand: "all", "keep" (their edits) or None (cancel)
        self.ask_override: Callable[[list[Any], list[Any]], str | None] = self._ask_override
        # Apply right under Search, above the result's text: a long text (a ladder's notes) pushed it out of the
        # scrolled pane's view, and a click there missed it (seen with real input under Xvfb)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button, 1)
        buttons.addWidget(self.undo_apply_button)
        form.addRow(buttons)
        form.addRow(self.fallback_label)
        left = QWidget()
        left.setLayout(form)
        left.setMaximumWidth(340)
        group_layout.addWidget(left)
        self.fallback_plot = pg.PlotWidget()
        style_plot(self.fallback_plot)
        self.fallback_plot.setLabel("bottom", "units left in float")
        self.fallback_plot.hideButtons()
        self.fallback_plot.getAxis("bottom").setTickSpacing(1, 1)
        self.fallback_band = pg.LinearRegionItem(orientation="horizontal", movable=False,
                                                 brush=pg.mkBrush(60, 170, 90, 45), pen=pg.mkPen(None))
        self.fallback_band.setZValue(-10)
        self.fp32_line = pg.InfiniteLine(angle=0, pen=pg.mkPen(QColor(60, 60, 60), width=1.5,
                                                               style=Qt.PenStyle.DashLine),
                                         label="FP32", labelOpts={"position": 0.95, "color": (60, 60, 60)})
        self.target_line = pg.InfiniteLine(angle=0, pen=pg.mkPen(QColor(40, 140, 70), width=1.5,
                                                                 style=Qt.PenStyle.DotLine),
                                           label="target", labelOpts={"position": 0.95, "color": (40, 140, 70)})
        self.fallback_curve = pg.PlotDataItem([], [], pen=pg.mkPen(QColor(30, 100, 190), width=2), symbol="o",
                                              symbolSize=8, symbolBrush=QColor(30, 100, 190))
        self.chosen_marker = pg.ScatterPlotItem(size=16, symbol="star", pen=pg.mkPen(None))
        for item in (self.fallback_band, self.fp32_line, self.target_line, self.fallback_curve, self.chosen_marker):
            self.fallback_plot.addItem(item)
        group_layout.addWidget(self.fallback_plot, 1)
        # a ladder search: the metric against the weight bytes of each mix tried
        self.ladder_plot = pg.PlotWidget()
        style_plot(self.ladder_plot)
        self.ladder_plot.setLabel("bottom", "weight bytes")
        self.ladder_plot.hideButtons()
        self.ladder_curve = pg.PlotDataItem([], [], pen=pg.mkPen(QColor(30, 100, 190), width=2), symbol="o",
                                            symbolSize=8, symbolBrush=QColor(30, 100, 190))
        self.ladder_undone = pg.ScatterPlotItem(size=8, symbol="x", pen=pg.mkPen(QColor(150, 150, 150)),
                                                brush=pg.mkBrush(150, 150, 150))
        self.ladder_target = pg.InfiniteLine(angle=0, pen=pg.mkPen(QColor(40, 140, 70), width=1.5,
                                                                   style=Qt.PenStyle.DotLine),
                                             label="target", labelOpts={"position": 0.05, "color": (40, 140, 70)})
        self.ladder_budget = pg.InfiniteLine(angle=90, pen=pg.mkPen(QColor(200, 120, 30), width=1.5,
                                                                    style=Qt.PenStyle.DotLine),
                                             label="budget", labelOpts={"position": 0.9, "color": (200, 120, 30)})
        self.ladder_marker = pg.ScatterPlotItem(size=16, symbol="star", pen=pg.mkPen(None))
        for item in (self.ladder_curve, self.ladder_undone, self.ladder_target, self.ladder_budget,
                     self.ladder_marker):
            self.ladder_plot.addItem(item)
        # what each kind of point is: a legend, not a guess (pyqtgraph lists the items given a name). Under the
        # plot, in the plot item's own layout, one row: inside the plot it sat in a corner over a point
        self.ladder_legend = pg.LegendItem(labelTextSize="8pt", colCount=3,
                                           labelTextColor=self.palette().color(QPalette.ColorRole.Text))
        plot_item = self.ladder_plot.getPlotItem()
        plot_item.layout.addItem(self.ladder_legend, 4, 1)
        # (the target and budget lines carry their own labels: a legend sample of an InfiniteLine crashes)
        for item, name in ((self.ladder_curve, "mixes kept"), (self.ladder_undone, "steps undone (worse)"),
                           (self.ladder_marker, "mix chosen")):
            self.ladder_legend.addItem(item, name)
        # one row where the chart is wide enough, else as many columns as fit (one row was cut off at the right:
        # the legend's width held the plot item wider than the chart showed)
        self.ladder_plot.installEventFilter(self)
        group_layout.addWidget(self.ladder_plot, 1)
        self.ladder_plot.hide()
        self._clear_fallback_plot()

    def eventFilter(self, watched: Any, event: QEvent) -> bool:
        # (Qt may call it before the chart is made: the group box filters some of its children's events itself)
        if event.type() == QEvent.Type.Resize and watched is getattr(self, "ladder_plot", None):
            self._fit_legend(event.size().width())  # (delivered before the chart and its viewport take the size)
        return super().eventFilter(watched, event)

    def _fit_legend(self, width: int) -> None:
        """The most columns whose rows fit a chart ``width`` wide beside the left axis (each entry: its sample, its
        label and a gap)."""
        entries = [sample.width() + label.width() + 8 for sample, label in self.ladder_legend.items]
        room = width - 2 * self.ladder_plot.frameWidth() - self.ladder_plot.getPlotItem().getAxis("left").width() - 8
        columns = next((n for n in range(len(entries), 1, -1)
                        if max(sum(entries[i:i + n]) for i in range(0, len(entries), n)) <= room), 1)
        self.ladder_legend.setColumnCount(columns)

    # ----- session and state --------------------------------------------------------------------

    @Slot()
    def _on_session_changed(self) -> None:
        self.undo_apply_button.setEnabled(False)  # another project: the undo belonged to the one before
        if self.applying:  # another project: the Apply under way belonged to the one before
            self.applying = False
            QApplication.restoreOverrideCursor()
        latest = ladder = None
        session = self.controller.session
        if session is not None:
            try:
                latest = self.controller.latest_fallback()
                ladder = self.controller.latest_ladder()
            except Exception as error:  # noqa: BLE001 - an unreadable stored result must not stop the tab
                self.controller.error.emit("Stored fallback search", f"Could not read it: {error}", "")
        self.show_fallback(latest)
        self.ladder_result = ladder
        records = session.project.fallbacks if session is not None else []
        if ladder is not None and records and records[-1].data.get("format") == ladder.to_dict()["format"]:
            self.show_ladder(ladder)  # the last search was a ladder: show it
        self._busy_changed(self.controller.busy)

    @Slot(bool)
    def _busy_changed(self, busy: bool) -> None:
        self.fallback_button.setEnabled(self.controller.session is not None and not busy)
        if self.applying and not busy:
            # the calibration an Apply asked for starts right after the model update ends: look once it had its turn
            QTimer.singleShot(0, self._end_applying)
        if self.ladder_result is not None and not self.ladder_plot.isHidden():
            self._update_ladder_text()
        elif self.result is not None:
            self._update_fallback_text()

    # ----- actions ------------------------------------------------------------------------------

    def fallback_options(self) -> dict[str, Any]:
        """The keyword arguments of the next fallback search (as controller.fallback takes them)."""
        options: dict[str, Any] = {"metric": self._metric(),
                                   "max_units": self.max_units_spin.value() or None}
        options[self.goal_box.currentData()] = float(self.goal_spin.value())
        return options

    def ladder(self) -> str:
        """The ladder typed or chosen, checked (ValueError names what is wrong)."""
        return ladder_text(parse_ladder(self.ladder_box.currentText()))

    def run_fallback(self) -> bool:
        """Start the search: the fallback search for the ``int8,float`` ladder and a tolerance or target, the
        ladder search otherwise (both follow the latest sensitivity ranking when there is one)."""
        try:
            ladder = self.ladder()
        except ValueError as error:
            self.controller.error.emit("Ladder", str(error), "")
            return False
        options = self.fallback_options()
        if ladder == ladder_text(DEFAULT_LADDER) and "budget_bytes" not in options:
            return self.controller.fallback(**options)
        options.pop("max_units", None)
        options["revisit_pins"] = self.revisit_box.isChecked()
        if "budget_bytes" in options:
            options["budget_bytes"] = int(options["budget_bytes"])
        return self.controller.ladder(ladder=ladder, **options)

    def apply_fallback(self) -> list[str] | None:
        """Leave the searched set in float (a ladder search: every layer to its precision, then calibrate)."""
        if self.ladder_result is not None and not self.ladder_plot.isHidden():
            return self.apply_ladder()
        if self.result is None or not self.result.chosen:
            return None
        self._start_applying()
        changed = self.controller.apply_fallback(self.result)
        if changed is not None:
            self.result.applied = True
        self._end_applying()  # at once, unless the edit's model update runs in the background
        return changed

    def apply_ladder(self) -> list[str] | None:
        """Set the layers whose precision the ladder's mix changes (listed on the button and in its tooltip), asking
        first when that overrides layers set by hand; then calibrate the new precisions. Undo puts them back."""
        result = self.ladder_result
        if result is None or result.applied:
            return None
        changes = self.controller.ladder_changes(result)
        hand = [c for c in changes if c.hand_set]
        keep = False
        if hand:
            answer = self.ask_override(hand, changes)
            if answer is None:
                return None
            keep = answer == "keep"
        self._start_applying()
        applied = self.controller.apply_ladder(result, keep_hand_edits=keep)
        if applied is None:
            self._end_applying()
            return None
        result.applied = True
        self.undo_apply_button.setEnabled(True)
        if applied and any(c.then not in ("float", "custom") for c in applied):
            self.controller.calibrate_applied()  # the new precisions' ranges (only the layers that changed)
        self._end_applying()  # at once, unless the model update or the calibration runs in the background
        return [c.layer for c in applied]

    def _start_applying(self) -> None:
        """Say at once that Apply works: a busy cursor, and the text says so, until its edit, the model update
        and the calibration it starts are done (they took seconds with nothing shown)."""
        if not self.applying:
            QApplication.setOverrideCursor(Qt.CursorShape.BusyCursor)
        self.applying = True
        self._update_text()
        self.fallback_label.repaint()  # the edit itself runs before the event loop draws again

    @Slot()
    def _end_applying(self) -> None:
        """Apply is done once no job it started is running (the model update, then the calibration)."""
        if not self.applying or self.controller.busy:
            self._update_text()
            return
        self.applying = False
        QApplication.restoreOverrideCursor()
        self._update_text()

    def _update_text(self) -> None:
        if self.ladder_result is not None and not self.ladder_plot.isHidden():
            self._update_ladder_text()
        else:
            self._update_fallback_text()

    def _applying_text(self) -> str:
        if not self.applying:
            return ""
        job = self.controller.jobs.job_name if self.controller.busy else ""
        doing = {"": "setting the layers", CALIBRATION_JOB: "calibrating the new precisions"}.get(
            job, "updating the quantized model")
        return f"<b>Applying…</b> {doing} (the progress shows below).<br>"

    @Slot(object)
    def _show_partial(self, result: Any) -> None:
        """A running search's points so far: the chart fills as each measurement arrives."""
        if isinstance(result, LadderResult):
            self.show_ladder(result, partial=True)
        else:
            self.show_fallback(result)

    def undo_apply(self) -> list[str] | None:
        """Undo the ladder's last Apply: the layers' decisions come back, and the search can be applied again."""
        restored = self.controller.undo_ladder_apply()
        if restored is None:
            return None
        self.undo_apply_button.setEnabled(False)
        if self.ladder_result is not None:
            self.ladder_result.applied = False
            self._update_ladder_text()
        return restored

    def _ask_override(self, hand: list[Any], changes: list[Any]) -> str | None:
        """Ask whether Apply may override the layers set by hand: "all", "keep" (apply the rest) or None."""
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Apply the ladder's precisions")
        shown = "\n".join(c.text() for c in hand[:12]) + (f"\n... and {len(hand) - 12} more" if len(hand) > 12 else "")
        box.setText(f"Apply changes {count_text(len(changes), 'layer')}; {len(hand)} of them "
                    f"{'were' if len(hand) != 1 else 'was'} set by hand:\n{shown}")
        box.setInformativeText("Override the hand edits too, or keep them and apply the rest? (Undo apply puts "
                               "everything back.)")
        override = box.addButton("Override", QMessageBox.ButtonRole.AcceptRole)
        keep = box.addButton("Keep my edits", QMessageBox.ButtonRole.ActionRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        clicked = box.clickedButton()
        return "all" if clicked is override else "keep" if clicked is keep else None

    # ----- metric and goal ----------------------------------------------------------------------

    def metric_changed(self) -> None:
        """The tab's metric changed: FP32 SQNR is infinite, so with SQNR the goal starts as a target in dB, and a
        tolerance counts from the all-INT8 value (the rule the CLI follows: workbench.analysis.goals)."""
        is_sqnr = self._builtin_metric() == "sqnr"
        self.goal_box.setItemData(0, tolerance_meaning(is_sqnr), Qt.ItemDataRole.ToolTipRole)
        self.goal_box.setCurrentIndex(1 if is_sqnr else 0)
        self._goal_changed()
        result = self.result
        searched = str(result.metric.get("kind") or result.metric.get("name", "")) if result is not None else ""
        if result is not None and builtin_metric_name(searched) == self._builtin_metric():
            self._show_goal(result)  # the search shown was for this metric: its goal stays in view

    def _builtin_metric(self) -> str | None:
        """The built-in metric the next search uses (the tab's choice, else the project's), aliases resolved;
        None for a user's metric."""
        metric = self._metric()
        if metric is None:
            if self.controller.session is None:
                return DEFAULT_METRIC
            metric = self.controller.session.settings.metric.name
        return builtin_metric_name(metric)

    def _goal_changed(self, *_: Any) -> None:
        metric = self._builtin_metric()
        sensitivity = self._sensitivity()
        quantized = sensitivity.quantized if sensitivity is not None and math.isfinite(sensitivity.quantized) \
            else None
        self.goal_label.setToolTip("")
        if self.goal_box.currentData() == "budget_bytes":
            self.goal_label.setText("Budget (bytes)")
            session = self.controller.session
            params = sum(p.numel() for p in session.float_model.parameters()) if session is not None else 0
            self.goal_spin.setDecimals(0)
            self.goal_spin.setSingleStep(max(1024.0, params / 100))
            self.goal_spin.setValue(float(params))  # about one byte per weight: all 8-bit
            return
        if self.goal_box.currentData() == "target":
            self.goal_label.setText("Target")
            if metric == "sqnr":
                value = round(quantized + SUGGESTED_SQNR_GAIN_DB) if quantized is not None else 40.0
                self.goal_spin.setDecimals(1)
                self.goal_spin.setSingleStep(1.0)
            else:
                value = quantized if quantized is not None else 0.0
                self.goal_spin.setDecimals(4)
                self.goal_spin.setSingleStep(0.01)
        else:
            # FP32 SQNR is infinite: the tolerance is a gain in dB over all-INT8 (resolve_goal)
            self.goal_label.setText("Gain over INT8 (dB)" if metric == "sqnr" else "Tolerance")
            self.goal_label.setToolTip(tolerance_meaning(metric == "sqnr"))
            defaults = {"top1": 0.01, "cosine": 0.001, "sqnr": SUGGESTED_SQNR_GAIN_DB}
            value = defaults.get(metric or "", 0.01)
            if metric == "mse" and quantized:
                value = quantized / 2
            self.goal_spin.setDecimals(6 if metric in ("mse", "cosine") else 4)
            self.goal_spin.setSingleStep(value / 2 if value else 0.01)
        self.goal_spin.setValue(value)

    # ----- the search shown ---------------------------------------------------------------------

    def _clear_fallback_plot(self) -> None:
        self.fallback_curve.setData([], [])
        self.chosen_marker.setData([], [])
        for item in (self.fallback_band, self.fp32_line, self.target_line):
            item.hide()
        for item in self._curve_labels:
            self.fallback_plot.removeItem(item)
        self._curve_labels = []

    @Slot(object)
    def show_fallback(self, result: FallbackResult | None) -> None:
        """Plot a fallback search: metric against units left in float, FP32, the goal band, the chosen point."""
        self.result = result
        self.ladder_plot.hide()
        self.fallback_plot.show()
        self._clear_fallback_plot()
        if result is None:
            self.fallback_label.setText(NO_SEARCH_TEXT)
            self.apply_button.setEnabled(False)
            self.apply_button.setText("Apply")
            return
        self._show_goal(result)
        xs, ys = result.plot_data()
        shown = [y if math.isfinite(y) else np.nan for y in ys]
        self.fallback_curve.setData(xs, shown, connect="finite")
        self.fallback_plot.setLabel("left", str(result.metric.get("name", "metric")))
        higher = result.metric.get("direction", "higher") == "higher"
        finite = [y for y in shown if not np.isnan(y)]
        if math.isfinite(result.fp32):
            self.fp32_line.show()  # first: a hidden line's label ignores new text
            self.fp32_line.label.setFormat(f"FP32 {format_number(result.fp32)}")
            self.fp32_line.setPos(result.fp32)
            finite.append(result.fp32)
        if result.tolerance is not None and math.isfinite(result.fp32):
            edge = result.fp32 - result.tolerance if higher else result.fp32 + result.tolerance
            self.fallback_band.setRegion(sorted((edge, result.fp32)))
            self.fallback_band.show()
            finite.append(edge)
        elif result.target is not None:
            self.target_line.show()
            self.target_line.label.setFormat(f"target {format_number(result.target)}")
            self.target_line.setPos(result.target)
            finite.append(result.target)
            top = max(finite) if finite else result.target
            bottom = min(finite) if finite else result.target
            margin = 0.1 * ((top - bottom) or 1.0)
            self.fallback_band.setRegion((result.target, top + margin) if higher else (bottom - margin, result.target))
            self.fallback_band.show()
        if xs:
            last = len(result.chosen)
            y_last = next((y for x, y in zip(xs, shown) if x == last), shown[-1])
            colour = QColor(40, 150, 70) if result.reached else QColor(200, 50, 40)
            self.chosen_marker.setData([last], [y_last], brush=pg.mkBrush(colour))
        if finite:
            low, high = min(finite), max(finite)
            pad = 0.12 * ((high - low) or max(abs(high), 1.0))
            self.fallback_plot.setYRange(low - pad, high + pad, padding=0)
        self.fallback_plot.setXRange(-0.3, max(xs + [1]) + 0.6, padding=0)
        if len(result.curve) <= CURVE_LABELS_UP_TO:
            colour = self.palette().color(QPalette.ColorRole.Text)
            for point, y in zip(result.curve, shown):
                if point.unit is None or np.isnan(y):
                    continue
                label = pg.TextItem(point.unit, color=colour, anchor=(0.0, 1.2), angle=0)
                label.setFont(QFont(self.font().family(), max(self.font().pointSize() - 1, 7)))
                label.setPos(point.num_float, y)
                self.fallback_plot.addItem(label)
                self._curve_labels.append(label)
        self._update_fallback_text()

    def _show_goal(self, result: FallbackResult) -> None:
        """The goal fields say what the search shown searched for (a reopened project: not a default next to
        "Reached target 39")."""
        goal, value = ("tolerance", result.tolerance) if result.tolerance is not None else ("target", result.target)
        position = self.goal_box.findData(goal)
        if value is None or position < 0 or not self.goal_box.model().item(position).isEnabled():
            return
        self.goal_box.setCurrentIndex(position)  # its own defaults first (decimals, step)...
        self._goal_changed()
        self.goal_spin.setValue(float(value))  # ...then the searched value

    def _update_fallback_text(self) -> None:
        result = self.result
        if result is None:
            return
        name = str(result.metric.get("name", "metric"))
        goal = (f"within {format_number(result.tolerance)} of FP32 ({format_number(result.fp32)})"
                if result.tolerance is not None else f"target {format_number(result.target)}")
        names = result.chosen_names
        state = "<b>Reached</b>" if result.reached else "<b>Not reached</b>"
        units = f"{len(names)} unit{'' if len(names) == 1 else 's'} in float"
        text = (f"{state} {goal}: {name} {format_number(result.final_value)} with {units}"
                f"{': ' + ', '.join(names) if names else ''} (all quantized: {format_number(result.quantized)}).")
        running = not result.complete and self.controller.busy
        if running:  # a point of the search under way (search_partial)
            text = (f"<b>Searching…</b> {count_text(len(result.curve), 'point')} measured: "
                    f"{name} {format_number(result.final_value)} with {units}"
                    f"{': ' + ', '.join(names) if names else ''} (all quantized: {format_number(result.quantized)}).")
        elif not result.complete:
            text += " The search was cancelled: partial result."
        if result.applied:
            text += " <i>Applied: these layers are left in float.</i>"
        self.fallback_label.setText(self._applying_text() + text)
        can_apply = bool(names) and not result.applied and not self.controller.busy
        self.apply_button.setEnabled(can_apply)
        self.apply_button.setText(f"Apply: leave {units}" if names else "Apply")
        self.apply_button.setToolTip(", ".join(names))

    # ----- a ladder search shown -------------------------------------------------------------------

    @Slot(object)
    def show_ladder(self, result: LadderResult | None, partial: bool = False) -> None:
        """Plot a ladder search: the metric against the weight bytes of every mix measured (undone steps grey),
        the target or budget, and the mix chosen (``partial``: the points so far of a search under way)."""
        self.ladder_result = result
        if result is None:
            self.show_fallback(self.result)
            return
        self.fallback_plot.hide()
        self.ladder_plot.show()
        # the box names the ladder this result searched (after a reopen it showed the first preset instead)
        self.ladder_box.setCurrentText(ladder_text(result.ladder))
        if not partial:  # and whether it searched the hand-set layers too (a running search's points do not say)
            self.revisit_box.setChecked(result.revisit_pins)
        xs, ys = result.plot_data()
        shown = [y if math.isfinite(y) else np.nan for y in ys]
        self.ladder_curve.setData(xs, shown, connect="finite")
        undone = [s for s in result.steps if not s.kept and math.isfinite(s.value)]
        self.ladder_undone.setData([s.weight_bytes for s in undone], [s.value for s in undone])
        self.ladder_plot.setLabel("left", str(result.metric.get("name", "metric")))
        self.ladder_target.setVisible(result.target is not None)
        if result.target is not None:
            self.ladder_target.setPos(result.target)
        self.ladder_budget.setVisible(result.budget_bytes is not None)
        if result.budget_bytes is not None:
            self.ladder_budget.setPos(result.budget_bytes)
        if math.isfinite(result.value):
            colour = QColor(40, 150, 70) if result.reached else QColor(200, 50, 40)
            self.ladder_marker.setData([result.weight_bytes], [result.value], brush=pg.mkBrush(colour))
        else:
            self.ladder_marker.setData([], [])
        self._update_ladder_text()

    def _update_ladder_text(self) -> None:
        result = self.ladder_result
        if result is None:
            return
        state = "<b>Reached</b>" if result.reached else "<b>Not reached</b>"
        promoted = result.promoted
        moved = ", ".join(f"{name} {rung}" for name, rung in list(promoted.items())[:8])
        ratio = result.weight_bytes / result.float_bytes if result.float_bytes else math.nan
        text = (f"{state}: {result.metric.get('name', 'metric')} {format_number(result.value)} (all "
                f"{result.ladder[0]}: {format_number(result.start)}); weights {result.weight_bytes:,} bytes, "
                f"{ratio:.0%} of float. Off the first rung: {moved or 'none'}"
                f"{'...' if len(promoted) > 8 else ''}.")
        running = not result.complete and self.controller.busy
        if running:  # a step of the search under way (search_partial): the session belongs to the job
            self.fallback_label.setText(
                f"<b>Searching…</b> {count_text(len(result.steps), 'mix', 'mixes')} measured, the best "
                f"{result.metric.get('name', 'metric')} so far {format_number(result.value)} (all {result.ladder[0]}: "
                f"{format_number(result.start)}).")
            self.apply_button.setEnabled(False)
            return
        if result.notes:
            text += "<br>" + "<br>".join(f"<i>{note}</i>" for note in result.notes[:4])
        if result.applied:
            text += " <i>Applied: the layers run in these precisions.</i>"
        changes = [] if result.applied else self.controller.ladder_changes(result)
        if changes:  # what Apply does, before it is clicked
            hand = sum(c.hand_set for c in changes)
            text += (f"<br>Apply changes {count_text(len(changes), 'layer')}"
                     f"{f' ({hand} set by hand: it asks first)' if hand else ''}: "
                     + html.escape(", ".join(c.text() for c in changes[:6])) + ("..." if len(changes) > 6 else "")
                     + ".")
        self.fallback_label.setText(self._applying_text() + text)
        self.apply_button.setEnabled(bool(changes) and not result.applied and not self.controller.busy)
        self.apply_button.setText(f"Apply: set {count_text(len(changes), 'layer')}" if changes
                                  else "Apply")
        self.apply_button.setToolTip("\n".join(c.text() for c in changes) if changes
                                     else "nothing to change: every layer runs in the chosen precision")
