"""pyqtgraph plots in the window's colours (one look for every chart)."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QPalette

__all__ = ["style_plot"]


def style_plot(plot: pg.PlotWidget) -> None:
    """Plots take the window's colours rather than pyqtgraph's global (black) defaults."""
    palette = plot.palette()
    plot.setBackground(palette.color(QPalette.ColorRole.Base))
    text = palette.color(QPalette.ColorRole.Text)
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        axis.setPen(pg.mkPen(text))
        axis.setTextPen(pg.mkPen(text))
