"""The model tree's Qt model on its own: Qt's model tester, big trees, filtering, functional layers."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtTest import QAbstractItemModelTester  # noqa: E402
from torch import nn  # noqa: E402

from workbench.app.tree_model import INPUT, QUANT, RANK, LayerFilterProxy, ModuleTreeModel  # noqa: E402
from workbench.graph import describe_model  # noqa: E402
from workbench.quant import replace_to_quantization_module  # noqa: E402
from workbench.session import LayerView  # noqa: E402

Fatal = QAbstractItemModelTester.FailureReportingMode.Fatal


def big_model(stages: int, blocks: int) -> nn.Module:
    return nn.Sequential(*(nn.Sequential(*(nn.Sequential(nn.Conv2d(2, 2, 1), nn.ReLU(), nn.Linear(2, 2))
                                           for _ in range(blocks))) for _ in range(stages)))


def views_of(tree, quantize=lambda name: True, rank=lambda name: None):
    return [LayerView(m.name, m.type_name.removeprefix("Quant"), quantize(m.name), "module",
                      "int8 per-tensor max" if quantize(m.name) else "float", "-", "-", rank(m.name), m.total_params)
            for m in tree.modules if m.quantizable]


def test_model_tester_on_a_large_tree(qtbot):
    model = big_model(20, 25)  # 1,521 modules
    replace_to_quantization_module(model)
    tree = describe_model(model)
    layers = views_of(tree, quantize=lambda name: not name.startswith("3."), rank=lambda n: 1 if n == "5.2.0" else None)
    qt_model = ModuleTreeModel()
    QAbstractItemModelTester(qt_model, Fatal)
    qt_model.set_views(tree, layers)
    assert qt_model.node_count() == len(tree) and qt_model.rowCount() == 1
    assert qt_model.text("", QUANT) == f"{len(layers) - 50}/{len(layers)}"
    assert qt_model.check_state("3") == Qt.CheckState.Unchecked and qt_model.check_state("4") == Qt.CheckState.Checked
    assert qt_model.check_state("3.0.1") is None  # a ReLU: nothing to tick
    assert qt_model.text("5", RANK) == "1" and qt_model.text("", RANK) == "1"  # containers show their best rank
    assert qt_model.subtree_layers(qt_model.node_of("2.4")) == ["2.4.0", "2.4.2"]
    # an update that changes one layer emits one dataChanged for that row
    changed = []
    qt_model.dataChanged.connect(lambda first, last, roles: changed.append((first.row(), last.row())))
    qt_model.set_views(tree, views_of(tree, quantize=lambda name: not name.startswith("3.") and name != "0.0.0",
                                      rank=lambda n: 1 if n == "5.2.0" else None))
    assert qt_model.check_state("0.0") == Qt.CheckState.PartiallyChecked
    assert qt_model.text("0.0.0", INPUT) == "float" and qt_model.text("4.0.0", INPUT).startswith("int8")
    assert changed == [(0, 0)] * 4  # the layer, its block, its stage and the model: one row each
    proxy = LayerFilterProxy()
    proxy.setSourceModel(qt_model)
    QAbstractItemModelTester(proxy, Fatal)
    proxy.set_filter(r"^7\.3\.", regex=True)
    assert proxy.matches == 3 and proxy.rowCount() == 1
    stage = proxy.index(0, 0, proxy.index(0, 0))
    assert stage.data(Qt.ItemDataRole.DisplayRole) == "7" and proxy.rowCount(stage) == 1
    proxy.set_filter("", type_name="Linear")
    assert proxy.matches == 500


def test_a_functional_layer_left_in_float_keeps_its_row(qtbot):
    from workbench.demo_run import create_demo_session

    session = create_demo_session(calib_batches=1)
    qt_model = ModuleTreeModel()
    QAbstractItemModelTester(qt_model, Fatal)
    qt_model.set_views(session.tree(), session.layers())
    names = qt_model.names()
    session.set_quantize(["block.add"], False)
    assert "block.add" not in session.tree()  # the quantized model has no add module any more
    qt_model.set_views(session.tree(), session.layers())
    assert qt_model.names() == names  # same rows: no reset, the row can be ticked again
    assert qt_model.check_state("block.add") == Qt.CheckState.Unchecked
    assert qt_model.check_state("block") == Qt.CheckState.PartiallyChecked
