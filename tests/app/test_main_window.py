"""The main window driven like a user would, on the demo project (pytest-qt, offscreen)."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtGui import QKeySequence  # noqa: E402
from PySide6.QtWidgets import QFileDialog, QMessageBox, QStyle, QStyleOptionViewItem  # noqa: E402

from workbench.app.deferred_refresh import DeferredRefresh  # noqa: E402
from workbench.app.main_window import MainWindow, install_excepthook  # noqa: E402
from workbench.app.tree_model import AMAX, INPUT, NAME_ROLE, QUANT, TYPE  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402

Buttons = QMessageBox.StandardButton


@pytest.fixture(autouse=True)
def _no_webengine(monkeypatch):
    # the graph tab falls back to "open in browser": no Chromium start-up in these tests
    monkeypatch.setenv("WORKBENCH_NO_WEBENGINE", "1")


@pytest.fixture
def answers(monkeypatch):
    """What the patched message boxes answer: {"question": button, "warning": button}."""
    replies = {"question": Buttons.Discard, "warning": Buttons.No}
    asked: list[tuple[str, str]] = []

    def question(parent, title, text, *args, **kwargs):
        asked.append(("question", title))
        return replies["question"]

    def warning(parent, title, text, *args, **kwargs):
        asked.append(("warning", title))
        return replies["warning"]

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(warning))
    replies["asked"] = asked
    return replies


@pytest.fixture
def window(qtbot, tmp_path, answers):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    window.show()
    yield window
    window.shutdown()


def load_demo(window, qtbot):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    qtbot.waitUntil(lambda: window.tree.model.node_count() > 0 and not window.controller.busy, timeout=10000)
    return window.controller.session


def settle(window, qtbot):
    """Wait until the views have re-read the session (they refresh once per burst of change signals)."""
    qtbot.waitUntil(lambda: not window.controller.busy and not window.controller.queued_edits
                    and not window.tree._refresh.scheduled()
                    and not window.layer_panel._refresh.scheduled()
                    and not window.layer_panel._plot_timer.isActive())


def calibrate(window, qtbot, **options):
    # the job's end, whether it worked or not (a failure shows up as an error dialog below)
    with qtbot.waitSignal(window.controller.busy_changed, timeout=60000, check_params_cb=lambda busy: not busy):
        assert window.controller.calibrate(**options)
    assert not window.error_dialogs, window.error_dialogs[-1].message
    settle(window, qtbot)


def visible_names(window):
    proxy, names = window.tree.proxy, []

    def walk(parent):
        for row in range(proxy.rowCount(parent)):
            index = proxy.index(row, 0, parent)
            names.append(index.data(NAME_ROLE))
            walk(index)

    walk(proxy.index(-1, -1))
    return names


def quant_index(window, name):
    return window.tree.proxy.mapFromSource(window.tree.model.index_of(name, QUANT))


def test_demo_opens_ready_to_calibrate(window, qtbot):
    session = load_demo(window, qtbot)
    assert "digits-demo" in window.windowTitle() and window.isWindowModified()
    model = window.tree.model
    assert model.node_count() == len(session.tree())
    assert model.check_state("") == Qt.CheckState.Checked and model.text("", QUANT) == "7/7"
    assert model.check_state("block.bn1") is None  # not quantizable: no check box
    assert model.text("block.conv1", INPUT) == "int8 per-tensor hist"
    assert window.calibrate_action.isEnabled() and window.save_action.isEnabled()
    assert not window.cancel_action.isEnabled()
    assert "not calibrated" in window.summary_label.text()
    qtbot.waitUntil(lambda: window.layer_panel.title.text().startswith("stem.0"))
    assert "input 1×1×8×8 → output 1×16×8×8" in window.layer_panel.details.text()
    # the plots follow the header one turn of the event loop later (the window repaints in between)
    qtbot.waitUntil(lambda: "Not calibrated yet" in window.layer_panel.histogram_message.textItem.toPlainText())
    tabs = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    assert tabs == ["Layer", "Sensitivity", "Graph", "Fine-tune", "TensorRT"]


def test_menus_and_toolbar_come_from_the_action_registry(window):
    from workbench.app.menus import ACTIONS, MENUS, SEPARATOR, TOOLBAR

    bar = window.menuBar()
    menus = {action.text(): action.menu() for action in bar.actions()}
    assert list(menus) == [title for title, _ in MENUS]
    file_items = [a.text() for a in menus["&File"].actions() if not a.isSeparator()]
    assert file_items == ["&New Project…", "&Open…", "Open &Demo Project", "Open &Recent", "&Save", "Save &As…",
                          "Com&pare with Project…", "&Quit"]
    project_items = [a.text() for a in menus["&Project"].actions() if not a.isSeparator()]
    assert project_items[:5] == ["&Calibrate…", "E&valuate", "&Export…", "Import &TensorRT Report…",
                                 "&Lint for TensorRT"]
    assert project_items[-1] == "&Settings…"
    for spec in ACTIONS:  # each registered command is one action, with its shortcut and tip
        action = getattr(window, f"{spec.name}_action")
        assert action.text() == spec.text and action.toolTip() == (spec.tip or action.text().replace("&", ""))
    assert window.save_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Save)
    toolbar = [a.text() for a in window.toolbar.actions() if not a.isSeparator() and a.text()]
    assert toolbar == [next(s.text for s in ACTIONS if s.name == n) for n in TOOLBAR if n not in (SEPARATOR, "device")]
    # without a project only the commands that need none are enabled
    assert window.new_action.isEnabled() and not window.calibrate_action.isEnabled()
    assert not window.cancel_action.isEnabled() and not window.device_combo.isEnabled()


def test_ticking_and_unticking_subtrees(window, qtbot):
    session = load_demo(window, qtbot)
    model, proxy = window.tree.model, window.tree.proxy
    # untick the residual block: all three of its layers go to float, parents become partial
    assert proxy.setData(quant_index(window, "block"), Qt.CheckState.Unchecked, Qt.ItemDataRole.CheckStateRole)
    assert [n for n, d in session.project.layers.items() if not d.quantize] == ["block.conv1", "block.conv2",
                                                                                 "block.add"]
    qtbot.waitUntil(lambda: model.check_state("block") == Qt.CheckState.Unchecked)
    assert model.check_state("") == Qt.CheckState.PartiallyChecked and model.text("", QUANT) == "4/7"
    assert model.text("block", QUANT) == "0/3" and model.text("block.conv1", INPUT) == "float"
    # tick one layer back: its container is partial
    assert proxy.setData(quant_index(window, "block.conv1"), Qt.CheckState.Checked, Qt.ItemDataRole.CheckStateRole)
    qtbot.waitUntil(lambda: model.check_state("block") == Qt.CheckState.PartiallyChecked)
    assert model.text("block", QUANT) == "1/3" and session.project.layers["block.conv1"].quantize
    # a real click on the root's check box quantizes everything again (partial -> checked)
    view = window.tree.view
    index = quant_index(window, "")
    option = QStyleOptionViewItem()
    option.initFrom(view)
    option.rect = view.visualRect(index)
    option.features |= QStyleOptionViewItem.ViewItemFeature.HasCheckIndicator
    check = view.style().subElementRect(QStyle.SubElement.SE_ItemViewItemCheckIndicator, option, view)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=check.center())
    qtbot.waitUntil(lambda: model.check_state("") == Qt.CheckState.Checked)
    assert all(d.quantize for d in session.project.layers.values())
    # unticking the model leaves every layer in float
    assert proxy.setData(quant_index(window, ""), Qt.CheckState.Unchecked, Qt.ItemDataRole.CheckStateRole)
    qtbot.waitUntil(lambda: model.check_state("") == Qt.CheckState.Unchecked)
    assert not any(d.quantize for d in session.project.layers.values())


def test_filter_by_name_regex_and_type(window, qtbot):
    load_demo(window, qtbot)
    qtbot.keyClicks(window.tree.filter_edit, "conv")
    qtbot.waitUntil(lambda: visible_names(window) == ["", "block", "block.conv1", "block.conv2"])
    assert window.tree.view.isExpanded(window.tree.proxy.mapFromSource(window.tree.model.index_of("block")))
    window.tree.filter_edit.setText(r"^(stem|expand)\.0$")
    window.tree.regex_box.setChecked(True)
    qtbot.waitUntil(lambda: visible_names(window) == ["", "stem", "stem.0", "expand", "expand.0"])
    window.tree.filter_edit.setText("conv[")
    window.tree.apply_filter()
    assert "invalid regular expression" in window.tree.status_label.text()
    window.tree.filter_edit.clear()
    window.tree.regex_box.setChecked(False)
    window.tree.type_combo.setCurrentText("Linear")
    assert visible_names(window) == ["", "fc"]
    assert window.tree.status_label.text().startswith("1 matching")
    window.tree.type_combo.setCurrentIndex(0)
    assert len(visible_names(window)) == window.tree.model.node_count()


def test_folded_batchnorms_show_as_merged_layers(window, qtbot):
    session = load_demo(window, qtbot)
    model = window.tree.model
    assert session.project.settings["fold_bn"] is True  # the default: what TensorRT will run
    assert model.text("block.conv1", TYPE) == "Conv2d (folded bn1)"
    assert model.text("block.bn1", TYPE) == "Identity (folded into block.conv1)"
    window.tree.type_combo.setCurrentText("Conv2d")  # the type filter ignores the notes
    assert "block.conv1" in visible_names(window)
    window.tree.type_combo.setCurrentIndex(0)
    window.controller.set_setting("fold_bn", False)
    settle(window, qtbot)
    assert model.text("block.conv1", TYPE) == "Conv2d" and model.text("block.bn1", TYPE) == "BatchNorm2d"


def test_selection_follows_tree_and_controller(window, qtbot):
    load_demo(window, qtbot)
    tree = window.tree
    with qtbot.waitSignal(window.controller.selection_changed) as blocker:
        tree.view.selectionModel().select(
            tree.proxy.mapFromSource(tree.model.index_of("block")),
            tree.view.selectionModel().SelectionFlag.ClearAndSelect | tree.view.selectionModel().SelectionFlag.Rows)
    assert blocker.args == [["block.conv1", "block.conv2", "block.add"]]  # a container stands for its layers
    window.controller.select(["head_pool", "fc"])
    assert [tree.model.name_of(n) for n in tree.selected_nodes()] == ["head_pool", "fc"]
    qtbot.waitUntil(lambda: window.layer_panel.title.text().startswith("2 layers selected"))


def test_descriptor_edit_for_several_layers(window, qtbot):
    session = load_demo(window, qtbot)
    panel = window.layer_panel
    window.controller.select(["stem.0", "block.conv1", "head_pool"])
    qtbot.waitUntil(lambda: panel.title.text().startswith("3 layers selected"))
    assert not panel.apply_button.isEnabled()
    panel.editor.num_bits.setValue(6)
    panel.editor.narrow_range.setChecked(True)
    assert panel.apply_button.isEnabled() and panel.editor.touched() == {"num_bits", "narrow_range"}
    qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    for name in ("stem.0", "block.conv1", "head_pool"):
        desc = session.project.layers[name].input_desc
        assert desc["num_bits"] == 6 and desc["narrow_range"] and desc["calib_method"] == "histogram"
    assert session.project.layers["fc"].input_desc is None
    qtbot.waitUntil(lambda: window.tree.model.text("block.conv1", INPUT) == "int6 per-tensor hist narrow, sim only")
    assert not panel.apply_button.isEnabled()  # applied: nothing touched any more
    # the weight role: head_pool has no weight quantizer and is skipped
    panel.role_tabs.setCurrentIndex(1)
    assert "1 selected layer has no weight quantizer" in panel.editor_note.text()
    panel.editor.axis.setCurrentIndex(0)  # per-tensor weights
    assert panel.apply()
    assert session.project.layers["stem.0"].weight_desc["axis"] is None
    assert session.project.layers["head_pool"].weight_desc is None
    # a value the session refuses is an error dialog, and nothing changes
    panel.role_tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: panel.editor.isEnabled())
    panel.editor.amax.setText("-1")  # the validator stops typing it; pasted text is checked again
    panel.editor._touch("amax")
    panel.apply()
    qtbot.waitUntil(lambda: bool(window.error_dialogs))
    assert window.error_dialogs[-1].title == "Set descriptor"
    assert "amax" not in session.project.layers["stem.0"].input_desc


def test_context_menu_ignore_descriptor_reset_and_patterns(window, qtbot):
    session = load_demo(window, qtbot)
    tree = window.tree
    window.controller.select(["block.conv1", "block.conv2"])
    menu = tree.context_menu()
    assert [a.text() for a in menu.actions() if a.text()][:5] == ["Quantize", "Ignore (leave in float)",
                                                                   "Set descriptor…", "Reset to default",
                                                                   "Ignore by pattern…"]
    tree.ignore_action.trigger()
    # an edit's rebuild may go to the background on a loaded machine (over SLOW_REBUILD_S) and the next edit
    # then waits for it: the test waits for the rebuild, never for a speed
    settle(window, qtbot)
    assert not session.project.layers["block.conv1"].quantize and not session.project.layers["block.conv2"].quantize
    tree.quantize_action.trigger()
    settle(window, qtbot)
    assert session.project.layers["block.conv1"].quantize
    dialog = tree.set_descriptor_dialog()
    dialog.role.setCurrentIndex(1)  # weight
    dialog.editor.num_bits.setValue(4)
    dialog.accept()
    settle(window, qtbot)
    assert session.project.layers["block.conv2"].weight_desc["num_bits"] == 4
    assert session.project.layers["block.conv2"].weight_desc["axis"] == 0  # untouched fields stay
    tree.reset_action.trigger()
    settle(window, qtbot)
    assert session.project.layers["block.conv2"].weight_desc is None
    # ignore by pattern, with a live preview
    patterns = tree.ignore_pattern_dialog()
    patterns.editor.setPlainText("^fc$\nhead")
    patterns.update_preview()
    assert patterns.matches() == ["head_pool", "fc"]
    assert [patterns.preview.item(i).text() for i in range(patterns.preview.count())] == ["head_pool", "fc"]
    patterns.editor.setPlainText("conv[")
    patterns.update_preview()
    assert "not a valid regular expression" in patterns.summary.text()
    assert not patterns.buttons.button(patterns.buttons.StandardButton.Ok).isEnabled()
    patterns.editor.setPlainText("^fc$\nhead")
    patterns.accept()
    settle(window, qtbot)
    assert [n for n, d in session.project.layers.items() if not d.quantize] == ["head_pool", "fc"]
    assert window.settings.value("ignore_patterns") == "^fc$\nhead"


def test_calibrate_with_progress_histogram_and_amax_lines(window, qtbot):
    session = load_demo(window, qtbot)
    seen = []
    window.controller.jobs.progress.connect(seen.append)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.calibrate_action.trigger()
        assert window.job_status.isVisible() and window.cancel_action.isEnabled()
    qtbot.waitUntil(lambda: not window.controller.busy)
    assert seen and seen[-1].total > 0 and seen[-1].done == seen[-1].total
    # a new project calibrates with "auto": each quantizer's method picked from its layer's output
    assert not window.job_status.isVisible() and "calibrated (auto" in window.summary_label.text()
    window.controller.select(["block.conv1"])
    panel = window.layer_panel
    qtbot.waitUntil(lambda: panel.histogram_item is not None and panel.names == ["block.conv1"])
    data = session.histogram("block.conv1._input_quantizer")
    record = session.project.current_calibration.quantizers["block.conv1._input_quantizer"]
    picked, other = record.method, "mse" if record.method != "mse" else "entropy"
    np.testing.assert_allclose(panel.histogram_x(), data["edges"])
    lines = panel.amax_lines
    assert set(lines) == {"max", "entropy", "mse", "percentile"}
    for method, line in lines.items():
        assert line.value() == pytest.approx(data["amax"][method])
    assert lines[picked].pen.widthF() > lines[other].pen.widthF()  # the one in use stands out
    # the legend and the title say what auto picked and why; the tree's amax tooltip too
    assert f"<b>auto</b> picked {record.reason}" in panel.amax_legend.text()
    assert panel.histogram_title.text().endswith(f"auto: {picked}")
    index = window.tree.model.index_of("block.conv1", AMAX)
    assert f"auto picked {record.reason}" in window.tree.model.data(index, Qt.ItemDataRole.ToolTipRole)
    assert window.tree.model.text("block.conv1", AMAX) == f"{data['current']:.4g}"
    # clicking another method's line makes it the layer's choice
    lines[other].sigClicked.emit(lines[other], None)
    assert record.method == other and record.choice["overridden"] == other
    qtbot.waitUntil(lambda: panel.amax_lines[other].pen.widthF() > panel.amax_lines[picked].pen.widthF())
    assert float(record.amax.max()) == pytest.approx(data["amax"][other])
    assert "auto picked" not in panel.amax_legend.text()
    panel.log_box.setChecked(False)
    assert not panel.histogram_plot.getPlotItem().ctrl.logYCheck.isChecked()
    # the weight plot: one bar per output channel
    assert len(panel.weight_item.opts["height"]) == 16
    # a max-calibrated weight quantizer has no histogram and says so
    panel.quantizer_combo.setCurrentIndex(1)
    assert panel.histogram_item is None and "max calibrator" in panel.histogram_message.textItem.toPlainText()


class GatedBatches:
    """The demo calibration data, held after the first batch until the test opens the gate: the job
    runs for as long as the test needs, whatever the machine's speed."""

    def __init__(self, source):
        self.source = source
        self.gate = threading.Event()

    def __call__(self, *args, **kwargs):
        for index, batch in enumerate(self.source.__class__.batches(self.source, *args, **kwargs)):
            if index > 0:
                self.gate.wait(60)
            yield batch


