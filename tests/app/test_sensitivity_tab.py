"""The sensitivity tab on the real demo session: bars and table, clicking, ignoring, the fallback search."""

import math

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import open_demo, shown  # noqa: E402
from PySide6.QtCore import QPointF, Qt  # noqa: E402

from workbench.app.formatting import format_delta, format_number, job_times_text  # noqa: E402
from workbench.app.sensitivity_bars import sensitivity_scores  # noqa: E402
from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


def make_tab(controller, qtbot):
    return shown(SensitivityTab(controller), qtbot, 1100, 800)


def run_sensitivity(tab, controller, qtbot):
    tab.batches_spin.setValue(1)
    with qtbot.waitSignal(controller.sensitivity_changed, timeout=60000):
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    return controller.session.latest_sensitivity()


def table_column(tab, column):
    model = tab.table_model
    return [model.item(row, column).text() for row in range(model.rowCount())]


def test_a_run_draws_one_bar_and_one_row_per_unit(controller, qtbot):
    open_demo(controller, qtbot, method="max")
    tab = make_tab(controller, qtbot)
    assert tab.table_model.rowCount() == 0 and "No sensitivity run yet" in tab.summary_label.text()
    result = run_sensitivity(tab, controller, qtbot)
    ranked = result.ranked()
    assert result.num_batches == 1 and result.metric_name == "SQNR (dB)"

    # bars: one per unit, most sensitive on top (y = 0, the axis is inverted), labelled by name
    ticks = tab.chart.getAxis("left")._tickLevels[0]
    assert [label for _, label in ticks] == [u.name for u in ranked]
    assert list(tab.bars.opts["y"]) == list(range(len(ranked)))
    scores = dict(zip([u.name for u in result.units], sensitivity_scores(result)[0]))
    widths = list(tab.bars.opts["width"])
    assert widths == pytest.approx([scores[u.name] for u in ranked])
    assert widths == sorted(widths, reverse=True)  # one-off, higher is better: sorted by what float regains
    assert "regained" in tab.chart.getAxis("bottom").labelText
    brushes = [b.color().name() for b in tab.bars.opts["brushes"]]
    assert brushes[0] != brushes[-1]  # coloured by sensitivity

    # table: the same units and numbers as the result, sorted by rank, sortable by any column
    assert table_column(tab, 0) == [u.name for u in ranked]
    assert table_column(tab, 1) == [format_number(u.value) for u in ranked]
    assert table_column(tab, 2) == [format_delta(u.delta_vs_quantized) for u in ranked]
    assert table_column(tab, 3) == ["−∞"] * len(ranked)  # FP32 SQNR is infinite ...
    assert tab.table.isColumnHidden(3)  # ... so the column says nothing and is hidden
    assert table_column(tab, 4) == [str(u.rank) for u in ranked]
    assert tab.table_model.horizontalHeaderItem(1).text() == "SQNR (dB)"
    tab.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    assert table_column(tab, 0) == sorted(u.name for u in ranked)
    tab.table.sortByColumn(1, Qt.SortOrder.AscendingOrder)
    assert table_column(tab, 0) == [u.name for u in sorted(ranked, key=lambda u: u.value)]
    assert "FP32 ∞" in tab.summary_label.text() and f"{len(ranked)} units" in tab.summary_label.text()

    # a second tab (the window re-created, say) shows the stored result at once
    other = make_tab(controller, qtbot)
    assert table_column(other, 0) == [u.name for u in ranked]


