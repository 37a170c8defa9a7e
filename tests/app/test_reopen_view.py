"""Issue 36 round 3, the GPT-2 run: after File > Quit and reopening, the project came back on the Layer tab with the
filter empty and another layer selected (shown in the layer panel, but no row selected in the tree). Reopened, a
project shows the tab, the filter and the selection it was left with; one never left here selects its first layer,
in the tree too."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QFileDialog  # noqa: E402
from window_waits import settle  # noqa: E402

from workbench.app.main_window import MainWindow  # noqa: E402


def _saved_demo(window, qtbot, path, monkeypatch):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    settle(window, qtbot)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(path), "")))
    assert window.save()


def _reopened(qtbot, settings, path):
    other = MainWindow(settings=settings)
    qtbot.addWidget(other)
    other.resize(1400, 900)
    other.show()
    with qtbot.waitSignal(other.controller.session_changed, timeout=60000):
        assert other.open_project(path, confirmed=True)
    qtbot.waitUntil(lambda: other.tree.model.node_count() > 0, timeout=60000)
    settle(other, qtbot)
    return other


def _shown_rows(window):
    proxy = window.tree.proxy
    names = []

    def walk(parent):
        for row in range(proxy.rowCount(parent)):
            index = proxy.index(row, 0, parent)
            names.append(window.tree.model.name_of(proxy.mapToSource(index).internalId()))
            walk(index)

    walk(proxy.index(-1, -1))
    return names


def _leave_on_sensitivity_filtered(window, qtbot, tmp_path, monkeypatch):
    """The demo saved, left on the Sensitivity tab with the filter "conv" and block.conv2 selected; its path."""
    path = tmp_path / "digits.qwb"
    _saved_demo(window, qtbot, path, monkeypatch)
    window.tabs.setCurrentWidget(window.extra_tabs["Sensitivity"])
    window.tree.filter_edit.setText("conv")
    window.tree.apply_filter()
    assert window.tree.select_row("block.conv2")
    settle(window, qtbot)
    return path


def test_quit_and_reopen_shows_the_tab_filter_and_selection_left(window, qtbot, tmp_path, monkeypatch):
    path = _leave_on_sensitivity_filtered(window, qtbot, tmp_path, monkeypatch)
    filtered = _shown_rows(window)
    assert "fc" not in filtered and "block.conv2" in filtered
    window.close()  # File > Quit

    other = _reopened(qtbot, window.settings, path)
    assert other.tabs.tabText(other.tabs.currentIndex()) == "Sensitivity"
    assert other.tree.filter_edit.text() == "conv"
    assert _shown_rows(other) == filtered
    assert other.controller.selection == ["block.conv2"]
    assert other.tree.selected_layers() == ["block.conv2"]  # the row itself, not only the layer panel
    assert other.layer_panel.names == ["block.conv2"]
    other.shutdown()


def test_a_project_never_left_here_opens_with_its_first_layer_selected_in_the_tree(window, qtbot, tmp_path,
                                                                                   monkeypatch):
    path = tmp_path / "digits.qwb"
    _saved_demo(window, qtbot, path, monkeypatch)
    first = next(iter(window.controller.session.project.layers))
    fresh = QSettings(str(tmp_path / "other.ini"), QSettings.Format.IniFormat)  # another user's settings
    other = _reopened(qtbot, fresh, path)
    assert other.tabs.currentIndex() == 0 and other.tree.filter_edit.text() == ""
    assert other.controller.selection == [first]
    assert other.tree.selected_layers() == [first]
    other.shutdown()


def test_a_project_opened_by_a_relative_path_comes_back_as_left(window, qtbot, tmp_path, monkeypatch):
    """The GPT-2 run: ``workbench gui proj.qwb`` (a path relative to the shell's folder) reopened the project on the
    Layer tab with no filter and the first layer: what was kept for it was looked up under the path as typed."""
    path = _leave_on_sensitivity_filtered(window, qtbot, tmp_path, monkeypatch)
    window.close()  # File > Quit

    monkeypatch.chdir(tmp_path)
    other = _reopened(qtbot, window.settings, "digits.qwb")
    assert other.controller.session.path == path  # absolute: the title and later saves do not depend on the folder
    assert other.tabs.tabText(other.tabs.currentIndex()) == "Sensitivity"
    assert other.tree.filter_edit.text() == "conv"
    assert other.tree.selected_layers() == ["block.conv2"]
    other.shutdown()
