"""How the sensitivity tab encodes a result: one score per unit, bar colours, sortable number cells.

Plain helpers (``sensitivity_scores`` is tested without a window).
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QStandardItem

from workbench.analysis.results import SensitivityResult, UnitResult
from workbench.app.formatting import format_delta, format_number

__all__ = ["sensitivity_scores", "bar_colour", "finite_clip", "NumberItem", "table_row", "NEUTRAL", "FLOAT",
           "SELECTED_PEN"]

# sequential colours from "hardly matters" to "most sensitive" (ColorBrewer OrRd)
_LOW, _MID, _HIGH = np.array([253, 212, 158]), np.array([252, 141, 89]), np.array([179, 0, 0])
NEUTRAL = QColor(190, 190, 190)
FLOAT = QColor(120, 160, 210)
SELECTED_PEN = pg.mkPen(QColor(20, 90, 200), width=3)


def sensitivity_scores(result: SensitivityResult) -> tuple[list[float], str]:
    """One number per unit (in ``result.units`` order), larger for more sensitive, and its axis title.

    one-off: what leaving the unit in float regains over the all-quantized model. one-on: what
    quantizing it alone loses against FP32; when FP32 is infinite (SQNR of identical outputs) that
    loss is infinite for every unit, so the loss is measured against the least sensitive unit instead.
    Either way the bars are ordered like the ranks, and read in the metric's own units.
    """
    sign = 1.0 if result.higher_is_better else -1.0
    name = result.metric_name
    if result.scheme == "one-off":
        scores = [sign * (u.value - result.quantized) if u.value != result.quantized else 0.0 for u in result.units]
        return scores, f"{name} regained with the unit in float"
    if math.isfinite(result.fp32):
        return [sign * (result.fp32 - u.value) for u in result.units], f"{name} lost with the unit quantized alone"
    finite = [sign * u.value for u in result.units if math.isfinite(u.value)]
    best = max(finite) if finite else 0.0
    scores = [best - sign * u.value if math.isfinite(u.value) else (0.0 if sign * u.value > 0 else math.inf)
              for u in result.units]
    return scores, f"{name} lost vs the least sensitive unit"


def bar_colour(fraction: float) -> QColor:
    """The bar colour of a unit whose score is ``fraction`` of the highest (0 to 1)."""
    fraction = min(max(fraction, 0.0), 1.0)
    if fraction < 0.5:
        rgb = _LOW + (_MID - _LOW) * (fraction / 0.5)
    else:
        rgb = _MID + (_HIGH - _MID) * ((fraction - 0.5) / 0.5)
    return QColor(*(int(round(c)) for c in rgb))


def finite_clip(values: list[float]) -> tuple[list[float], float]:
    """Non-finite scores drawn as a bar a bit longer than the longest finite one (labelled ∞ in the table)."""
    finite = [v for v in values if math.isfinite(v)]
    top = max([abs(v) for v in finite] + [1e-12])
    return [v if math.isfinite(v) else (1.1 * top if v > 0 else 0.0) for v in values], top


class NumberItem(QStandardItem):
    """A table cell that shows formatted text and sorts by the number behind it."""

    def __init__(self, text: str, number: float) -> None:
        super().__init__(text)
        self.setData(number if not math.isnan(number) else -math.inf, Qt.ItemDataRole.UserRole)
        self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.setEditable(False)


def table_row(unit: UnitResult, layers: list[str], in_float: bool) -> list[QStandardItem]:
    """One table row: the unit (its name as UserRole data, "(float)" once all its layers are), the
    metric, the two deltas and the rank, each sorting by its number."""
    name = QStandardItem(unit.name + ("  (float)" if in_float else ""))
    name.setData(unit.name, Qt.ItemDataRole.UserRole)
    name.setEditable(False)
    name.setToolTip(f"{unit.name}\n\nlayers: {', '.join(layers)}\nquantizers: {', '.join(unit.quantizers)}")
    return [name, NumberItem(format_number(unit.value), unit.value),
            NumberItem(format_delta(unit.delta_vs_quantized), unit.delta_vs_quantized),
            NumberItem(format_delta(unit.delta_vs_fp32), unit.delta_vs_fp32),
            NumberItem(str(unit.rank), float(unit.rank))]
