"""The fine-tune tab: quantization-aware fine-tuning with its settings, a live loss/metric plot and Cancel.

Everything goes through the :class:`~workbench.app.controller.Controller` (``finetune``,
``reset_finetune``, ``cancel_job``), whose headless twin is ``Session.finetune`` and ``workbench
finetune``. While a fine-tune runs, the controller's ``finetune_progress`` (one per step) and
``finetune_epoch`` (one per epoch, epoch 0 being the starting model) signals feed the plots; when it
ends, ``finetune_finished`` gives the whole history for the table. On opening a project the tab shows
the stored history of its last fine-tune.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtGui import QColor, QDoubleValidator
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.formatting import format_number
from workbench.project.settings import FinetuneSettings
from workbench.training import EpochRecord, FinetuneResult, recipe

__all__ = ["FinetuneTab", "HISTORY_COLUMNS"]

JOB_NAME = "Fine-tuning"
HISTORY_COLUMNS = ("epoch", "train loss", "eval loss", "metric", "lr", "weights")
# input quantizers of layers and functional ops: per-tensor, so their range can be learned
DEFAULT_LEARN_PATTERN = r"_input\d*_quantizer$"
_LOSS_PEN = pg.mkPen(QColor(70, 110, 180), width=1.5)
_EVAL_BRUSH = pg.mkBrush(QColor(220, 120, 40))
_METRIC_PEN = pg.mkPen(QColor(40, 150, 90), width=2)
_BEST_BRUSH = pg.mkBrush(QColor(200, 40, 40))
_REDRAW_MS = 100  # at most ten redraws a second, however fast the steps come


def _format_value(value: float | None) -> str:
    # a loss, metric or learning rate in the table: "-" marks an epoch that measured none
    return format_number(value, missing="-")


class FinetuneTab(QWidget):
    """Settings, Run/Cancel, live plots of the training loss (per step) and the metric (per epoch),
    and the history table of the last fine-tune."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.steps: list[float] = []       # global step numbers of the live run
        self.losses: list[float] = []
        self.epochs: list[EpochRecord] = []  # epoch 0 (start) and every finished epoch of the live run
        self.result: FinetuneResult | None = None
        self._redraw_pending = False
        self._build()
        controller.session_changed.connect(self._on_session_changed)
        controller.busy_changed.connect(self._busy_changed)
        controller.jobs.progress.connect(self._job_progress)
        controller.finetune_progress.connect(self._on_step)
        controller.finetune_epoch.connect(self._on_epoch)
        controller.finetune_finished.connect(self._on_finished)
        controller.calibration_changed.connect(lambda: self._busy_changed(self.controller.busy))
        self._on_session_changed()

    # ----- layout -------------------------------------------------------------------------------

    def _build(self) -> None:
        settings = QGroupBox("Settings")
        form = QFormLayout(settings)
        self.epochs_spin = QSpinBox()
        self.epochs_spin.setRange(1, 10000)
        self.epochs_spin.setToolTip("Passes over the training data; the recipe: about 10% of the original schedule.")
        form.addRow("Epochs", self.epochs_spin)
        self.lr_edit = QLineEdit()
        validator = QDoubleValidator(1e-12, 10.0, 12, self.lr_edit)
        validator.setNotation(QDoubleValidator.Notation.ScientificNotation)
        self.lr_edit.setValidator(validator)
        self.lr_edit.setToolTip("Starting learning rate; the recipe: 1% of the original one. Small rates keep the "
                                "straight-through estimator reliable.")
        form.addRow("Learning rate", self.lr_edit)
        recipe_row = QHBoxLayout()
        self.original_lr_edit = QLineEdit()
        self.original_lr_edit.setPlaceholderText("original lr")
        self.original_lr_edit.setValidator(QDoubleValidator(1e-12, 1e6, 12, self.original_lr_edit))
        self.original_epochs_spin = QSpinBox()
        self.original_epochs_spin.setRange(0, 100000)
        self.original_epochs_spin.setSpecialValueText("original epochs")
        self.recipe_button = QPushButton("Use recipe")
        self.recipe_button.setToolTip("1% of the original learning rate, about 10% of its epochs.")
        self.recipe_button.clicked.connect(self.apply_recipe)
        recipe_row.addWidget(self.original_lr_edit)
        recipe_row.addWidget(self.original_epochs_spin)
        recipe_row.addWidget(self.recipe_button)
        form.addRow("From training", recipe_row)
        self.optimizer_combo = QComboBox()
        self.optimizer_combo.addItem("SGD (momentum 0.9)", "sgd")
        self.optimizer_combo.addItem("Adam", "adam")
        form.addRow("Optimizer", self.optimizer_combo)
        self.schedule_combo = QComboBox()
        self.schedule_combo.addItem("cosine, down to 1% of the start", "cosine")
        self.schedule_combo.addItem("constant", "constant")
        form.addRow("Schedule", self.schedule_combo)
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(0, 10_000_000)
        self.steps_spin.setSpecialValueText("all batches")
        form.addRow("Steps per epoch", self.steps_spin)
        amax_row = QHBoxLayout()
        self.learn_amax_check = QCheckBox("learn amax of")
        self.learn_amax_check.setToolTip("Off (the reference's advice): amax stays as calibrated. On: the per-tensor "
                                         "ranges of the matching quantizers are trained too.")
        self.learn_amax_edit = QLineEdit(DEFAULT_LEARN_PATTERN)
        self.learn_amax_edit.setEnabled(False)
        self.learn_amax_check.toggled.connect(self.learn_amax_edit.setEnabled)
        amax_row.addWidget(self.learn_amax_check)
        amax_row.addWidget(self.learn_amax_edit, 1)
        form.addRow("Quantizer ranges", amax_row)

        buttons = QHBoxLayout()
        self.run_button = QPushButton("Fine-tune")
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop after the current step; the model keeps the best epoch so far.")
        self.cancel_button.clicked.connect(self.controller.cancel_job)
        self.reset_button = QPushButton("Discard fine-tuned weights")
        self.reset_button.clicked.connect(self.controller.reset_finetune)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        buttons.addWidget(self.reset_button)
        self.progress_bar = QProgressBar()
        self.progress_bar.setTextVisible(True)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addWidget(settings)
        left_layout.addLayout(buttons)
        left_layout.addWidget(self.progress_bar)
        left_layout.addWidget(self.status_label)
        left_layout.addStretch(1)

        self.plots = pg.GraphicsLayoutWidget()
        self.loss_plot = self.plots.addPlot(row=0, col=0, title="training loss")
        self.loss_plot.setLabel("bottom", "step")
        self.loss_plot.showGrid(x=True, y=True, alpha=0.2)
        self.loss_plot.addLegend(offset=(-10, 10))
        self.loss_curve = self.loss_plot.plot([], [], pen=_LOSS_PEN, name="train loss (step)")
        self.eval_loss_points = self.loss_plot.plot([], [], pen=None, symbol="o", symbolSize=7,
                                                    symbolBrush=_EVAL_BRUSH, name="eval loss (epoch)")
        self.metric_plot = self.plots.addPlot(row=1, col=0, title="metric")
        self.metric_plot.setLabel("bottom", "epoch")
        self.metric_plot.showGrid(x=True, y=True, alpha=0.2)
        self.metric_curve = self.metric_plot.plot([], [], pen=_METRIC_PEN, symbol="o", symbolSize=6)
        self.best_point = self.metric_plot.plot([], [], pen=None, symbol="star", symbolSize=14,
                                                symbolBrush=_BEST_BRUSH)

        self.table = QTableWidget(0, len(HISTORY_COLUMNS))
        self.table.setHorizontalHeaderLabels(list(HISTORY_COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)

        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.plots)
        right.addWidget(self.table)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

    # ----- settings -----------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        """The settings as ``Controller.finetune`` / ``Session.finetune`` keywords.

        Raises:
            ValueError: the learning rate is not a positive number.
        """
        try:
            lr = float(self.lr_edit.text())
        except ValueError:
            raise ValueError(f"The learning rate must be a number, got {self.lr_edit.text()!r}.") from None
        if not lr > 0 or not math.isfinite(lr):
            raise ValueError(f"The learning rate must be positive, got {lr}.")
        learn = [self.learn_amax_edit.text().strip()] if self.learn_amax_check.isChecked() else []
        return {"epochs": self.epochs_spin.value(), "lr": lr, "optimizer": self.optimizer_combo.currentData(),
                "schedule": self.schedule_combo.currentData(), "learn_amax": [p for p in learn if p],
                "steps_per_epoch": self.steps_spin.value() or None}

    def _load_settings(self, settings: FinetuneSettings) -> None:
        self.epochs_spin.setValue(settings.epochs)
        self.lr_edit.setText(f"{settings.lr:g}")
        for combo, value in ((self.optimizer_combo, settings.optimizer), (self.schedule_combo, settings.schedule)):
            index = combo.findData(value)
            if index >= 0:
                combo.setCurrentIndex(index)
        self.steps_spin.setValue(settings.steps_per_epoch or 0)
        patterns = list(settings.learn_amax)
        self.learn_amax_check.setChecked(bool(patterns))
        if patterns:
            self.learn_amax_edit.setText(patterns[0])

    @Slot()
    def apply_recipe(self) -> None:
        """Fill the learning rate (and epochs) from the original training by the reference recipe."""
        try:
            original_lr = float(self.original_lr_edit.text())
        except ValueError:
            self.status_label.setText("Give the original learning rate to apply the recipe.")
            return
        epochs = self.original_epochs_spin.value() or None
        try:
            values = recipe(original_lr, epochs)
        except ValueError as error:
            self.status_label.setText(str(error))
            return
        self.lr_edit.setText(f"{values['lr']:g}")
        if "epochs" in values:
            self.epochs_spin.setValue(values["epochs"])
        self.schedule_combo.setCurrentIndex(self.schedule_combo.findData("cosine"))

    # ----- running ------------------------------------------------------------------------------

    @Slot()
    def run(self) -> bool:
        """Start a fine-tune with the current settings (the plots start over)."""
        try:
            options = self.options()
        except ValueError as error:
            self.status_label.setText(str(error))
            return False
        self.clear_plots()
        self.progress_bar.setRange(0, 1)
        self.progress_bar.setValue(0)
        self.status_label.setText("starting: measuring the calibrated model")
        return self.controller.finetune(**options)

    def clear_plots(self) -> None:
        self.steps, self.losses, self.epochs = [], [], []
        self.result = None
        self._redraw()
        self.table.setRowCount(0)

    @Slot(int, int, float)
    def _on_step(self, epoch: int, step: int, loss: float) -> None:
        self.steps.append(len(self.steps) + 1)
        self.losses.append(loss)
        self.status_label.setText(f"epoch {epoch}, step {step}: loss {_format_value(loss)}")
        self._schedule_redraw()

    @Slot(object)
    def _on_epoch(self, record: EpochRecord) -> None:
        self.epochs.append(record)
        self._schedule_redraw()

    @Slot(object)
    def _on_finished(self, result: FinetuneResult) -> None:
        self.show_result(result)
        self._busy_changed(self.controller.busy)  # the project has fine-tuned weights now
        if result.cancelled:
            self.status_label.setText(("Cancelled: " if result.epochs_completed else
                                       "Cancelled before the first epoch ended: nothing changed. ") +
                                      result.summary())
        else:
            self.progress_bar.setRange(0, 1)
            self.progress_bar.setValue(1)  # 100 %: a finished run should not look like one not started
            self.status_label.setText(result.summary())

    def show_result(self, result: FinetuneResult) -> None:
        """The history of a fine-tune in the table and the metric plot (the step curve stays as it was)."""
        self.result = result
        self.epochs = [result.baseline] + list(result.history)
        self.metric_plot.setTitle(result.metric_name or "metric")
        self._redraw()
        self.table.setRowCount(len(self.epochs))
        for row, record in enumerate(self.epochs):
            values = [str(record.epoch), _format_value(record.train_loss), _format_value(record.eval_loss),
                      _format_value(record.metric), _format_value(record.lr),
                      "kept" if record.epoch == result.best_epoch else ""]
            for column, text in enumerate(values):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, column, item)

    def _schedule_redraw(self) -> None:
        if not self._redraw_pending:
            self._redraw_pending = True
            QTimer.singleShot(_REDRAW_MS, self._redraw)

    @Slot()
    def _redraw(self) -> None:
        self._redraw_pending = False
        self.loss_curve.setData(np.asarray(self.steps, dtype=float), np.asarray(self.losses, dtype=float))
        epochs = [r for r in self.epochs if r.eval_loss is not None]  # epoch 0 (the start) at step 0
        ends = self._epoch_end_steps()
        self.eval_loss_points.setData([ends.get(r.epoch, np.nan) for r in epochs], [r.eval_loss for r in epochs])
        measured = [r for r in self.epochs if r.metric is not None]
        self.metric_curve.setData([r.epoch for r in measured], [r.metric for r in measured])
        best = [r for r in measured if r.best]
        if self.result is not None:
            best = [r for r in measured if r.epoch == self.result.best_epoch]
        elif best:
            best = best[-1:]  # during a run: the latest epoch that was best when it ended
        self.best_point.setData([r.epoch for r in best], [r.metric for r in best])

    def _epoch_end_steps(self) -> dict[int, float]:
        """Where each epoch ended on the step axis (the eval loss is drawn there)."""
        ends: dict[int, float] = {0: 0.0}
        total = 0
        for record in self.epochs:
            if record.epoch > 0:
                total += record.steps
                ends[record.epoch] = float(total)
        return ends

    # ----- state --------------------------------------------------------------------------------

    @Slot()
    def _on_session_changed(self) -> None:
        session = self.controller.session
        self.clear_plots()
        if session is not None:
            self._load_settings(session.settings.finetune)
            history = self.controller.finetune_history()
            if history:
                self.show_result(history[-1])
                self.status_label.setText(f"last fine-tune: {history[-1].summary()}")
            else:
                self.status_label.setText("Calibrate, then fine-tune to recover accuracy PTQ lost.")
        else:
            self.status_label.setText("Open a project to fine-tune it.")
        self._busy_changed(self.controller.busy)

    @Slot(bool)
    def _busy_changed(self, busy: bool) -> None:
        has_session = self.controller.session is not None
        ours = busy and self.controller.jobs.job_name == JOB_NAME
        self.run_button.setEnabled(has_session and not busy)
        self.cancel_button.setEnabled(ours)
        self.reset_button.setEnabled(has_session and not busy and
                                     self.controller.session.project.current_finetune is not None)
        if not busy and self.progress_bar.maximum() == 0:  # stop the busy indicator; keep a run's last value
            self.progress_bar.setRange(0, 1)
            self.progress_bar.setValue(0)

    @Slot(object)
    def _job_progress(self, progress: Any) -> None:
        if progress.name != JOB_NAME:
            return
        if progress.total:
            self.progress_bar.setRange(0, progress.total)
            self.progress_bar.setValue(progress.done)
        else:
            self.progress_bar.setRange(0, 0)  # unknown length: busy indicator
