"""Issue 36 round 3, the GPT-2 run: the ladder chart's legend (what each kind of point is) sat in the plot's top
right corner, over a point. It is laid out outside the plot area, so it covers no point wherever the mixes fall."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import shown  # noqa: E402
from PySide6.QtCore import QPointF, QRectF  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from workbench.analysis.ladder import LadderResult, LadderStep  # noqa: E402
from workbench.app.fallback_panel import FallbackPanel  # noqa: E402


def _result(corner: str) -> LadderResult:
    """A budget search whose points reach the corner named (the chosen mix, top right, was the one covered)."""
    high = corner.startswith("top")
    right = corner.endswith("right")
    values = [20.0, 24.0, 27.0, 29.0, 30.0] if high else [30.0, 26.0, 23.0, 21.0, 20.0]
    sizes = [1000, 1400, 1800, 2200, 2600] if right else [2600, 2200, 1800, 1400, 1000]
    steps = [LadderStep(None if i == 0 else f"fc{i}", None if i == 0 else "fp8", v, b) for i, (v, b) in
             enumerate(zip(values, sizes))]
    steps.insert(2, LadderStep("head", "float", values[2] - 3, sizes[2] + 200, kept=False))  # an undone step
    return LadderResult(metric={"name": "sqnr"}, ladder=["int8", "fp8", "float"], fp32=float("inf"), start=values[0],
                        value=values[-1], reached=True, precisions={}, units={}, weight_bytes=sizes[-1],
                        float_bytes=4000, steps=steps, ranking=[], budget_bytes=3000)


def _point_rects(panel) -> list[QRectF]:
    """Scene rectangles of every point drawn: the kept mixes, the undone steps and the chosen mix's star."""
    view = panel.ladder_plot.getPlotItem().getViewBox()
    rects = []
    for item, size in ((panel.ladder_curve, 8), (panel.ladder_undone, 8), (panel.ladder_marker, 16)):
        xs, ys = item.getData()
        for x, y in zip(xs, ys):
            centre = view.mapViewToScene(QPointF(float(x), float(y)))
            rects.append(QRectF(centre.x() - size / 2, centre.y() - size / 2, size, size))
    return rects


@pytest.mark.parametrize("corner,width", [("top right", 1000), ("top left", 1000), ("bottom right", 1000),
                                          ("bottom left", 1000), ("top right", 640)])
def test_the_ladder_legend_covers_no_point(controller, qtbot, corner, width):
    """Also in a narrow chart (the window's sensitivity tab beside a wide tree), where one row was cut off."""
    panel = shown(FallbackPanel(controller, lambda: "sqnr", lambda: None), qtbot, width, 420)
    panel.show_ladder(_result(corner))
    QApplication.processEvents()
    panel.ladder_plot.grab()  # laid out and painted, as on screen
    legend = panel.ladder_legend
    assert legend.isVisible() and len(legend.items) == 3
    box = legend.sceneBoundingRect()
    assert box.width() > 0 and box.height() > 0
    points = _point_rects(panel)
    assert len(points) == 7
    assert not [p for p in points if p.intersects(box)], f"the legend {box} covers a point"
    # and all of it is in view: not cut off at the chart's right edge
    view = panel.ladder_plot
    chart = view.mapToScene(view.viewport().rect()).boundingRect()
    assert chart.contains(box), f"the legend {box} does not fit the chart {chart}"