def test_cancel_calibration_and_editing_disabled_meanwhile(window, qtbot, monkeypatch):
    session = load_demo(window, qtbot)
    source = session.data("calibration")
    batches = GatedBatches(source)
    monkeypatch.setattr(source, "batches", batches)
    with qtbot.waitSignal(window.controller.jobs.progress, timeout=30000):
        assert window.controller.calibrate(num_batches=40)
    # while the job runs: editing is off
    assert not window.save_action.isEnabled() and not window.calibrate_action.isEnabled()
    assert not (window.tree.model.flags(window.tree.model.index_of("fc", QUANT)) & Qt.ItemFlag.ItemIsUserCheckable)
    assert not window.layer_panel.editor.isEnabled() and not window.device_combo.isEnabled()
    assert window.job_status.bar.maximum() > 0 and "elapsed" in window.job_status.eta.text()
    # the views leave the session alone while the job owns it (reading it may rebuild its model)
    reads = []
    original = session.layers
    monkeypatch.setattr(session, "layers", lambda: reads.append(1) or original())
    refreshes = window.findChildren(DeferredRefresh)
    window.controller.layers_changed.emit()
    window.controller.select(["fc"])
    # every refresh asked for has come round (and put itself off): only then does "no reads" mean anything
    qtbot.waitUntil(lambda: not any(refresh.scheduled() for refresh in refreshes))
    assert window.controller.busy and any(refresh.waiting_for_job for refresh in refreshes)
    assert reads == []
    with qtbot.waitSignal(window.controller.jobs.cancelled, timeout=30000):
        qtbot.mouseClick(window.job_status.cancel_button, Qt.MouseButton.LeftButton)
        batches.gate.set()
    qtbot.waitUntil(lambda: not window.controller.busy)
    assert session.project.current_calibration is None
    assert "Calibrating cancelled" in window.log_panel.plain_text()
    assert window.save_action.isEnabled() and window.layer_panel.editor.isEnabled()
    assert window.tree.model.flags(window.tree.model.index_of("fc", QUANT)) & Qt.ItemFlag.ItemIsUserCheckable
    qtbot.waitUntil(lambda: bool(reads) and window.layer_panel.title.text().startswith("fc"))  # caught up after


