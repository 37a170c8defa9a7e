"""Tree <-> graph selection: which nodes a layer stands for, which tree row a clicked node selects, and
the linked views in the window (netron offscreen in QtWebEngine: skipped where it cannot start)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("netron")

from PySide6.QtCore import QCoreApplication, QSettings  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from workbench.app import graph_tab as graph_module  # noqa: E402
from workbench.app.graph_selection import (  # noqa: E402
    CLICK_PREFIX,
    INSTALL_JS,
    clicked_names,
    nodes_of_layers,
    select_js,
    tree_row_of_node,
)
from workbench.app.graph_tab import GraphTab, netron_expired, prepare_application, webengine_status  # noqa: E402

if QCoreApplication.instance() is None:  # collection runs before pytest-qt makes the QApplication
    prepare_application()

NODES = ["conv1._input_quantizer/QuantizeLinear", "conv1._input_quantizer/DequantizeLinear",
         "conv1._weight_quantizer/DequantizeLinear", "conv1/Conv", "bert.encoder.layer.1.attention.self/Softmax",
         "bert.encoder.layer.1.attention.self.query/MatMul", "bert.encoder.layer.10.output/Add", "/Reshape",
         "node_add_3"]


def test_a_layer_stands_for_its_nodes_and_its_quantizers():
    assert nodes_of_layers(NODES, ["conv1"]) == NODES[:4]
    # a container takes every node inside; layer 1 is not layer 10
    assert nodes_of_layers(NODES, ["bert.encoder.layer.1"]) == NODES[4:6]
    assert nodes_of_layers(NODES, []) == [] and nodes_of_layers(NODES, ["missing"]) == []


def test_a_clicked_node_selects_its_module_or_the_nearest_row():
    rows = {"conv1", "bert.encoder.layer.1.attention.self.query", "bert.encoder.layer.1.attention"}
    assert tree_row_of_node("conv1._weight_quantizer/DequantizeLinear", rows.__contains__) == "conv1"
    assert tree_row_of_node("bert.encoder.layer.1.attention.self.query/MatMul", rows.__contains__) == \
        "bert.encoder.layer.1.attention.self.query"
    # the Softmax of a module the tree does not show: its parent's row
    assert tree_row_of_node("bert.encoder.layer.1.attention.self/Softmax", rows.__contains__) == \
        "bert.encoder.layer.1.attention"
    assert tree_row_of_node("/Reshape", rows.__contains__) is None
    assert tree_row_of_node("node_add_3", rows.__contains__) is None
    assert clicked_names(CLICK_PREFIX + json.dumps(["conv1/Conv"])) == ["conv1/Conv"]
    assert clicked_names("netron: some other message") is None and clicked_names(CLICK_PREFIX + "{") is None


def test_the_scripts_carry_the_names_and_the_click_prefix():
    script = select_js(['a"b/Conv', "c/Relu"])
    # the names travel as a JSON list (quotes escaped), into the installed helper
    assert json.dumps(['a"b/Conv', "c/Relu"]) in script and "window.__workbench__.select(" in script
    assert CLICK_PREFIX in INSTALL_JS and "__PREFIX__" not in INSTALL_JS
    assert select_js([]).count("[]") == 1


# the demo project's layers, drawn as a chain of Q/DQ and compute nodes named as the export names them
DEMO_LAYERS = ["stem.0", "block.conv1", "block.conv2", "expand.0", "fc"]


@pytest.fixture
def demo_like_onnx(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes, previous = [], "x"
    for layer in DEMO_LAYERS:
        for suffix in ("_input_quantizer/QuantizeLinear", "_input_quantizer/DequantizeLinear"):
            nodes.append(helper.make_node("Identity", [previous], [f"{layer}.{suffix}"], name=f"{layer}.{suffix}"))
            previous = f"{layer}.{suffix}"
        nodes.append(helper.make_node("Relu", [previous], [f"{layer}/out"], name=f"{layer}/Conv"))
        previous = f"{layer}/out"
    nodes.append(helper.make_node("Identity", [previous], ["y"], name="/Reshape"))
    graph = helper.make_graph(nodes, "demo_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "demo_like.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


CLICK_NODE_JS = r"""
(function (name) {
  var found = null;
  window.__view__.target._table.forEach(function (element, key) {
    if (element.value === key && key.name === name) { found = element.element.querySelector('.node-item'); }
  });
  if (!found) { return 0; }  // netron listens on the node's title (its first item), as a user clicks it
  found.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
  return 1;
})(%s)
"""


def test_tree_and_graph_select_each_other_and_the_graph_is_drawn_before_the_tab_opens(qtbot, tmp_path,
                                                                                      demo_like_onnx, monkeypatch):
    if not webengine_status()[0]:
        pytest.skip(webengine_status()[1])
    if netron_expired():
        pytest.skip("this netron refuses to draw graphs (it asks to be updated)")
    from demo_project import open_demo

    from workbench.app.main_window import MainWindow

    monkeypatch.setattr(graph_module, "PRELOAD", True)
    monkeypatch.setattr(graph_module, "PRELOAD_DELAY_MS", 0)
    # closing the window would ask about the unsaved demo project in a modal box (and wait for ever)
    discard = QMessageBox.StandardButton.Discard
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *args, **kwargs: discard))
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    controller = window.controller
    graph: GraphTab = window.extra_tabs["Graph"]
    try:
        open_demo(controller, qtbot)
        assert graph.view is None  # a window without a graph to show starts no Chromium
        window.resize(1400, 900)
        window.show()
        graph.show_file(demo_like_onnx)
        assert window.tabs.currentWidget() is not graph
        # drawn in the background while another tab is up: the first switch shows it without loading again
        qtbot.waitUntil(lambda: graph.page_state == "graph" and bool(graph.graph_nodes), timeout=40000)
        assert not graph.isVisible() and graph.view.parentWidget() is window
        loads = graph._load_id
        window.tabs.setCurrentWidget(graph)
        assert graph.stack.currentWidget() is graph.view and graph._load_id == loads
        assert graph.page_state == "graph"

        # tree -> graph: a row selects that layer's nodes, its Q/DQ included, in netron's page
        assert window.tree.select_row("block.conv1")
        assert controller.selection == ["block.conv1"]
        expected = ["block.conv1._input_quantizer/QuantizeLinear", "block.conv1._input_quantizer/DequantizeLinear",
                    "block.conv1/Conv"]
        assert graph.graph_selection == expected
        shown: list = []
        qtbot.waitUntil(lambda: graph.read_graph_selection(shown.append) or (bool(shown) and
                                                                            sorted(shown[-1]) == sorted(expected)),
                        timeout=10000)

        # graph -> tree: a click on another layer's node selects that layer's row
        with qtbot.waitSignal(graph.node_clicked, timeout=10000) as clicked:
            graph._page.runJavaScript(CLICK_NODE_JS % json.dumps("expand.0/Conv"))
        assert "expand.0/Conv" in clicked.args[0]
        assert window.tree.selected_layers() == ["expand.0"] and controller.selection == ["expand.0"]
        assert graph.graph_selection == clicked.args[0]  # the tree's echo leaves netron's selection alone
        # a node of no module (the top-level Reshape) leaves the tree as it was, and says so
        with qtbot.waitSignal(graph.node_clicked, timeout=10000):
            graph._page.runJavaScript(CLICK_NODE_JS % json.dumps("/Reshape"))
        assert controller.selection == ["expand.0"]
        assert "/Reshape" in window.statusBar().currentMessage()
    finally:
        window.shutdown()


def test_a_token_models_streamed_export_is_drawn_with_its_nodes_and_linked_to_the_tree(qtbot, tmp_path, monkeypatch):
    """A tiny Hugging Face BERT exported the way a model over STREAM_THRESHOLD is (weights streamed, folded into one
    file): netron draws every node of the file (it drew an empty canvas when the fold wrote several graph fields),
    and a tree row selects its nodes."""
    pytest.importorskip("transformers")
    onnx = pytest.importorskip("onnx")
    if not webengine_status()[0]:
        pytest.skip(webengine_status()[1])
    if netron_expired():
        pytest.skip("this netron refuses to draw graphs (it asks to be updated)")
    from bert_project import bert_specs

    from workbench.app.main_window import MainWindow
    from workbench.export import exporters, onnx_file

    folds = []
    monkeypatch.setattr(exporters, "STREAM_THRESHOLD", 1000)  # the tiny BERT's weights: ~100 KB
    monkeypatch.setattr(onnx_file, "fold_external_data",
                        lambda *args, fold=onnx_file.fold_external_data: folds.append(args) or fold(*args))
    discard = QMessageBox.StandardButton.Discard
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *args, **kwargs: discard))
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    controller = window.controller
    graph: GraphTab = window.extra_tabs["Graph"]
    query = "bert.encoder.layer.0.attention.self.query"
    try:
        window.resize(1400, 900)
        window.show()
        model, data = bert_specs(tmp_path)
        with qtbot.waitSignal(controller.session_changed, timeout=120000):
            assert controller.new_project(model, data, base_dir=tmp_path)
        qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
        with qtbot.waitSignal(controller.busy_changed, timeout=60000, check_params_cb=lambda busy: not busy):
            assert controller.calibrate(method="max")
        with qtbot.waitSignal(controller.export_finished, timeout=120000):
            assert controller.export(tmp_path / "bert.onnx")
        assert len(folds) == 1, "the export did not take the streamed path"
        assert not window.error_dialogs, window.error_dialogs[-1].message
        window.tabs.setCurrentWidget(graph)
        qtbot.waitUntil(lambda: graph.page_state != "loading" and (graph.page_state != "graph" or
                                                                   bool(graph.graph_nodes)), timeout=40000)
        assert graph.page_state == "graph", graph.page_info
        names = [node.name for node in onnx.load(str(tmp_path / "bert.onnx")).graph.node]
        assert sorted(graph.graph_nodes) == sorted(names)
        assert graph.page_info["nodes"] > 0
        assert window.tree.select_row(query)
        assert f"{query}/MatMul" in graph.graph_selection
        assert f"{query}._input_quantizer/QuantizeLinear" in graph.graph_selection
    finally:
        window.shutdown()
