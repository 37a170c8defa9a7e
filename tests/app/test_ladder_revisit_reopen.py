"""Issue 36 round 3, the GPT-2 run: the ladder's "Search layers set by hand too" came back unticked after a save,
File > Quit and reopening, while the ladder box and the goal showed the search that was run with it ticked. The
choice is kept with the search in the project, and the reopened panel shows it again."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import Qt  # noqa: E402
from window_waits import run_ladder, settle  # noqa: E402

from workbench.app.main_window import MainWindow  # noqa: E402


def _opened(window, qtbot, path):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_project(path, trust_code=True, confirmed=True)
    settle(window, qtbot)
    return window.extra_tabs["Sensitivity"].fallback_panel


@pytest.mark.parametrize("ticked", [True, False])
def test_search_hand_set_layers_too_comes_back_after_save_quit_and_reopen(window, qtbot, calibrated_block_project,
                                                                         ticked):
    panel = _opened(window, qtbot, calibrated_block_project)
    window.tabs.setCurrentWidget(window.extra_tabs["Sensitivity"])
    assert not panel.revisit_box.isChecked()  # the default
    if ticked:
        qtbot.mouseClick(panel.revisit_box, Qt.MouseButton.LeftButton)
    assert panel.revisit_box.isChecked() is ticked
    run_ladder(panel, window.controller, qtbot)
    settle(window, qtbot)
    assert panel.revisit_box.isChecked() is ticked  # the finished search shows what it was run with
    assert window.save()
    window.close()  # File > Quit

    other = MainWindow(settings=window.settings)
    qtbot.addWidget(other)
    other.resize(1400, 900)
    other.show()
    try:
        reopened = _opened(other, qtbot, calibrated_block_project)
        assert reopened.ladder_result is not None and reopened.ladder_result.revisit_pins is ticked
        assert reopened.ladder_box.currentText() == "int8,fp8,float"
        assert reopened.revisit_box.isChecked() is ticked
    finally:
        other.shutdown()