def test_export_shows_the_report(window, qtbot, tmp_path, monkeypatch):
    session = load_demo(window, qtbot)
    calibrate(window, qtbot, method="max")
    session.project.settings["export"]["path"] = str(tmp_path / "digits.qdq.onnx")
    with qtbot.waitSignal(window.controller.export_finished, timeout=120000) as blocker:
        window.export_action.trigger()
    report = blocker.args[0]
    assert (tmp_path / "digits.qdq.onnx").is_file() and report.quantize_nodes > 0
    qtbot.waitUntil(lambda: window.export_report_dialog is not None and window.export_report_dialog.isVisible())
    text = window.export_report_dialog.plain_text()  # what the user reads
    assert "digits.qdq.onnx written and validated" in text
    assert f"{report.quantize_nodes} QuantizeLinear, {report.dequantize_nodes} DequantizeLinear" in text
    window.export_report_dialog.close()
    assert "digits.qdq.onnx" in window.log_panel.plain_text() or report.summary() in window.log_panel.plain_text()


def test_save_reopen_and_find_the_same_state(window, qtbot, tmp_path, monkeypatch):
    session = load_demo(window, qtbot)
    window.controller.set_quantize(["block.conv2"], False)
    window.controller.set_descriptor(["fc"], "input", {"num_bits": 6})
    calibrate(window, qtbot, method="entropy")
    window.controller.recompute_amax(["stem.0._input_quantizer"], "mse")
    settle(window, qtbot)
    path = tmp_path / "digits.qwb"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(path), "")))
    assert window.save()  # never saved: Save asks where (Save As)
    assert path.is_file() and not window.isWindowModified() and window.windowTitle().startswith("digits.qwb")
    assert window.recent_menu.paths() == [str(path.resolve())]
    tree_before = {name: (window.tree.model.check_state(name), window.tree.model.text(name, INPUT),
                          window.tree.model.text(name, AMAX)) for name in window.tree.model.names()}

    # a second window opens the file from its recent list
    other = MainWindow(settings=window.settings)
    qtbot.addWidget(other)
    other.show()
    recent = [action for action in other.recent_menu.actions() if action.data()]
    assert recent[0].data() == str(path.resolve())
    with qtbot.waitSignal(other.controller.session_changed, timeout=60000):
        recent[0].trigger()
    qtbot.waitUntil(lambda: other.tree.model.node_count() > 0 and not other.controller.busy)
    reopened = other.controller.session
    assert reopened is not session and not other.isWindowModified()
    tree_after = {name: (other.tree.model.check_state(name), other.tree.model.text(name, INPUT),
                         other.tree.model.text(name, AMAX)) for name in other.tree.model.names()}
    assert tree_after == tree_before
    assert other.tree.model.check_state("block") == Qt.CheckState.PartiallyChecked
    assert other.tree.model.text("fc", INPUT).startswith("int6")
    other.controller.select(["stem.0"])
    qtbot.waitUntil(lambda: other.layer_panel.histogram_item is not None and other.layer_panel.names == ["stem.0"])
    assert other.layer_panel.amax_lines["mse"].pen.widthF() > other.layer_panel.amax_lines["entropy"].pen.widthF()
    other.shutdown()


