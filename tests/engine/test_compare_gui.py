"""File ▸ Compare with Project…: the differences of workbench.project.diff, in tables (pytest-qt, offscreen)."""
import shutil
import sqlite3

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from workbench.app.compare_view import CompareDialog  # noqa: E402
from workbench.project import load_project, save_project  # noqa: E402

AMAX_QUANTIZER = "block.conv1._input_quantizer"


@pytest.fixture(autouse=True)
def _no_webengine(monkeypatch):
    monkeypatch.setenv("WORKBENCH_NO_WEBENGINE", "1")
    monkeypatch.setattr(QMessageBox, "question",
                        staticmethod(lambda *args, **kwargs: QMessageBox.StandardButton.Discard))


@pytest.fixture
def earlier(demo_export, tmp_path):
    """The demo project with one descriptor, one amax and one setting changed: the 'earlier attempt'."""
    _, path, _, _ = demo_export
    project = load_project(path)
    project.layers["fc"].input_desc = {"unsigned": True}
    record = project.current_calibration.quantizers[AMAX_QUANTIZER]
    record.amax = np.asarray(record.amax) * 2.0  # so this project's amax is half of it: -50%
    project.settings["fold_bn"] = not project.settings["fold_bn"]
    target = tmp_path / "earlier.qwb"
    save_project(project, target)
    return target


def compare(window, qtbot, path):
    with qtbot.waitSignal(window.controller.busy_changed, timeout=60000, check_params_cb=lambda busy: not busy):
        assert window.compare_with_project(str(path))


def test_compare_shows_exactly_the_descriptor_the_amax_and_the_setting(window, qtbot, earlier):
    fold_bn = window.controller.session.project.settings["fold_bn"]
    compare(window, qtbot, earlier)
    dialog = window.dialog
    assert isinstance(dialog, CompareDialog) and dialog.isVisible() and not window.error_dialogs
    assert dialog.windowTitle() == "Compare earlier.qwb with digits.qwb"
    assert dialog.visible_rows(dialog.settings_table) == [["fold_bn", str(not fold_bn), str(fold_bn)]]
    layers = dialog.visible_rows(dialog.layers_table)
    assert [row[0] for row in layers] == ["block.conv1", "fc"]  # model order, only the changed ones
    assert layers[0][4] == "-50.0%" and layers[1][3] == "input.unsigned: True -> <absent>"
    amax = dialog.visible_rows(dialog.amax_table)
    assert len(amax) == 1 and amax[0][0] == AMAX_QUANTIZER and amax[0][3] == "-50.0%"
    assert float(amax[0][1]) == pytest.approx(2 * float(amax[0][2]))
    assert dialog.visible_rows(dialog.sensitivity_table) == [] and dialog.visible_rows(dialog.reports_table) == []
    assert "1 settings, 2 layers, 1 amax values differ" in dialog.summary.text()
    # every layer, changed or not, when asked; the name filter narrows any table
    dialog.only_changed.setChecked(False)
    assert len(dialog.visible_rows(dialog.layers_table)) == len(window.controller.session.project.layers)
    dialog.filter_edit.setText("conv")
    assert [row[0] for row in dialog.visible_rows(dialog.layers_table)] == ["block.conv1", "block.conv2"]
    assert dialog.visible_rows(dialog.settings_table) == []
    # clicking a row that names a layer selects it in the tree
    dialog.amax_table.selectRow(0)
    assert window.controller.selection == ["block.conv1"]
    qtbot.waitUntil(lambda: window.tree.selected_layers() == ["block.conv1"])


def test_amax_changes_sort_by_their_relative_size(window, qtbot, demo_export, tmp_path):
    _, path, _, _ = demo_export
    project = load_project(path)
    factors = {"stem.0._input_quantizer": 1.1, "block.conv1._input_quantizer": 4.0, "fc._input_quantizer": 0.5}
    for name, factor in factors.items():
        record = project.current_calibration.quantizers[name]
        record.amax = np.asarray(record.amax) / factor  # this project's = earlier * factor
    save_project(project, tmp_path / "earlier.qwb")
    compare(window, qtbot, tmp_path / "earlier.qwb")
    table = window.dialog.amax_table
    rows = window.dialog.visible_rows(table)
    assert [(r[0], r[3]) for r in rows] == [("block.conv1._input_quantizer", "+300.0%"),
                                            ("fc._input_quantizer", "-50.0%"), ("stem.0._input_quantizer", "+10.0%")]
    table.sortItems(3, Qt.SortOrder.AscendingOrder)  # by size, not by the text
    assert [r[0] for r in window.dialog.visible_rows(table)][0] == "stem.0._input_quantizer"


@pytest.mark.parametrize("damage, message", [
    ("text", "not a Quant Workbench project"),
    ("newer", "saved by a newer Quant Workbench"),
    ("missing", "no such project file"),
])
def test_a_bad_file_is_an_error_dialog(window, qtbot, demo_export, tmp_path, damage, message):
    bad = tmp_path / "bad.qwb"
    if damage == "text":
        bad.write_text("these are not the droids\n" * 10)
    elif damage == "newer":
        shutil.copy(demo_export[1], bad)
        connection = sqlite3.connect(bad)
        connection.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        connection.commit()
        connection.close()
    compare(window, qtbot, bad)
    assert window.error_dialogs, "no error dialog"
    dialog = window.error_dialogs[-1]
    assert dialog.title == "Comparing projects failed" and message in dialog.message and "bad.qwb" in dialog.message
    assert not isinstance(window.dialog, CompareDialog)
    assert window.controller.session is not None and not window.controller.busy  # the window carries on
