"""The desktop app on a tiny BERT classifier (a Hugging Face folder with token ids), point by point of what a
user of a real transformer runs into: edits without a rebuild, a histogram line for every selected layer, the
method the tree shows, moving progress, queued edits (pytest-qt, offscreen)."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("transformers")

from bert_project import bert_specs  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402
from window_waits import settle  # noqa: E402

from workbench.app.tree_model import INPUT, PRECISION, WEIGHT  # noqa: E402

Buttons = QMessageBox.StandardButton
QUERY = "bert.encoder.layer.0.attention.self.query"
KEY = "bert.encoder.layer.0.attention.self.key"
VALUE = "bert.encoder.layer.0.attention.self.value"


def open_bert(window, qtbot, tmp_path, calibrate=True):
    model, data = bert_specs(tmp_path)
    controller = window.controller
    with qtbot.waitSignal(controller.session_changed, timeout=120000):
        assert controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    if calibrate:
        with qtbot.waitSignal(controller.busy_changed, timeout=60000, check_params_cb=lambda busy: not busy):
            assert controller.calibrate(method="entropy")
        settle(window, qtbot)
    assert not window.error_dialogs, window.error_dialogs[-1].message
    return controller.session


def test_descriptor_edit_applies_in_place_without_a_rebuild(window, qtbot, tmp_path, monkeypatch):
    session = open_bert(window, qtbot, tmp_path)
    model = session.quantized_model()
    builds = []
    original = session.quantized_model
    import workbench.session.edits as edits
    import workbench.session.reading as reading
    real_build = reading.build_quantized
    for module in (reading, edits):  # where the live model is built, and where an edit syncs the layers
        monkeypatch.setattr(module, "build_quantized", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    window.controller.select([QUERY, KEY])
    panel = window.layer_panel
    qtbot.waitUntil(lambda: panel.title.text().startswith("2 layers selected"))
    panel.role_tabs.setCurrentIndex(1)
    panel.editor.num_bits.setValue(6)
    assert panel.apply()
    assert not window.controller.busy  # no "Updating the model" job: nothing to rebuild
    settle(window, qtbot)
    assert builds == [] and original() is model
    assert model.get_submodule(QUERY)._weight_quantizer.num_bits == 6
    assert model.get_submodule(KEY)._weight_quantizer.num_bits == 6
    qtbot.waitUntil(lambda: window.tree.model.text(QUERY, WEIGHT).startswith("int6"))


def test_histogram_line_applies_to_every_selected_layer_and_the_tree_says_so(window, qtbot, tmp_path):
    session = open_bert(window, qtbot, tmp_path)
    window.controller.select([QUERY, KEY, VALUE])
    panel = window.layer_panel
    qtbot.waitUntil(lambda: panel.histogram is not None and panel.quantizer_name == f"{QUERY}._input_quantizer")
    assert window.tree.model.text(KEY, INPUT).endswith("hist/entropy")
    panel.choose_method("mse")
    settle(window, qtbot)
    run = session.project.current_calibration
    for layer in (QUERY, KEY, VALUE):
        assert run.quantizers[f"{layer}._input_quantizer"].method == "mse"
    qtbot.waitUntil(lambda: window.tree.model.text(KEY, INPUT).endswith("hist/mse"))
    # and after a save and reopen
    path = tmp_path / "bert.qwb"
    assert window.controller.save(path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.open_project(path)
    settle(window, qtbot)
    assert window.tree.model.text(VALUE, INPUT).endswith("hist/mse")
    other = "bert.encoder.layer.1.attention.self.query"
    assert window.tree.model.text(other, INPUT).endswith("hist/entropy")
    # an attention layer: the plot shows the quantizer the editor edits (the query), not the probabilities
    session = window.controller.session
    attention = next(n for n, d in session.project.layers.items() if "Attention" in d.type)
    window.controller.select([attention])
    panel = window.layer_panel
    qtbot.waitUntil(lambda: panel.quantizer_name is not None and panel.quantizer_name.startswith(attention))
    assert panel.quantizer_name.endswith("._q_quantizer")


def test_an_edit_during_a_job_waits_for_it_and_then_applies(window, qtbot, tmp_path):
    session = open_bert(window, qtbot, tmp_path, calibrate=False)
    gate = threading.Event()
    controller = window.controller

    def slow(progress, cancel):
        progress(0, 1, "waiting")
        gate.wait(20)

    assert controller._start("Waiting", slow, lambda _: None)
    assert controller.set_descriptor([QUERY], "weight", {"num_bits": 7}) is None  # not refused: queued
    assert controller.queued_edits == ["Set descriptor"] and not window.error_dialogs
    assert session.project.layers[QUERY].weight_desc is None
    gate.set()
    qtbot.waitUntil(lambda: session.project.layers[QUERY].weight_desc is not None, timeout=20000)
    assert session.project.layers[QUERY].weight_desc["num_bits"] == 7 and controller.queued_edits == []
    assert "Set descriptor: waits for 'Waiting' to finish" in window.log_panel.plain_text()


def test_a_long_job_shows_a_moving_clock_and_no_frozen_count(window, qtbot, tmp_path):
    open_bert(window, qtbot, tmp_path, calibrate=False)
    gate = threading.Event()
    status = window.job_status

    def one_step(progress, cancel):
        progress(0, 1, "exporting")
        gate.wait(20)

    assert window.controller._start("Exporting", one_step, lambda _: None)
    qtbot.waitUntil(lambda: status.last is not None)
    assert status.bar.maximum() == 0  # a busy bar, not "0/1"
    first = status.eta.text()
    time.sleep(1.1)
    qtbot.waitUntil(lambda: status.eta.text() != first, timeout=3000)
    assert "elapsed" in status.eta.text()
    gate.set()
    qtbot.waitUntil(lambda: not window.controller.busy)


def test_names_read_whole_columns_fit_and_the_layout_comes_back(window, qtbot, tmp_path):
    session = open_bert(window, qtbot, tmp_path, calibrate=False)
    tree = window.tree
    view, model = tree.view, tree.model
    metrics = view.fontMetrics()
    # the deepest layer's own name fits its column: no "..." for "query" ten levels down
    depth = model.depths()[model.node_of(QUERY)]
    assert view.columnWidth(0) >= view.indentation() * (depth + 1) + metrics.horizontalAdvance("query")
    from PySide6.QtWidgets import QStyleOptionViewItem

    option = QStyleOptionViewItem()
    view.itemDelegateForColumn(0).initStyleOption(option, tree.proxy.mapFromSource(model.index_of(QUERY)))
    assert option.textElideMode == Qt.TextElideMode.ElideLeft  # the name's end stays in view
    for column in range(1, 6):
        widest = max(metrics.horizontalAdvance(text) for text in model.column_texts(column))
        assert view.columnWidth(column) >= min(widest, 300), column
    tip = model.data(model.index_of(QUERY), 3)  # ToolTipRole: the full path
    assert tip.startswith(QUERY)
    # a user's widths and open rows are remembered for this project file
    path = tmp_path / "bert.qwb"
    assert window.controller.save(path)
    view.setColumnWidth(1, 333)
    view.collapseAll()
    view.expand(tree.proxy.mapFromSource(model.index_of("")))
    view.expand(tree.proxy.mapFromSource(model.index_of("bert")))
    window.tree.remember_layout()
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.open_project(path)
    settle(window, qtbot)
    assert view.columnWidth(1) == 333
    assert view.isExpanded(tree.proxy.mapFromSource(model.index_of("bert")))
    assert not view.isExpanded(tree.proxy.mapFromSource(model.index_of("bert.encoder")))
    assert session is not window.controller.session


def test_sensitivity_labels_are_elided_at_the_front(window, qtbot, tmp_path):
    open_bert(window, qtbot, tmp_path)
    tab = window.extra_tabs["Sensitivity"]
    with qtbot.waitSignal(window.controller.sensitivity_changed, timeout=120000):
        assert window.controller.sensitivity(metric="cosine")
    settle(window, qtbot)
    qtbot.waitUntil(lambda: tab.result is not None)
    ticks = tab.chart.getAxis("left")._tickLevels[0]
    labels = [text for _, text in ticks]
    assert len(set(labels)) == len(labels)  # every unit tells itself apart
    queries = [text for text in labels if text.endswith("self.query")]
    assert queries and all(".0." in text or ".1." in text or text.startswith("…0") or text.startswith("…1")
                           for text in queries)
    item = tab.table_model.item(0, 0)
    assert item.toolTip().startswith(item.data(0x0100))


def test_wizard_defaults_follow_the_model_source(window, qtbot, tmp_path):
    from bert_project import write_bert, write_tokens

    folder, tokens = write_bert(tmp_path / "bert"), write_tokens(tmp_path / "tokens.npz")
    wizard = window.new_project()
    page = wizard.model_page
    page.kind.setCurrentIndex(page.kind.findData("hf"))
    page.hf_folder.setText(str(folder))
    wizard.next()
    calibration = wizard.calibration_page.form
    assert wizard.currentPage() is wizard.calibration_page
    assert calibration.kind.currentData() == "tensors"  # not demo digits for a user's model
    assert "named after the forward's arguments" in calibration.hint.text() and calibration.hint.isVisibleTo(wizard)
    assert "input_ids" in calibration.path.placeholderText()
    calibration.path.setText(str(tokens))
    calibration.batch_size.setValue(4)
    calibration.num_batches.setValue(2)
    wizard.next()
    evaluation = wizard.evaluation_page
    assert not evaluation.use_separate.isChecked() and not evaluation.form.isEnabled()
    assert evaluation.form.kind.currentData() == "tensors"
    wizard.next()
    request = wizard.request()
    assert request["evaluation"] is None and request["calibration"].path == str(tokens)
    assert request["model"].kind == "hf" and not request["trust_code"]
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        wizard.accept()
    settle(window, qtbot)
    assert not window.error_dialogs
    assert QUERY in window.controller.session.project.layers
    # the demo model still starts on demo digits, evaluated on the test split
    wizard = window.new_project()
    wizard.next()
    assert wizard.calibration_page.form.kind.currentData() == "demo"
    wizard.next()
    assert wizard.evaluation_page.use_separate.isChecked() and wizard.evaluation_page.spec().split == "test"
    wizard.reject()


def _lint(window, qtbot):
    state = window.controller.lint_state
    with qtbot.waitSignal(state.changed, timeout=120000, check_params_cb=lambda *a: state.warnings is not None
                          and not state.stale):
        assert state.run()
    settle(window, qtbot)
    return state


def test_lint_is_kept_in_the_project_and_reused_while_nothing_changed(window, qtbot, tmp_path, monkeypatch):
    session = open_bert(window, qtbot, tmp_path)
    exports = []
    real_export = session.export
    monkeypatch.setattr(session, "export", lambda *a, **k: exports.append(k.get("remember", True))
                        or real_export(*a, **k))
    state = _lint(window, qtbot)
    first = [w.to_dict() for w in state.warnings]
    assert exports == [False]  # one preview export
    state = _lint(window, qtbot)
    assert exports == [False] and [w.to_dict() for w in state.warnings] == first  # reused: not exported again
    assert "from the last lint" in window.log_panel.plain_text()
    # an edit makes it stale; editing back makes it current again (the same state)
    assert window.controller.set_descriptor([QUERY], "weight", {"num_bits": 7}) is not None
    qtbot.waitUntil(lambda: state.stale)
    assert window.controller.reset_descriptor([QUERY], "weight") is not None  # back to the default
    settle(window, qtbot)
    qtbot.waitUntil(lambda: not state.stale)
    # exporting this state: the next lint reads that file, no preview
    assert window.controller.set_quantize([KEY], False) is not None
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.export_finished, timeout=120000):
        assert window.controller.export(tmp_path / "bert.onnx")
    settle(window, qtbot)
    state = _lint(window, qtbot)
    assert exports == [False, True] and session.latest_lint()[2] == "bert.onnx"
    # saved and reopened: the lint is there, current
    path = tmp_path / "bert.qwb"
    assert window.controller.save(path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.open_project(path)
    settle(window, qtbot)
    state = window.controller.lint_state
    assert state.warnings is not None and not state.stale
    assert [w.to_dict() for w in state.warnings] == [w.to_dict() for w in session.latest_lint()[0]]


def test_numbers_shown_say_when_the_project_changed_since(window, qtbot, tmp_path):
    open_bert(window, qtbot, tmp_path)
    summary = window.summary_label
    assert "output SQNR" in summary.text() and "changed since" not in summary.text()
    graph = window.extra_tabs["Graph"]
    with qtbot.waitSignal(window.controller.export_finished, timeout=120000):
        assert window.controller.export(tmp_path / "bert.onnx")
    settle(window, qtbot)
    assert graph.path is not None and not graph.out_of_date and not graph.stale_label.isVisibleTo(graph)
    # a histogram line picked: the amax changed, the SQNR measured at calibration and the export are old
    window.controller.select([QUERY])
    panel = window.layer_panel
    qtbot.waitUntil(lambda: panel.histogram is not None)
    panel.choose_method("mse")
    settle(window, qtbot)
    qtbot.waitUntil(lambda: "changed since" in summary.text())
    assert graph.out_of_date and graph.stale_label.isVisibleTo(graph)
    panel.choose_method("entropy")  # back to the calibrated amax: both are current again
    settle(window, qtbot)
    qtbot.waitUntil(lambda: "changed since" not in summary.text())
    assert not graph.stale_label.isVisibleTo(graph)


def test_precision_column_per_row_and_for_many_rows(window, qtbot, tmp_path):
    from PySide6.QtWidgets import QComboBox

    session = open_bert(window, qtbot, tmp_path)
    tree = window.tree
    model = tree.model
    assert model.text(QUERY, PRECISION) == "int8"
    assert model.headerData(PRECISION, Qt.Orientation.Horizontal) == "Precision"
    # one row: the combo offers what applies to a Linear, and choosing sets it
    index = tree.proxy.mapFromSource(model.index_of(QUERY, PRECISION))
    tree.view.scrollTo(index)
    tree.view.edit(index)
    combo = tree.view.indexWidget(index) or next(w for w in tree.view.findChildren(QComboBox) if w.isVisible())
    assert [combo.itemData(i) for i in range(combo.count())] == ["int8", "fp8", "int4w", "nvfp4", "float"]
    combo.setCurrentIndex(combo.findData("fp8"))
    combo.activated.emit(combo.currentIndex())
    settle(window, qtbot)
    assert session.precisions([QUERY])[QUERY].value == "fp8"
    qtbot.waitUntil(lambda: model.text(QUERY, PRECISION) == "fp8")
    # many rows from the context menu: int4w applies to the Linears whose input takes INT4 blocks TensorRT builds
    # (the FFN outputs read 64 features; key reads 32, which no block of 64 or 128 divides); the attention layer
    # and key are left as they were
    attention = next(n for n, d in session.project.layers.items() if "Linear" not in d.type)
    ffn = "bert.encoder.layer.0.output.dense"
    window.controller.select([KEY, ffn, attention])
    qtbot.waitUntil(lambda: set(tree.selected_layers()) == {KEY, ffn, attention})
    menu = tree.context_menu()
    actions = {a.data(): a for a in tree.precision_menu.actions()}
    assert actions["int4w"].text() == "INT4 W (1 of 3 layers)" and actions["int4w"].isEnabled()
    before = session.precisions([attention, KEY])
    actions["int4w"].trigger()
    menu.close()
    settle(window, qtbot)
    got = session.precisions([KEY, ffn, attention])
    assert got[ffn].value == "int4w" and got[attention] == before[attention] and got[KEY] == before[KEY]
    assert f"does not apply to {KEY}, {attention}" in window.log_panel.plain_text() or (
        f"does not apply to {attention}, {KEY}" in window.log_panel.plain_text())
    qtbot.waitUntil(lambda: model.text(ffn, PRECISION) == "int4w")


def test_fallback_box_reopens_as_it_was(window, qtbot, tmp_path):
    session = open_bert(window, qtbot, tmp_path)
    panel = window.extra_tabs["Sensitivity"].fallback_panel
    controller = window.controller
    with qtbot.waitSignal(controller.fallback_changed, timeout=180000):
        assert controller.fallback(metric="sqnr", target=99.0, max_units=2)
    settle(window, qtbot)
    assert panel.result is not None and panel.result.chosen and panel.apply_button.isEnabled()
    panel.goal_spin.setValue(12.0)  # the user types a new goal, not searched
    assert panel.apply_fallback()
    settle(window, qtbot)
    assert not panel.apply_button.isEnabled() and "Applied" in panel.fallback_label.text()
    path = tmp_path / "bert.qwb"
    assert controller.save(path)
    with qtbot.waitSignal(controller.session_changed, timeout=120000):
        assert controller.open_project(path)
    settle(window, qtbot)
    panel = window.extra_tabs["Sensitivity"].fallback_panel
    assert panel.result is not None and panel.result.applied
    assert panel.goal_box.currentData() == "target" and panel.goal_spin.value() == pytest.approx(99.0)
    assert not panel.apply_button.isEnabled() and "Applied" in panel.fallback_label.text()
    # a layer it left in float quantized again: the search is no longer applied, Apply is offered again
    chosen = controller.session.layers_of(panel.result.chosen[0])
    assert controller.set_quantize(chosen, True) is not None
    settle(window, qtbot)
    assert controller.session.latest_fallback().applied is False
    assert session is not controller.session


def test_the_log_says_each_thing_once_in_words(window, qtbot, tmp_path):
    session = open_bert(window, qtbot, tmp_path, calibrate=False)
    assert window.controller.set_quantize([QUERY], False) is not None  # a rebuild: the tracer runs again
    settle(window, qtbot)
    session.quantized_model()
    assert window.controller.set_quantize([QUERY], True) is not None
    settle(window, qtbot)
    text = window.log_panel.plain_text()
    # a module torch.fx cannot follow is now quantized at run time; a note about one is said once, not per rebuild
    assert text.count("could not be traced (torch.fx cannot follow their Python code)") <= 1
    assert "ValueError" not in text and "TypeError" not in text and "Proxy" not in text