def test_bad_project_file_shows_an_error_dialog(window, qtbot, tmp_path):
    bad = tmp_path / "bad.qwb"
    bad.write_text("not a project")
    window.open_project(bad)
    qtbot.waitUntil(lambda: bool(window.error_dialogs), timeout=30000)
    dialog = window.error_dialogs[-1]
    assert dialog.isVisible() and dialog.title == "Opening project failed"
    assert "not a Quant Workbench project" in dialog.informativeText()
    assert "Traceback" in dialog.detailedText()  # on demand, behind "Show Details…"
    assert window.controller.session is None and "Opening project failed" in window.log_panel.plain_text()
    window.open_project(tmp_path / "missing.qwb")
    assert window.error_dialogs[-1].title == "Could not open the project"


def test_unsaved_changes_prompt(window, qtbot, tmp_path, answers, monkeypatch):
    load_demo(window, qtbot)
    assert window.controller.dirty
    answers["question"] = Buttons.Cancel
    assert window.new_project() is None and window.wizard is None
    assert not window.close() and window.isVisible()
    assert answers["asked"][-1] == ("question", "Unsaved changes")
    answers["question"] = Buttons.Save
    path = tmp_path / "saved.qwb"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(path), "")))
    assert window.close()
    assert path.is_file()


def test_untrusted_model_asks_then_retries_with_trust(window, qtbot, tmp_path, answers):
    from workbench.sources.data_source import DataSpec
    from workbench.sources.model_source import ModelSpec

    (tmp_path / "net.py").write_text("from torch import nn\ndef make():\n    return nn.Sequential(nn.Flatten(), "
                                     "nn.Linear(64, 10))\n")
    spec = ModelSpec("entrypoint", f"{tmp_path}/net.py:make")
    data = DataSpec("demo", "digits", split="train", num_batches=2)
    with qtbot.waitSignal(window.controller.trust_needed, timeout=30000):
        window.start_new_project(spec, data)
    assert answers["asked"][-1][0] == "warning" and window.controller.session is None  # answered No
    answers["warning"] = Buttons.Yes
    with qtbot.waitSignal(window.controller.session_changed, timeout=30000):
        window.start_new_project(spec, data)
    assert window.controller.session.trust_code and list(window.controller.session.project.layers) == ["1"]