def test_clicking_bars_and_rows_selects_layers_and_follows_the_controller(controller, qtbot):
    session = open_demo(controller, qtbot, method="max")
    tab = make_tab(controller, qtbot)
    ranked = run_sensitivity(tab, controller, qtbot).ranked()

    # the handler a click calls
    with qtbot.waitSignal(controller.selection_changed) as blocker:
        tab.bar_clicked(0)
    assert blocker.args == [session.layers_of(ranked[0])]

    # a real mouse click on the third bar
    qtbot.waitUntil(lambda: tab.chart.getPlotItem().getViewBox().sceneBoundingRect().width() > 100)
    view = tab.chart.getPlotItem().getViewBox()
    width = tab.bars.opts["width"][2]
    scene_point = view.mapViewToScene(QPointF(max(width, 0.0) / 2 + 1e-3, 2.0))
    widget_point = tab.chart.mapFromScene(scene_point)
    with qtbot.waitSignal(controller.selection_changed) as blocker:
        qtbot.mouseClick(tab.chart.viewport(), Qt.MouseButton.LeftButton, pos=widget_point)
    assert blocker.args == [session.layers_of(ranked[2])]
    assert tab.selected_units() == [ranked[2].name]
    pens = tab.bars.opts["pens"]
    assert pens[2].width() > pens[0].width()  # the selected bar is outlined

    # a table row
    row = next(r for r in range(tab.table_model.rowCount()) if tab.table_model.item(r, 0).text() == "block.add")
    with qtbot.waitSignal(controller.selection_changed) as blocker:
        tab.table.selectRow(row)
    assert blocker.args == [["block.add"]]  # the unit named by block.add._input1_quantizer is that layer

    # selecting elsewhere (the tree) moves the table selection and the outline
    controller.select(["fc"])
    selected = [tab.table_model.item(i.row(), 0).text() for i in tab.table.selectionModel().selectedRows()]
    assert selected == ["fc"] and tab.selected_units() == ["fc"]
    assert controller.selection == ["fc"]  # following did not bounce back into a new selection


def test_ignore_the_worst_n(controller, qtbot):
    session = open_demo(controller, qtbot, method="max")
    tab = make_tab(controller, qtbot)
    ranked = run_sensitivity(tab, controller, qtbot).ranked()
    tab.worst_spin.setValue(2)
    assert tab.ignore_button.text() == "Leave the worst 2 in float"
    expected = session.layers_of(ranked[0]) + session.layers_of(ranked[1])
    with qtbot.waitSignal(controller.layers_changed):
        qtbot.mouseClick(tab.ignore_button, Qt.MouseButton.LeftButton)
    assert [name for name, d in session.project.layers.items() if not d.quantize] == \
        [name for name in session.project.layers if name in expected]
    assert table_column(tab, 0)[:3] == [f"{ranked[0].name}  (float)", f"{ranked[1].name}  (float)", ranked[2].name]
    assert "In float now" in tab.ignore_label.text()


def test_fallback_search_plots_the_curve_and_applies(controller, qtbot):
    session = open_demo(controller, qtbot, method="max")
    tab = make_tab(controller, qtbot)
    profile = run_sensitivity(tab, controller, qtbot)
    panel = tab.fallback_panel

    # SQNR: FP32 is infinite, so the goal starts as a target in dB; a tolerance reads as a gain over all-INT8
    assert panel.goal_box.currentData() == "target" and panel.goal_box.model().item(0).isEnabled()
    assert "counts from the all-INT8 value" in panel.goal_box.itemData(0, Qt.ItemDataRole.ToolTipRole)
    # the search with the project's own metric (sqnr there too): a target above the current value, not it
    metric = panel._metric
    panel._metric = lambda: None
    panel.metric_changed()
    assert panel.goal_box.currentData() == "target" and panel.goal_spin.value() == round(profile.quantized + 6.0)
    panel._metric = metric
    panel.metric_changed()
    target = round(profile.quantized + 3.0, 1)
    panel.goal_spin.setValue(target)
    assert panel.fallback_options() == {"metric": "sqnr", "max_units": None, "target": target}
    with qtbot.waitSignal(controller.fallback_changed, timeout=60000) as blocker:
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    result = blocker.args[0]
    xs, ys = panel.fallback_curve.getData()
    assert list(xs) == result.plot_data()[0] and list(ys) == pytest.approx(result.plot_data()[1])
    assert panel.target_line.isVisible() and panel.target_line.value() == pytest.approx(target)
    assert not panel.fp32_line.isVisible()  # infinite: no line to draw
    marker_x, _ = panel.chosen_marker.getData()
    assert list(marker_x) == [len(result.chosen)]
    assert result.reached and "Reached" in panel.fallback_label.text()
    assert all(name in panel.fallback_label.text() for name in result.chosen_names)

    assert panel.apply_button.isEnabled() and panel.apply_button.text().startswith("Apply: leave")
    with qtbot.waitSignal(controller.layers_changed):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    floating = {name for name, d in session.project.layers.items() if not d.quantize}
    assert floating == {layer for unit in result.chosen for layer in session.layers_of(unit)}
    assert not panel.apply_button.isEnabled() and "Applied" in panel.fallback_label.text()


