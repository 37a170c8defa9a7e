"""The Graph tab's first view after a background load (an export, a reopen) shows the selected layer's nodes,
not a part of the graph scrolled for a 1x1 parked view (pytest-qt, offscreen, embedded netron)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402
from test_graph_selection import DEMO_LAYERS  # noqa: E402

import workbench.app.graph_tab as graph_module  # noqa: E402
from workbench.app.graph_tab import netron_expired  # noqa: E402
from workbench.app.webengine import webengine_status  # noqa: E402

# how many of netron's selected nodes lie inside the page's viewport: [selected, inside]
INSIDE_JS = r"""
(function () {
  var target = window.__view__ && window.__view__.target;
  if (!target || !target.selection) { return '[-1, -1]'; }
  var count = 0, inside = 0;
  target.selection.forEach(function (element) {
    if (!element || !element.element || !element.element.getBoundingClientRect) { return; }
    count += 1;
    var r = element.element.getBoundingClientRect();
    if (r.right > 0 && r.bottom > 0 && r.left < window.innerWidth && r.top < window.innerHeight) { inside += 1; }
  });
  return JSON.stringify([count, inside]);
})()
"""


@pytest.fixture
def long_onnx(tmp_path):
    """The demo's layers at the end of a long chain of other nodes: the last layer is far from the graph's start."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes, previous = [], "x"
    for index in range(60):
        nodes.append(helper.make_node("Relu", [previous], [f"pad{index}/out"], name=f"pad{index}/Relu"))
        previous = f"pad{index}/out"
    for layer in DEMO_LAYERS:
        for suffix in ("_input_quantizer/QuantizeLinear", "_input_quantizer/DequantizeLinear"):
            nodes.append(helper.make_node("Identity", [previous], [f"{layer}.{suffix}"], name=f"{layer}.{suffix}"))
            previous = f"{layer}.{suffix}"
        nodes.append(helper.make_node("Relu", [previous], [f"{layer}/out"], name=f"{layer}/Conv"))
        previous = f"{layer}/out"
    graph = helper.make_graph(nodes, "long", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "long.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_first_view_of_a_graph_drawn_in_the_background_shows_the_selection(qtbot, tmp_path, long_onnx,
                                                                               monkeypatch):
    if not webengine_status()[0]:
        pytest.skip(webengine_status()[1])
    if netron_expired():
        pytest.skip("this netron refuses to draw graphs (it asks to be updated)")
    from demo_project import open_demo

    from workbench.app.main_window import MainWindow

    monkeypatch.setattr(graph_module, "PRELOAD", True)
    monkeypatch.setattr(graph_module, "PRELOAD_DELAY_MS", 0)
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.StandardButton.Discard))
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    controller = window.controller
    graph = window.extra_tabs["Graph"]
    try:
        open_demo(controller, qtbot)
        window.resize(1400, 900)
        window.show()
        qtbot.waitUntil(lambda: window.tree.has_row(DEMO_LAYERS[-1]))
        assert window.tree.select_row(DEMO_LAYERS[-1])  # the last layer: far down the chain
        graph.show_file(long_onnx)  # as an export does, with the Layer tab up
        qtbot.waitUntil(lambda: graph.page_state == "graph" and bool(graph.graph_nodes), timeout=40000)
        assert graph.graph_selection  # selected (and scrolled to) while parked at 1x1
        window.tabs.setCurrentWidget(graph)
        seen: list = []

        def all_inside() -> bool:
            graph._page.runJavaScript(INSIDE_JS, 0, seen.append)
            qtbot.wait(100)
            return bool(seen) and json.loads(seen[-1])[0] > 0 and json.loads(seen[-1])[0] == json.loads(seen[-1])[1]

        qtbot.waitUntil(all_inside, timeout=10000)
    finally:
        window.shutdown()
