"""The layer panel: descriptor editor, shapes, the calibration histogram with amax lines, weight ranges.

Everything it shows comes from the session through the controller (``descriptors``, ``layer_shapes``,
``histogram``, ``weight_ranges``, the module tree) and every change goes through the controller
(``set_descriptor``, ``recompute_amax``), so the CLI can do all of it too. The descriptor editor is
:mod:`workbench.app.descriptor_editor`.
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QTabBar,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.deferred_refresh import DeferredRefresh
from workbench.app.descriptor_editor import (
    DESCRIPTOR_FIELDS,
    METHODS,
    DescriptorDialog,
    DescriptorEditor,
    apply_editor,
    layer_quantizers,
    role_of,
)
from workbench.app.formatting import count_text, format_number, format_shape
from workbench.graph import ModelTree
from workbench.graph.tree import ModuleInfo
from workbench.quant.calib.methods import SINGLE_METHODS, AmaxMethod

__all__ = ["DescriptorEditor", "DescriptorDialog", "LayerPanel", "METHOD_COLORS"]

METHOD_COLORS = {AmaxMethod.MAX: "#e67e22", AmaxMethod.ENTROPY: "#2874a6", AmaxMethod.MSE: "#1e8449",
                 AmaxMethod.PERCENTILE: "#8e44ad"}  # a str enum: METHOD_COLORS["mse"] finds it

pg.setConfigOptions(antialias=True, background="w", foreground="#303030")


def _plot_widget(min_height: int, bottom: str, left: str, vertical_grid: bool) -> pg.PlotWidget:
    """A panel plot: labelled axes, light grid, zoom along x only, plain numbers on the axes."""
    plot = pg.PlotWidget()
    plot.setMinimumHeight(min_height)
    plot.setLabel("bottom", bottom)
    plot.setLabel("left", left)
    plot.showGrid(x=vertical_grid, y=True, alpha=0.15)
    plot.setMouseEnabled(x=True, y=False)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).enableAutoSIPrefix(False)  # 0.4, not "400 (x0.001)"
    return plot


# the input quantizers the descriptor editor edits, in the order it picks them (workbench.session.build.role_quantizer)
EDITED_INPUT_ATTRS = ("_input_quantizer", "_input0_quantizer", "_input1_quantizer", "_q_quantizer")


class LayerPanel(QWidget):
    """What the selected layer(s) are and how they are quantized; plots of their calibration data."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.names: list[str] = []
        self.quantizer_name: str | None = None
        self.histogram: dict[str, Any] | None = None
        self.histogram_item: pg.PlotDataItem | None = None
        self.amax_lines: dict[str, pg.InfiniteLine] = {}
        self.weight_item: pg.BarGraphItem | None = None

        self.stack = QStackedWidget()
        self.placeholder = QLabel("Select a layer in the model tree to see how it is quantized.")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setObjectName("placeholder")
        self.stack.addWidget(self.placeholder)

        content = QWidget()
        self.title = QLabel()
        self.title.setObjectName("layerTitle")
        self.title.setWordWrap(True)
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details = QLabel()
        self.details.setObjectName("layerDetails")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        # left: the descriptor editor
        self.role_tabs = QTabBar()
        self.role_tabs.addTab("Input quantizer")
        self.role_tabs.addTab("Weight quantizer")
        self.role_tabs.setExpanding(False)
        self.editor = DescriptorEditor()
        self.editor_note = QLabel()
        self.editor_note.setObjectName("hint")
        self.editor_note.setWordWrap(True)
        self.apply_button = QPushButton("Apply")
        self.apply_button.setToolTip("Apply the changed fields (bold) to every selected layer")
        self.revert_button = QPushButton("Revert")
        self.reset_button = QPushButton("Reset to default")
        self.reset_button.setToolTip("Drop this role's per-layer descriptor: back to the project default")
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.revert_button)
        buttons.addStretch(1)
        buttons.addWidget(self.reset_button)
        editor_box = QGroupBox("Descriptor")
        editor_layout = QVBoxLayout(editor_box)
        editor_layout.addWidget(self.role_tabs)
        editor_layout.addWidget(self.editor)
        editor_layout.addWidget(self.editor_note)
        editor_layout.addLayout(buttons)
        editor_layout.addStretch(1)
        left = QScrollArea()
        left.setWidget(editor_box)
        left.setWidgetResizable(True)
        left.setFrameShape(QFrame.Shape.NoFrame)
        left.setMinimumWidth(300)

        # right: the plots
        self.quantizer_combo = QComboBox()
        self.quantizer_combo.setToolTip("Which quantizer of the layer to plot")
        # a long quantizer name or title must not widen the panel: the window would take that width from the
        # model tree's dock after every job that changes them (the tree narrowed, its columns cut)
        self.quantizer_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.quantizer_combo.setMinimumContentsLength(18)
        self.log_box = QCheckBox("Log scale")
        self.log_box.setChecked(True)
        self.log_box.setToolTip("Logarithmic counts: the tail, where amax is chosen, is visible")
        self.histogram_plot = _plot_widget(220, "|x|", "count", vertical_grid=True)
        self.histogram_message = pg.TextItem("", color="#606060", anchor=(0.5, 0.5))
        self.amax_legend = QLabel()
        self.amax_legend.setObjectName("amaxLegend")
        self.amax_legend.setWordWrap(True)
        self.amax_legend.setTextFormat(Qt.TextFormat.RichText)
        # each method in the legend is a link: a line hidden under another (the same amax) is still chosen here
        self.amax_legend.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self.amax_legend.linkActivated.connect(lambda link: self.choose_method(link.removeprefix("method:")))
        self.weight_plot = _plot_widget(160, "output channel", "max |w|", vertical_grid=False)
        self.weight_title = QLabel()
        self.weight_title.setObjectName("plotTitle")
        self.weight_title.setWordWrap(True)  # a long title must not widen the panel (and squeeze the tree)
        plot_bar = QHBoxLayout()
        self.histogram_title = QLabel("Calibration histogram")
        self.histogram_title.setObjectName("plotTitle")
        self.histogram_title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        plot_bar.addWidget(self.histogram_title)
        plot_bar.addStretch(1)
        plot_bar.addWidget(QLabel("Quantizer:"))
        plot_bar.addWidget(self.quantizer_combo)
        plot_bar.addWidget(self.log_box)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addLayout(plot_bar)
        right_layout.addWidget(self.histogram_plot, 3)
        right_layout.addWidget(self.amax_legend)
        right_layout.addWidget(self.weight_title)
        right_layout.addWidget(self.weight_plot, 2)

        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([330, 700])
        content_layout = QVBoxLayout(content)
        content_layout.setContentsMargins(8, 6, 8, 6)
        content_layout.addWidget(self.title)
        content_layout.addWidget(self.details)
        content_layout.addWidget(splitter, 1)
        self.stack.addWidget(content)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stack)

        self._refresh = DeferredRefresh(controller, self.refresh, self)
        self.role_tabs.currentChanged.connect(lambda _i: self._refresh.when_idle(self._load_editor))
        self.apply_button.clicked.connect(self.apply)
        self.revert_button.clicked.connect(self._load_editor)
        self.reset_button.clicked.connect(self.reset_role)
        self.editor.touched_changed.connect(self._update_buttons)
        self.quantizer_combo.currentIndexChanged.connect(lambda _i: self._refresh.when_idle(self._plot_histogram))
        self.log_box.toggled.connect(self._set_log)

        self._plot_timer = QTimer(self)
        self._plot_timer.setSingleShot(True)
        self._plot_timer.setInterval(0)
        self._plot_timer.timeout.connect(self.refresh_plots)
        controller.selection_changed.connect(self._selection_changed)
        for signal in (controller.session_changed, controller.layers_changed, controller.calibration_changed):
            signal.connect(self._stale)
        controller.busy_changed.connect(self._busy)
        self._busy(False)

    # ----- refresh ------------------------------------------------------------------------------------

    def _selection_changed(self, names: list[str]) -> None:
        self.names = list(names)
        self._refresh.schedule()

    def _stale(self) -> None:
        if self.controller.session is None:
            self.names = []
        self._refresh.schedule()

    def tree(self) -> ModelTree | None:
        """The module tree (quantizer names and calibrators): the controller's, re-read only after a change."""
        return self.controller.tree() if self.controller.session is not None else None

    def refresh(self) -> None:
        if not self._refresh.begin():  # the session belongs to the job until it ends
            return
        session = self.controller.session
        names = [n for n in self.names if session is not None and n in session.project.layers]
        if not names:
            self.stack.setCurrentIndex(0)
            return
        self.stack.setCurrentIndex(1)
        try:
            self._show_header(names)
            self._load_editor()
        except Exception as error:  # noqa: BLE001 - the panel stays; the user sees what failed
            self.controller.error.emit("Could not show the layer", f"{type(error).__name__}: {error}", "")
        # the plots in the next turn of the event loop: the window repaints in between (no long stall)
        self._plot_timer.start()

    def refresh_plots(self) -> None:
        self._plot_timer.stop()
        if not self._refresh.idle():
            return
        session = self.controller.session
        if session is None or not self.names or self.names[0] not in session.project.layers:
            return
        try:
            self._fill_quantizers()
            self._plot_weights()
        except Exception as error:  # noqa: BLE001 - the panel stays; the user sees what failed
            self.controller.error.emit("Could not plot the layer", f"{type(error).__name__}: {error}", "")

    def _show_header(self, names: list[str]) -> None:
        session = self.controller.session
        tree = self.tree()
        first = names[0]
        info: ModuleInfo | None = tree[first] if tree is not None and first in tree else None
        decision = session.project.layers[first]
        if len(names) == 1:
            kind = "functional" if decision.type in ("QuantAdd", "QuantConcat") else "module"
            state = "quantized" if decision.quantize else "left in float"
            self.title.setText(f"{first}  <span style='color:#707070'>{decision.type} · {kind} · {state}</span>")
            parts = [f"parameters: {info.num_params:,}" if info is not None else ""]
            try:
                shapes = self.controller.layer_shapes().get(first)
            except Exception:  # noqa: BLE001 - shapes need a forward pass, which may fail for odd models
                shapes = None
            if shapes:
                inputs = ", ".join(format_shape(s) for s in shapes["inputs"]) or "?"
                parts.append(f"input {inputs} → output {format_shape(shapes['output'])}")
                if shapes.get("weight"):
                    parts.append(f"weight {format_shape(shapes['weight'])}")
            quantizers = layer_quantizers(tree, first)
            if quantizers:
                parts.append("quantizers: " + ", ".join(
                    f"{q.attr.strip('_')}{'' if q.active else ' (bypassed)'}" for q in quantizers))
            self.details.setText("   ·   ".join(p for p in parts if p))
        else:
            quantized = sum(1 for n in names if session.project.layers[n].quantize)
            params = sum(tree[n].num_params for n in names if tree is not None and n in tree)
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            self.title.setText(f"{count_text(len(names), 'layer')} selected  "
                               f"<span style='color:#707070'>{quantized} quantized · "
                               f"{params:,} parameters</span>")
            self.details.setText(f"{shown}. Edits apply to all of them; the plots show {first}.")
        self.title.setTextFormat(Qt.TextFormat.RichText)

    def current_role(self) -> str:
        return "weight" if self.role_tabs.currentIndex() == 1 else "input"

    def _load_editor(self) -> None:
        session = self.controller.session
        names = [n for n in self.names if session is not None and n in session.project.layers]
        if not names:
            return
        role = self.current_role()
        descriptors = {n: d for n, d in self.controller.descriptors(names, role).items() if d is not None}
        if not descriptors:
            self.editor.load(None)
            self.editor.setEnabled(False)
            self.editor_note.setText(f"No {role} quantizer on {'this layer' if len(names) == 1 else 'these layers'}.")
            self._update_buttons()
            return
        self.editor.setEnabled(not self.controller.busy)
        first_name = next(iter(descriptors))
        mixed = {k for k in DESCRIPTOR_FIELDS if len({repr(d.get(k)) for d in descriptors.values()}) > 1}
        method, percentile, available = self._method_of(first_name, role)
        self.editor.set_context(role, [session.project.layers[n].type for n in descriptors])
        self.editor.load(descriptors[first_name], mixed, method, percentile, available)
        notes = []
        if len(descriptors) < len(names):
            missing = len(names) - len(descriptors)
            verb = "has" if missing == 1 else "have"
            notes.append(f"{count_text(missing, 'selected layer')} {verb} no {role} quantizer.")
        if not session.project.layers[first_name].quantize:
            notes.append("Left in float: the descriptor applies once the layer is quantized again.")
        if mixed:
            notes.append("Italic fields differ across the selection.")
        self.editor_note.setText(" ".join(notes))
        self._update_buttons()

    def _method_of(self, layer: str, role: str) -> tuple[str | None, float | None, bool]:
        """The amax method in use for the layer's ``role`` quantizer, its percentile, and whether it can change."""
        session = self.controller.session
        run = session.project.current_calibration
        if run is None:
            return None, None, False
        for q in layer_quantizers(self.tree(), layer):
            if role_of(q) == role and q.enabled:
                record = run.quantizers.get(q.name)
                available = q.calibrator == "HistogramCalibrator" and record is not None
                if record is not None and record.choice and not record.choice.get("overridden"):
                    return AmaxMethod.AUTO.value, run.percentile, available  # auto's pick shows in the histogram
                return (record.method if record else run.method), run.percentile, available
        return run.method, run.percentile, False

    def _update_buttons(self) -> None:
        touched = bool(self.editor.touched())
        editable = not self.controller.busy and self.editor.isEnabled()
        self.apply_button.setEnabled(touched and editable)
        self.revert_button.setEnabled(touched)
        self.reset_button.setEnabled(editable)

    def apply(self) -> bool:
        """Apply the touched fields to every selected layer (through the controller)."""
        names = [n for n in self.names if self.controller.session is not None
                 and n in self.controller.session.project.layers]
        if not names or self.controller.busy:
            return False
        return apply_editor(self.controller, self.editor, names, self.current_role())

    def reset_role(self) -> None:
        if self.names:
            self.controller.reset_descriptor(self.names, self.current_role())

    def _busy(self, busy: bool) -> None:
        self.editor.setEnabled(not busy)
        for line in self.amax_lines.values():
            line.setCursor(Qt.CursorShape.ArrowCursor if busy else Qt.CursorShape.PointingHandCursor)
        self._update_buttons()

    # ----- plots --------------------------------------------------------------------------------------

    def _fill_quantizers(self) -> None:
        quantizers = layer_quantizers(self.tree(), self.names[0]) if self.names else []
        previous = self.quantizer_combo.currentData()
        self.quantizer_combo.blockSignals(True)
        self.quantizer_combo.clear()
        chosen = 0
        for q in quantizers:
            calibrator = {"HistogramCalibrator": "histogram", "MaxCalibrator": "max"}.get(q.calibrator or "", "none")
            what = q.role or q.attr.strip('_').replace('_quantizer', '')  # attention: query, key, value, probabilities
            label = f"{what} ({calibrator}{'' if q.active else ', bypassed'})"
            self.quantizer_combo.addItem(label, q.name)
        names = [q.name for q in quantizers]
        if previous is not None and previous.rsplit(".", 1)[-1] in [n.rsplit(".", 1)[-1] for n in names]:
            suffix = previous.rsplit(".", 1)[-1]
            chosen = [n.rsplit(".", 1)[-1] for n in names].index(suffix)
        else:
            # the quantizer the descriptor editor edits (an attention's query, not its probabilities), else the
            # first active histogram quantizer (an input, usually): the plot and the editor show the same one
            attrs = [q.attr for q in quantizers]
            edited = next((attr for attr in EDITED_INPUT_ATTRS if attr in attrs
                           and quantizers[attrs.index(attr)].active), None)
            if edited is not None and self.current_role() == "input":
                chosen = attrs.index(edited)
            else:
                for position, q in enumerate(quantizers):
                    if q.calibrator == "HistogramCalibrator" and q.active:
                        chosen = position
                        break
        self.quantizer_combo.setCurrentIndex(chosen)
        self.quantizer_combo.blockSignals(False)
        self._plot_histogram()

    def _plot_histogram(self) -> None:
        plot = self.histogram_plot
        plot.clear()
        self.amax_lines = {}
        self.histogram_item = None
        self.grid_item = None
        self.histogram = None
        self.quantizer_name = self.quantizer_combo.currentData()
        session = self.controller.session
        if session is None or self.quantizer_name is None:
            self._message("This layer has no quantizer.")
            return
        data = self.controller.histogram(self.quantizer_name)
        if data is None:
            info = next((q for q in layer_quantizers(self.tree(), self.names[0]) if q.name == self.quantizer_name),
                        None)
            # switched off first: an INT4 weight-only layer's input has a max calibrator it never uses, and
            # "set its calibrator to histogram" sent the user to an editor that is off for it
            if info is not None and not info.enabled:
                self._message(self._off_reason(info))
            elif info is not None and info.calibrator != "HistogramCalibrator":
                self._message(f"No histogram: this quantizer uses the max calibrator (amax {info.amax}).\n"
                              "Set its calibrator to 'histogram' and calibrate to see one.")
            else:
                self._message("Not calibrated yet: run Calibrate to collect a histogram.")
            return
        self.histogram = data
        self._show_axes(plot)
        self.histogram_item = plot.plot(*self._histogram_xy(data), stepMode="center", fillLevel=0, antialias=False,
                                        brush=pg.mkBrush(70, 110, 160, 110), pen=pg.mkPen("#46709f", width=1))
        self._plot_grid(plot, data)
        plot.setLogMode(x=False, y=self.log_box.isChecked())
        plot.setLabel("left", "count (log)" if self.log_box.isChecked() else "count")
        in_use = self._method_in_use(data)
        amaxes = data.get("amax") or {}
        top = float(max([float(data["edges"][-1])] + [v for v in amaxes.values() if v is not None]))
        # labels are staggered vertically: the methods often agree to three digits and would overlap
        drawn: list[float] = []
        for position, method in enumerate(SINGLE_METHODS):  # one line per method a histogram decides
            value = amaxes.get(method)
            if value is None:
                continue
            current = method == in_use
            # a line on (or a pixel from) one drawn already would hide it: dotted, over it, so both show
            covers = any(abs(float(value) - v) <= 0.004 * top for v in drawn)
            drawn.append(float(value))
            # a label left of its line when the line is near the right edge, so that it is not cut off
            side = (1, 0.5) if value > 0.6 * top else (0, 0.5)
            line = pg.InfiniteLine(pos=float(value), angle=90, movable=False,
                                   pen=pg.mkPen(METHOD_COLORS[method], width=3.5 if current else 1.5,
                                                style=Qt.PenStyle.SolidLine if current else
                                                Qt.PenStyle.DotLine if covers else Qt.PenStyle.DashLine),
                                   hoverPen=pg.mkPen(METHOD_COLORS[method], width=4),
                                   label=f"{method}{' ✔' if current else ''}",
                                   labelOpts={"position": 0.93 - 0.12 * position, "color": METHOD_COLORS[method],
                                              "fill": (255, 255, 255, 210), "anchors": [side, side]})
            line.setZValue(20 if current else 10 + position)  # the one in use on top, then later over earlier
            line.method = method  # type: ignore[attr-defined]
            line.setToolTip(f"{method}: amax {format_number(value, 6)}"
                            + (" (in use)" if current else " — click to use it"))
            line.setCursor(Qt.CursorShape.PointingHandCursor)
            line.sigClicked.connect(lambda _line, _event, m=method: self.choose_method(m))
            plot.addItem(line)
            self.amax_lines[method] = line
        plot.setXRange(0, top * 1.04, padding=0)
        plot.enableAutoRange(axis="y")
        legend = []
        for method in SINGLE_METHODS:
            text = f"{method} {format_number(amaxes.get(method))}"
            style = f"color:{METHOD_COLORS[method]};" + ("font-weight:bold;" if method == in_use else "")
            legend.append(f"<a href='method:{method}' style='{style} text-decoration:none'>"
                          f"{'▶ ' if method == in_use else ''}{text}</a>")
        current = data.get("current")
        picked = (f"<br><b>auto</b> picked {html.escape(str(data.get('reason')), quote=False)}" if data.get("auto")
                  and data.get("reason") else "")
        warned = "".join(f"<br><span style='color:#b35900'>⚠ {html.escape(str(w), quote=False)}</span>"
                         for w in data.get("warnings") or [])
        self.amax_legend.setText("amax by method: " + " &nbsp; ".join(legend)
                                 + (f" &nbsp; · in use: <b>{format_number(current)}</b>" if current is not None else "")
                                 + " &nbsp; <span style='color:#808080'>(click a line or a name to use it)</span>"
                                 + picked + warned)
        self.histogram_title.setText("Calibration histogram" + (f" · auto: {data.get('method')}" if data.get("auto")
                                                               else ""))

    def _plot_grid(self, plot: pg.PlotWidget, data: dict[str, Any]) -> None:
        """Short ticks along the bottom at the values the layer's format can output (E4M3's grid is dense
        near 0 and coarse near amax; INT8's is even): where the histogram's mass falls between levels."""
        grid = data.get("grid")
        if grid is None or not len(grid):
            return
        counts = np.asarray(data["counts"], dtype=np.float64)
        peak = max(float(counts.max()) if counts.size else 1.0, 1.0)
        low, high = (1.0, peak ** 0.15) if self.log_box.isChecked() else (0.0, 0.06 * peak)
        xs = np.repeat(np.asarray(grid, dtype=np.float64), 2)
        ys = np.tile([low, high], len(grid))
        self.grid_item = plot.plot(xs, ys, connect="pairs", pen=pg.mkPen(120, 120, 120, 160, width=1))
        self.grid_item.setToolTip(f"{data.get('format', '')} grid: {len(grid)} levels up to amax")

    def _histogram_xy(self, data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Bin edges and counts to draw; on the log scale an empty bin sits on the baseline (1).

        Zeros would be -inf on a log axis: the curve would break into hundreds of pieces, each filled
        separately (slow to paint), with gaps where the data has none.
        """
        counts = np.asarray(data["counts"], dtype=np.float64)
        if self.log_box.isChecked():
            counts = np.maximum(counts, 1.0)
        return np.asarray(data["edges"], dtype=np.float64), counts

    def _method_in_use(self, data: dict[str, Any]) -> str | None:
        method = data.get("method")
        if method in METHODS:
            return method
        current = data.get("current")
        if current is None:
            return None
        amaxes = {m: v for m, v in (data.get("amax") or {}).items() if v is not None}
        return min(amaxes, key=lambda m: abs(amaxes[m] - current)) if amaxes else None

    def _show_axes(self, plot: pg.PlotWidget) -> None:
        for axis in ("left", "bottom"):
            plot.getAxis(axis).setStyle(showValues=True)
            plot.getAxis(axis).setTicks(None)
        plot.showGrid(x=True, y=True, alpha=0.15)

    def _off_reason(self, info: Any) -> str:
        """Why a bypassed quantizer has nothing to plot: its layer's precision (an INT4 weight-only layer's input) or
        a TensorRT placement rule."""
        layer, role = info.owner, "input" if "input" in info.attr else "weight"
        descriptor = self.controller.descriptors([layer], role).get(layer) if layer else None
        if descriptor is not None and descriptor.get("enabled", True) is False:
            return ("Off: this layer's precision leaves its input in float (INT4 weight-only layers quantize only "
                    "their weight): nothing to plot.")
        return "This quantizer is bypassed (a TensorRT placement rule): nothing to plot."

    def _message(self, text: str) -> None:
        self.histogram_title.setText("Calibration histogram")  # no histogram: its title names no method
        # axes stay (ticks hidden): showing them again after calibrating would cost a first, slow paint
        self.histogram_plot.showGrid(x=False, y=False)
        for axis in ("left", "bottom"):
            self.histogram_plot.getAxis(axis).setStyle(showValues=False)
            self.histogram_plot.getAxis(axis).setTicks([[], []])
        self.histogram_plot.setLogMode(x=False, y=False)
        self.histogram_plot.setXRange(0, 1, padding=0)
        self.histogram_plot.setYRange(0, 1, padding=0)
        self.histogram_message.setText(text)
        # wrapped to the plot's width: a long line ran past both edges of the narrow plot, cut on either side
        width = self.histogram_plot.getViewBox().width()
        self.histogram_message.setTextWidth(max(160.0, width - 16) if width > 0 else 240.0)
        self.histogram_message.setPos(0.5, 0.5)
        self.histogram_plot.addItem(self.histogram_message)
        self.amax_legend.setText("")

    def _set_log(self, on: bool) -> None:
        if self.histogram_item is not None and self.histogram is not None:
            self.histogram_item.setData(*self._histogram_xy(self.histogram))
            self.histogram_plot.setLogMode(x=False, y=on)
            self.histogram_plot.setLabel("left", "count (log)" if on else "count")
            self.histogram_plot.enableAutoRange(axis="y")

    def choose_method(self, method: str) -> None:
        """Clicking an amax line: that method's amax becomes the quantizer's (from the stored histogram)."""
        if self.quantizer_name is None or self.controller.busy or self.histogram is None:
            return
        if method == self._method_in_use(self.histogram):
            return
        run = self.controller.session.project.current_calibration if self.controller.session else None
        percentile = run.percentile if run is not None else None
        self.controller.recompute_amax(self.same_quantizer_of_selection(), method, percentile)

    def same_quantizer_of_selection(self) -> list[str]:
        """The plotted quantizer and the same one (same place in the layer) of every other selected layer that
        has it with a histogram: a line picked with several layers selected applies to all of them."""
        name, first = self.quantizer_name, self.names[0] if self.names else None
        if name is None or first is None or not name.startswith(f"{first}."):
            return [name] if name is not None else []
        suffix = name[len(first) + 1:]
        tree = self.tree()
        chosen = [name]
        for layer in self.names[1:]:
            for q in layer_quantizers(tree, layer):
                if q.name == f"{layer}.{suffix}" and q.calibrator == "HistogramCalibrator" and q.enabled:
                    chosen.append(q.name)
        return chosen

    def _plot_weights(self) -> None:
        plot = self.weight_plot
        plot.clear()
        self.weight_item = None
        session = self.controller.session
        ranges = self.controller.weight_ranges(self.names[0]) if session is not None and self.names else None
        if ranges is None or np.ndim(ranges) != 1:
            self.weight_title.setText("Weights: this layer has none")
            plot.setVisible(False)
            return
        plot.setVisible(True)
        ranges = np.asarray(ranges, dtype=np.float64)
        self.weight_item = pg.BarGraphItem(x=np.arange(len(ranges)), height=ranges, width=0.8,
                                           brush=pg.mkBrush("#5d8aa8"), pen=pg.mkPen(None))
        plot.addItem(self.weight_item)
        plot.setXRange(-0.6, len(ranges) - 0.4, padding=0)
        spread = float(ranges.max() / ranges.min()) if ranges.min() > 0 else float("inf")
        self.weight_title.setText(f"Weight max |w| per output channel ({count_text(len(ranges), 'channel')}, "
                                  "largest/smallest "
                                  f"{spread:.1f}×)")
        self.weight_title.setToolTip("A large spread between channels is why weights get per-channel scales")

    # for the main window's screenshots and tests
    def histogram_x(self) -> np.ndarray | None:
        if self.histogram_item is None:
            return None
        return np.asarray(self.histogram_item.xData)