def test_top1_tolerance_band_and_errors(controller, qtbot):
    session = open_demo(controller, qtbot, method="max")
    tab = make_tab(controller, qtbot)
    panel = tab.fallback_panel
    labels = [tab.metric_box.itemText(i) for i in range(tab.metric_box.count())]
    assert labels == ["SQNR (dB)", "cosine similarity", "MSE", "top-1 accuracy"]  # the digits have labels
    tab.metric_box.setCurrentIndex(tab.metric_box.findData("top1"))
    assert panel.goal_box.currentData() == "tolerance" and panel.goal_spin.value() == pytest.approx(0.01)
    panel.goal_spin.setValue(0.05)
    with qtbot.waitSignal(controller.fallback_changed, timeout=60000) as blocker:
        panel.run_fallback()
    result = blocker.args[0]
    assert result.tolerance == pytest.approx(0.05)
    assert panel.fp32_line.isVisible() and panel.fp32_line.value() == pytest.approx(result.fp32)
    low, high = panel.fallback_band.getRegion()
    assert (low, high) == pytest.approx((result.fp32 - 0.05, result.fp32))
    assert session.latest_fallback().tolerance == pytest.approx(0.05)
    with qtbot.waitSignal(controller.sensitivity_changed, timeout=60000):
        tab.run_sensitivity()  # top-1 against FP32 is finite: the column is back
    assert not tab.table.isColumnHidden(3) and "−∞" not in table_column(tab, 3)

    # a failing job reaches the user as an error signal, and the tab stays usable
    with qtbot.waitSignal(controller.error, timeout=30000) as blocker:
        tab.scheme_box.setCurrentIndex(0)
        tab.batches_spin.setValue(0)
        tab.metric_box.setCurrentIndex(tab.metric_box.findData("sqnr"))
        panel.goal_box.setCurrentIndex(0)
        panel.goal_spin.setValue(-1.0)  # a negative tolerance: refused by the analysis
        panel.run_fallback()
    assert "tolerance must be a finite number >= 0" in blocker.args[1]
    qtbot.waitUntil(lambda: tab.run_button.isEnabled())


def test_without_a_project_or_calibration(controller, qtbot):
    tab = make_tab(controller, qtbot)
    assert not tab.run_button.isEnabled() and tab.table_model.rowCount() == 0
    open_demo(controller, qtbot)
    assert tab.run_button.isEnabled()
    with qtbot.waitSignal(controller.error, timeout=30000) as blocker:
        tab.run_sensitivity()
    assert "calibrate first" in blocker.args[1]


def test_one_count_and_one_clock_for_the_sensitivity_job(controller, qtbot):
    from workbench.app.status import JobStatus

    open_demo(controller, qtbot, method="max")
    tab = make_tab(controller, qtbot)
    status = JobStatus(controller)
    qtbot.addWidget(status)
    seen = []

    def report(progress):  # connected after both displays: they have shown this report
        seen.append((progress.done, progress.total, progress.message, tab.progress.format(), status.bar.format(),
                     status.eta.text()))

    controller.jobs.progress.connect(report)
    run_sensitivity(tab, controller, qtbot)
    controller.jobs.progress.disconnect(report)
    counted = [s for s in seen if s[1] > 1]
    assert counted and counted[-1][0] == counted[-1][1]  # it counts up to its total
    for done, total, message, tab_text, bar_text, times in counted:
        # the tab and the status bar read the same count (the status bar's), with a clock ...
        assert tab_text.startswith(f"{done}/{total} · ") and bar_text == f"{done}/{total}"
        assert "elapsed" in tab_text and "elapsed" in times
        # ... and the message names the step without a second, different counter
        assert "/" not in message.split(":")[-1], message
    assert not tab.progress.isVisible()  # gone with the job


def test_the_job_clock_counts_up_and_the_eta_down_between_reports():
    assert job_times_text(3.0, None, 0.0) == "3.0 s elapsed"
    assert job_times_text(12.0, 30.0, 0.0) == "12 s elapsed · ETA 30 s"
    # 5 s after that report: 5 s more elapsed, 5 s less to go; never below zero
    assert job_times_text(17.0, 30.0, 5.0) == "17 s elapsed · ETA 25 s"
    assert job_times_text(60.0, 30.0, 48.0).endswith("· finishing")  # counted down, still running