def test_new_project_wizard_creates_and_saves(window, qtbot, tmp_path):
    wizard = window.new_project()
    assert wizard is not None and wizard.isVisible()
    assert wizard.model_page.kind.currentData() == "demo"
    wizard.calibration_page.form.num_batches.setValue(2)
    wizard.finish_page.name.setText("wizard-demo")
    wizard.finish_page.file.setText(str(tmp_path / "wizard.qwb"))
    wizard.finish_page.input_shape.setText("1, 8, 8")
    request = wizard.request()
    assert request["calibration"].num_batches == 2 and request["evaluation"].split == "test"
    assert request["input_shape"] == (1, 8, 8) and not request["trust_code"]
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        wizard.accept()
    qtbot.waitUntil(lambda: (tmp_path / "wizard.qwb").is_file())
    assert window.controller.session.project.name == "wizard-demo"
    assert window.windowTitle().startswith("wizard.qwb") and not window.isWindowModified()
    # a bad field is caught on its page, with a dialog
    wizard = window.new_project()
    wizard.finish_page.input_shape.setText("three")
    assert not wizard.finish_page.validatePage()


def test_settings_dialog_and_calibrate_dialog(window, qtbot):
    session = load_demo(window, qtbot)
    dialog = window.settings_dialog()
    dialog.rule_residual.setChecked(False)
    dialog.method.setCurrentText("percentile")
    assert set(dialog.changes()) == {"rules", "calibration"}
    dialog.accept()
    assert session.project.settings["rules"]["residual"] is False
    assert session.project.settings["calibration"]["method"] == "percentile"
    calibrate_dialog = window.calibrate_dialog()
    assert calibrate_dialog.method.currentText() == "percentile"

    # a direction only for a user function, and none guessed for it
    dialog = window.settings_dialog()
    assert not dialog.direction.isEnabled() and dialog.direction.currentData() is None
    dialog.metric_box.setCurrentText("metrics.py:score")
    assert dialog.direction.isEnabled() and dialog.direction.currentData() is None
    assert dialog.direction.currentText() == "choose which way is better"
    dialog.rule_concat.setChecked(False)
    dialog.accept()  # refused in the form: nothing else the user changed is lost
    assert dialog.isVisible() and "higher or a lower value" in dialog.problem.text()
    assert session.project.settings["rules"]["concat"] is True
    dialog.direction.setCurrentIndex(dialog.direction.findData("lower"))
    assert dialog.changes()["metric"] == {"name": "metrics.py:score", "direction": "lower"}
    dialog.metric_box.setCurrentText("top1")  # back to a built-in: its own direction
    assert dialog.changes()["metric"] == {"name": "top1", "direction": None}
    dialog.reject()
    session.update_setting("calibration", block_method="mse")  # a field the Calibrate dialog does not show
    calibrate_dialog.method.setCurrentText("mse")
    calibrate_dialog.num_batches.setValue(2)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        calibrate_dialog.accept()
    qtbot.waitUntil(lambda: not window.controller.busy)
    run = session.project.current_calibration
    assert run.method == "mse" and run.num_batches == 2
    assert session.project.settings["calibration"]["method"] == "mse"  # the toolbar repeats it
    assert session.project.settings["calibration"]["block_method"] == "mse"  # kept, not reset to its default


