"""Issue 36 round 3: the sensitivity bar chart at the default window size (1480x920), on a transformer. Point 2: the
chart has a usable height before any result. The GPT-2 run: beside the table the chart was 266 px wide, the unit
names took 150 of them, the bars 70, and the top bar's value was cut to "+"; the names now take LABEL_SHARE_MAX of
the chart (more only where units would read alike), and the values are inside the plot."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from window_waits import open_calibrated_bert, settle  # noqa: E402

from workbench.app.sensitivity_tab import LABEL_SHARE_MAX  # noqa: E402


def test_chart_is_tall_before_a_result_and_its_bars_and_values_fit_after(window, qtbot, tmp_path):
    window.resize(1480, 920)  # the window's default size
    open_calibrated_bert(window, qtbot, tmp_path)
    tab = window.extra_tabs["Sensitivity"]
    window.tabs.setCurrentWidget(tab)
    qtbot.wait(100)
    assert tab.chart.height() >= 200  # point 2: not squeezed to a few pixels before any result

    with qtbot.waitSignal(window.controller.sensitivity_changed, timeout=120000):
        assert window.controller.sensitivity(num_batches=1)
    settle(window, qtbot)
    qtbot.wait(100)
    chart, axis = tab.chart, tab.chart.getAxis("left")
    assert any(len(unit.name) > 30 for unit in tab.chart_units)  # BERT's long names ("bert.encoder.layer.0...")
    labels = [text for _, text in axis._tickLevels[0]]
    assert len(set(labels)) == len(labels)  # short, but every unit still tells itself apart
    # the names take their share of the chart, more only as far as telling BERT's units apart needs, never half
    assert LABEL_SHARE_MAX * chart.width() <= axis.width() - 14 <= 0.5 * chart.width()
    view = chart.getPlotItem().getViewBox()
    assert tab.chart.height() >= 200
    # every value at the end of a bar shown in the chart is inside the plot, not cut at its right edge
    right = view.sceneBoundingRect().right()
    low, high = view.viewRange()[0]
    largest = max(label.pos().x() for label in tab._value_labels)
    assert largest >= 0.5 * high  # the longest bar takes at least half the plot (not a strip left of empty room)
    shown = [label for label in tab._value_labels if label.isVisible()]
    assert shown and all(label.sceneBoundingRect().right() <= right + 1 for label in shown), \
        [(label.textItem.toPlainText(), label.sceneBoundingRect().right(), right) for label in shown]