def test_the_unit_column_fits_its_names_beside_the_chart(controller, qtbot):
    from PySide6.QtCore import Qt as QtNames

    from workbench.analysis.results import SensitivityResult, UnitResult
    from workbench.app.sensitivity_tab import UNIT_COLUMN_MAX_PX

    names = ["bert.encoder.layer.10.attention.self.query", "bert.encoder.layer.1.attention.output.dense",
             "classifier"]
    units = [UnitResult(name, [f"{name}._input_quantizer"], 30.0 - i, 1.0 - i, -5.0, rank=i + 1)
             for i, name in enumerate(names)]
    result = SensitivityResult("one-off", {"name": "sqnr", "direction": "higher"}, math.inf, 25.0, units, 1, 0.1)
    tab = make_tab(controller, qtbot)
    tab.show_result(result)
    metrics = tab.table.fontMetrics()
    widest = max(metrics.horizontalAdvance(name) for name in names)
    # the names read whole: the column is as wide as the longest one, not what the number columns leave over
    assert tab.table.columnWidth(0) >= widest
    header = tab.table.horizontalHeader()
    shown = sum(header.sectionSize(c) for c in range(5) if not header.isSectionHidden(c))
    assert shown <= tab.table.viewport().width() + 1  # and every column fits beside the chart
    assert tab.chart.width() > 200
    assert tab.table_model.item(0, 0).toolTip().startswith(names[0] + "\n")  # the full path in the tooltip

    # a name longer than the limit: the column stops there and the name is elided at its front
    long_name = ".".join(["very_long_module_name"] * 12 + ["query"])
    units.append(UnitResult(long_name, [], 1.0, 0.0, -9.0, rank=4))
    tab.show_result(SensitivityResult("one-off", {"name": "sqnr", "direction": "higher"}, math.inf, 25.0, units,
                                      1, 0.1))
    assert tab.table.columnWidth(0) <= UNIT_COLUMN_MAX_PX < metrics.horizontalAdvance(long_name)
    shown = sum(header.sectionSize(c) for c in range(5) if not header.isSectionHidden(c))
    assert shown <= tab.table.viewport().width() + 1
    assert tab.table.textElideMode() == QtNames.TextElideMode.ElideLeft

    # a narrow tab (a wide Model dock beside it): the table takes its share, every column still fits (no
    # horizontal scroll that would hide the names when a row is selected), the names elided at the front
    tab.resize(700, 800)
    qtbot.waitUntil(lambda: tab.width() == 700)
    shown = sum(header.sectionSize(c) for c in range(5) if not header.isSectionHidden(c))
    assert shown <= tab.table.viewport().width() + 1
    qtbot.waitUntil(lambda: tab.table.horizontalScrollBar().maximum() == 0, timeout=3000)  # once laid out
    assert 120 <= tab.table.columnWidth(0) < UNIT_COLUMN_MAX_PX
    tab.table.selectRow(3)
    assert tab.table.horizontalScrollBar().value() == 0
    row = next(r for r in range(4) if tab.table_model.item(r, 0).data(QtNames.ItemDataRole.UserRole) == long_name)
    assert tab.table_model.item(row, 0).toolTip().startswith(long_name + "\n")


def test_a_narrow_unit_column_keeps_each_layers_block_index(controller, qtbot):
    """Two layers that differ only in their block index still read apart in a column too narrow for either."""
    from PySide6.QtWidgets import QStyleOptionViewItem

    from workbench.analysis.results import SensitivityResult, UnitResult

    names = ["bert.encoder.layer.0.attention.output.dense", "bert.encoder.layer.1.attention.output.dense"]
    units = [UnitResult(name, [], 30.0 - i, 1.0 - i, -5.0, rank=i + 1) for i, name in enumerate(names)]
    tab = make_tab(controller, qtbot)
    tab.show_result(SensitivityResult("one-off", {"name": "sqnr", "direction": "higher"}, math.inf, 25.0, units,
                                      1, 0.1))
    tab.table.setColumnWidth(0, 130)
    delegate = tab.table.itemDelegateForColumn(0)
    shown = []
    for row in range(2):
        option = QStyleOptionViewItem()
        option.rect = tab.table.visualRect(tab.table_model.index(row, 0))
        option.widget = tab.table
        delegate.initStyleOption(option, tab.table_model.index(row, 0))
        assert tab.table.fontMetrics().horizontalAdvance(option.text) <= option.rect.width()
        shown.append(option.text)
    assert shown[0] != shown[1] and "0." in shown[0] and "1." in shown[1]  # e.g. "…0.….output.dense"
    assert all(text.endswith("dense") for text in shown)