def test_device_selector_and_unexpected_errors(window, qtbot):
    session = load_demo(window, qtbot)
    combo = window.device_combo
    assert combo.itemData(0) == "cpu" and combo.currentData() == str(session.device)
    if combo.count() == 1:  # no CUDA here: asking for it is a readable error, the project stays on the CPU
        window.controller.set_setting("device", "cuda:0")
        assert window.error_dialogs[-1].title == "Settings" and "CUDA" in window.error_dialogs[-1].message
        assert str(session.device) == "cpu"
    undo = install_excepthook(window)
    try:
        sys.excepthook(ZeroDivisionError, ZeroDivisionError("boom"), None)
        qtbot.waitUntil(lambda: window.error_dialogs[-1].title == "Unexpected error")
        assert "ZeroDivisionError: boom" in window.error_dialogs[-1].message
    finally:
        undo()


def test_run_gui_opens_the_demo_ready_to_calibrate(qtbot, tmp_path, monkeypatch, answers):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    import workbench.app.main_window as main_window
    from workbench.app.main import run_gui

    # the user's real settings stay untouched
    monkeypatch.setattr(main_window, "QSettings", lambda *a: QSettings(str(tmp_path / "s.ini"),
                                                                        QSettings.Format.IniFormat))
    seen = {}

    def check():
        for widget in QApplication.topLevelWidgets():
            if isinstance(widget, MainWindow) and widget.isVisible() and widget.controller.session is not None \
                    and not widget.controller.busy and widget.tree.model.node_count():
                seen.update(title=widget.windowTitle(), calibrate=widget.calibrate_action.isEnabled(),
                            hook=sys.excepthook, app=QApplication.applicationName())
                widget.close()

    timer = QTimer()
    timer.timeout.connect(check)
    timer.start(50)
    QTimer.singleShot(60000, QApplication.quit)  # never hang the suite
    hook = sys.excepthook
    assert run_gui(demo=True) == 0
    timer.stop()
    assert "digits-demo" in seen["title"] and seen["calibrate"] and seen["app"] == "Quant Workbench"
    assert seen["hook"] is not hook and sys.excepthook is hook  # installed while running, removed after


