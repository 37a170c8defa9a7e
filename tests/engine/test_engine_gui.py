"""The GUI twin: Import TensorRT Report…, the tree's Engine column and the hazards list (pytest-qt, offscreen)."""

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from workbench.app.engine_panel import PRECISION_COLOURS  # noqa: E402
from workbench.app.tree_model import ENGINE, ENGINE_SHARE_ROLE  # noqa: E402


@pytest.fixture(autouse=True)
def _no_webengine(monkeypatch):
    monkeypatch.setenv("WORKBENCH_NO_WEBENGINE", "1")


@pytest.fixture(autouse=True)
def _discard_on_close(monkeypatch):
    # closing a window with an unsaved report asks whether to discard it: answer, never block the run
    monkeypatch.setattr(QMessageBox, "question",
                        staticmethod(lambda *args, **kwargs: QMessageBox.StandardButton.Discard))
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(lambda *args, **kwargs: QMessageBox.StandardButton.No))


def engine_cell(window, name):
    model = window.tree.model
    index = model.index_of(name, ENGINE)
    return model.data(index), model.data(index, Qt.ItemDataRole.BackgroundRole), model.data(index, ENGINE_SHARE_ROLE)


def test_import_shows_precisions_in_the_tree_and_hazards_select_layers(window, qtbot, trtexec_files):
    layer_info, profile, _ = trtexec_files
    panel = window.extra_tabs["TensorRT"]
    assert panel.hazards.count() == 0 and engine_cell(window, "stem.0")[0] == ""
    with qtbot.waitSignal(window.controller.engine_changed):
        assert window.import_engine_report(str(layer_info), str(profile))
    qtbot.waitUntil(lambda: engine_cell(window, "stem.0")[0] != "", timeout=10000)
    text, colour, share = engine_cell(window, "stem.0")
    assert text == "INT8 0.011 ms" and colour == PRECISION_COLOURS["INT8"] and 0 < share <= 1
    text, colour, _ = engine_cell(window, "block.conv2")
    assert text.startswith("FP32") and colour == PRECISION_COLOURS["FP32"]
    assert engine_cell(window, "stem.2")[0].startswith("INT8")  # the ReLU fused into stem.0's layer
    assert window.tabs.currentWidget() is panel and panel.hazards.count() == 5
    assert "5 hazards" in panel.summary.text()
    item = next(panel.hazards.item(i) for i in range(panel.hazards.count())
                if "block.conv2" in panel.hazards.item(i).text())
    rect = panel.hazards.visualItemRect(item)
    qtbot.mouseClick(panel.hazards.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert window.controller.selection == ["block.conv2"]
    assert window.controller.dirty  # the report is part of the project now


def test_a_wrong_file_is_an_error_dialog_not_a_crash(window, qtbot, trtexec_files, monkeypatch):
    layer_info, profile, _ = trtexec_files
    shown = []
    monkeypatch.setattr(window, "show_error", lambda title, message, details="": shown.append((title, message)))
    window.controller.error.disconnect()
    window.controller.error.connect(window.show_error)
    assert not window.import_engine_report(str(profile))
    assert shown and "is a trtexec profile" in shown[0][1]
    assert window.controller.engine_report() is None


def test_another_models_engine_asks_how_to_map_it(window, qtbot, monkeypatch):
    """The GUI twin of engine-report's refusal, --force and --onnx: the real ResNet-18 qat engine is not the digits
    model's; Cancel stores nothing, "Report anyway" imports it with the mapping counts and time shares shown."""
    from resnet18_names import QAT

    if not QAT[0].is_file():
        pytest.skip("the real trtexec reports are not on this machine")
    asked = []
    answers = iter(["cancel", "force"])
    monkeypatch.setattr(window, "ask_how_to_map_engine", lambda message: asked.append(message) or next(answers))
    assert not window.import_engine_report(str(QAT[0]), str(QAT[1]))
    assert "does not look like an engine of this model" in asked[0] and "--force" in asked[0]
    assert window.controller.engine_report() is None and not window.controller.dirty
    with qtbot.waitSignal(window.controller.engine_changed):
        assert window.import_engine_report(str(QAT[0]), str(QAT[1]))
    panel = window.extra_tabs["TensorRT"]
    summary = panel.summary.text()
    assert "of 37 engine layers mapped to modules" in summary and "scope-less ONNX node names" in summary
    # each cause of re-quantizing with its share of the run; the tooltip says why each unmapped layer is
    assert "12.4% of the run re-quantizes after float residual adds" in summary
    assert "Conv_9" in panel.summary.toolTip() and "scope-less" in panel.summary.toolTip()
    assert window.controller.engine_report().quantized_found < window.controller.engine_report().quantized_total


def test_the_engine_cell_says_what_of_an_int8_layer_is_float():
    from workbench.app.engine_panel import engine_cell as cell
    from workbench.engine import ModuleOutcome

    mixed = ModuleOutcome("layer1.0.conv2", True, "INT8", "conv + add", 0.0369, 3.4, "input 1 FP16, output FP16")
    assert cell(mixed) == ("INT8 0.037 ms [input 1 FP16, output FP16]", PRECISION_COLOURS["INT8"])
    assert cell(ModuleOutcome("fc", True, None, None, None))[0] == "not in engine"
