"""The model tree stays readable through a user's jobs: the Name column is pinned when the other columns scroll
sideways, the dock does not narrow after a job, and a narrow layout does not carry into the next project
(pytest-qt, offscreen, on a tiny BERT)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("transformers")

from bert_project import bert_specs  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from window_waits import settle  # noqa: E402

from workbench.app.tree_model import NAME, PRECISION, QUANT  # noqa: E402

# the FFN's output GEMM: 64 input features, a size TensorRT builds INT4 blocks for (the intermediate dense
# has 32, under the smallest block)
INT4_LAYER = "bert.encoder.layer.0.output.dense"
QUERY = "bert.encoder.layer.1.attention.self.query"


def open_bert(window, qtbot, tmp_path):
    model, data = bert_specs(tmp_path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    return window.controller.session


def test_the_name_column_stays_when_the_others_scroll_sideways(window, qtbot, tmp_path):
    open_bert(window, qtbot, tmp_path)
    window.resizeDocks([window.tree_dock], [320], Qt.Orientation.Horizontal)
    settle(window, qtbot)
    view = window.tree.view
    bar = view.horizontalScrollBar()
    assert bar.maximum() > 0  # the columns do not fit: the user scrolls right to see Precision and amax
    qtbot.wait(50)  # the view lays its columns out
    bar.setValue(bar.maximum())
    scrolled = bar.value()
    assert scrolled > view.columnWidth(NAME)  # without the pin, the Name column would be out of sight
    pinned = view.pinned
    assert pinned.isVisible() and pinned.x() == view.frameWidth() and pinned.width() == view.columnWidth(NAME)
    index = view.model().mapFromSource(window.tree.model.index_of(QUERY, NAME))
    view.scrollTo(index)
    assert bar.value() == scrolled  # revealing a row does not scroll the other columns away
    rect = pinned.visualRect(index)
    assert rect.isValid() and rect.left() >= 0 and rect.right() <= pinned.viewport().width() + 1
    # the pinned name is the row: a click there selects the layer, as a click on the name did before
    qtbot.mouseClick(pinned.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: window.controller.selection == [QUERY])
    assert view.selectionModel().isRowSelected(index.row(), index.parent())
    # rows folded in the pinned column fold in the tree (one set of expanded rows)
    parent = index.parent()
    pinned.collapse(parent)
    assert not view.isExpanded(parent)
    view.expand(parent)
    assert pinned.isExpanded(parent)
    # dragging the pinned header's edge is the Name column's width
    pinned.header().resizeSection(NAME, 222)
    assert view.columnWidth(NAME) == 222 and pinned.width() == 222


def test_the_tree_does_not_narrow_after_jobs(window, qtbot, tmp_path):
    session = open_bert(window, qtbot, tmp_path)
    window.tree.select_row("bert.encoder.layer.0.attention.self.query")
    settle(window, qtbot)
    width = window.tree_dock.width()
    needs = window.centralWidget().minimumSizeHint().width()  # what the window must leave the layer panel
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="entropy")
    settle(window, qtbot)
    assert window.controller.set_precision([INT4_LAYER], "int4w")
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="auto")  # the histogram's title and legend grow
    settle(window, qtbot)
    assert session.project.current_calibration.method == "auto"
    qtbot.wait(300)  # the window lays its docks out again (a posted layout request)
    # a longer histogram title or quantizer name must not make the layer panel claim the tree's width
    assert window.centralWidget().minimumSizeHint().width() <= needs
    assert window.tree_dock.width() >= width


def test_a_narrow_layout_does_not_carry_into_the_next_project(window, qtbot, tmp_path):
    open_bert(window, qtbot, tmp_path)
    view = window.tree.view
    fitted = {column: view.columnWidth(column) for column in (QUANT, PRECISION)}
    path = tmp_path / "bert.qwb"
    assert window.controller.save(str(path)) is not None
    for column in fitted:  # the user squeezed them (or the dock did)
        view.setColumnWidth(column, 12)
    window.resizeDocks([window.tree_dock], [200], Qt.Orientation.Horizontal)
    window.tree.remember_layout()
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.open_project(path, confirmed=True)
    settle(window, qtbot)
    for column, width in fitted.items():
        assert view.columnWidth(column) >= width  # never below what the column's content needs
    assert window.tree_dock.width() > 200