def test_dialogs_that_change_several_things_apply_all_of_them_on_a_slow_model(window, qtbot, monkeypatch):
    # every edit rebuilds in the background, as on a model of thousands of modules; an edit made while that
    # rebuild runs is refused, so a dialog's changes must reach the session as one edit
    monkeypatch.setattr("workbench.app.controller_edits.SLOW_REBUILD_S", 0.0)
    session = load_demo(window, qtbot)
    dialog = window.settings_dialog()
    dialog.rule_residual.setChecked(False)
    dialog.add.setChecked(False)
    assert set(dialog.changes()) == {"rules", "functional"}
    dialog.accept()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)
    assert session.project.settings["rules"]["residual"] is False
    assert session.project.settings["functional"]["add"] is False
    assert window.error_dialogs == []

    with qtbot.waitSignal(window.controller.layers_changed, timeout=60000):
        assert window.controller.set_quantize(["block.conv1"], False) == ["block.conv1"]
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)
    patterns = window.tree.ignore_pattern_dialog()
    patterns.editor.setPlainText("^fc$")
    patterns.quantize_others.setChecked(True)
    with qtbot.waitSignal(patterns.accepted, timeout=1000):
        patterns.accept()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)
    assert window.error_dialogs == []
    assert [n for n, d in session.project.layers.items() if not d.quantize] == ["fc"]  # block.conv1 is back


def test_new_project_wizard_offers_models_by_name_without_trust(window, tmp_path):
    wizard = window.new_project()
    page = wizard.model_page
    page.kind.setCurrentIndex(page.kind.findData("hf"))
    assert page.stack.currentWidget().isAncestorOf(page.hf_folder) and not page.trust_note.isVisibleTo(page)
    page.hf_folder.setText(str(tmp_path / "bert"))
    spec = page.spec()
    assert (spec.kind, spec.target, spec.requires_trust) == ("hf", str(tmp_path / "bert"), False)
    page.kind.setCurrentIndex(page.kind.findData("timm"))
    assert page.stack.currentWidget().isAncestorOf(page.timm_name)
    page.timm_name.setText("resnet18")
    page.weights.setText("r18.safetensors")
    assert page.spec() == ModelSpec("timm", "resnet18", {}, "r18.safetensors")
    page.kind.setCurrentIndex(page.kind.findData("pickle"))
    assert page.trust_note.isVisibleTo(page)
    wizard.reject()
