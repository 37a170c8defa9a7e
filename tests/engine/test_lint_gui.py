"""The fusion lint in the GUI: warning icons on the tree's rows, the TensorRT tab's list, fixes as actions."""
import shutil

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from engine_window import open_window  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from workbench.app.lint_state import NOT_CALIBRATED  # noqa: E402
from workbench.app.tree_model import NAME  # noqa: E402
from workbench.session import Session  # noqa: E402
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402

Buttons = QMessageBox.StandardButton


@pytest.fixture(autouse=True)
def _no_webengine(monkeypatch):
    monkeypatch.setenv("WORKBENCH_NO_WEBENGINE", "1")


@pytest.fixture
def replies(monkeypatch):
    """What the patched message boxes answer; closing a window with unsaved changes discards them."""
    answers = {"question": Buttons.Discard, "asked": []}

    def question(parent, title, text, *args, **kwargs):
        answers["asked"].append(title)
        return answers["question"]

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(lambda *args, **kwargs: Buttons.No))
    return answers


def plant_hazard(session):
    """The residual add left in float: TensorRT cannot fuse it into block.conv2 (fix: quantize block.add)."""
    session.set_quantize(["block.add"], False)


@pytest.fixture
def window(qtbot, tmp_path, demo_export, replies):
    _, path, _, _ = demo_export
    project = tmp_path / "digits.qwb"
    shutil.copy(path, project)
    session = Session.open(project)
    plant_hazard(session)
    session.save()
    window = open_window(qtbot, tmp_path, project)
    yield window
    window.shutdown()


def lint(window, qtbot):
    state = window.controller.lint_state
    with qtbot.waitSignal(state.changed, timeout=60000, check_params_cb=lambda *a: state.warnings is not None
                          and not state.stale):
        assert window.lint()
    qtbot.waitUntil(lambda: not window.controller.busy and not window.tree._refresh.scheduled())
    return state


def name_cell(window, name, role):
    model = window.tree.model
    return model.data(model.index_of(name, NAME), role)


FIX = "quantize the identity branch (block.add)"
FLAGGED = ["block", "block.conv2"]  # the add is named after the block whose forward calls it


def test_lint_puts_a_warning_icon_on_the_layer_and_lists_it(window, qtbot):
    assert name_cell(window, "block.conv2", Qt.ItemDataRole.DecorationRole) is None
    state = lint(window, qtbot)
    assert [(w.kind, w.modules) for w in state.warnings] == [("residual_not_fusable", FLAGGED)]
    for name in FLAGGED:
        icon = name_cell(window, name, Qt.ItemDataRole.DecorationRole)
        assert icon is not None and not icon.isNull()
        tip = name_cell(window, name, Qt.ItemDataRole.ToolTipRole)
        assert tip.startswith(name) and state.warnings[0].message in tip and f"fix: {FIX}" in tip
    for other in ("block.conv1", "stem.0", "fc", ""):  # only the modules the warning names
        assert name_cell(window, other, Qt.ItemDataRole.DecorationRole) is None
        assert "TensorRT lint" not in name_cell(window, other, Qt.ItemDataRole.ToolTipRole)
    panel = window.extra_tabs["TensorRT"]
    assert window.tabs.currentWidget() is panel
    assert panel.lint.warnings.count() == 1 and f"Fix: {FIX}" in panel.lint.warnings.item(0).text()
    assert "1 fusion warning:" in panel.lint.summary.text()
    item = panel.lint.warnings.item(0)
    qtbot.mouseClick(panel.lint.warnings.viewport(), Qt.MouseButton.LeftButton,
                     pos=panel.lint.warnings.visualItemRect(item).center())
    assert window.controller.selection == ["block.conv2"]  # the layers it names (block is a container)
    assert panel.lint.fix_button.isEnabled()
    # linting exports a preview: the layers are unchanged; the lint itself is kept, to be saved with the project
    assert window.controller.dirty and window.controller.session.project.lints


def test_the_tree_context_menu_applies_the_fix_and_lint_runs_again(window, qtbot):
    state = lint(window, qtbot)
    window.controller.select(["block.conv1"])
    assert window.tree.context_menu() and window.tree.fix_actions == []  # no warning on that row: no fix offered
    window.controller.select(["block.conv2"])
    window.tree.context_menu()
    assert [a.text() for a in window.tree.fix_actions] == [f"Fix: {FIX}"]
    with qtbot.waitSignal(state.changed, timeout=60000, check_params_cb=lambda *a: not state.stale
                          and state.warnings == []):
        window.tree.fix_actions[0].trigger()
    qtbot.waitUntil(lambda: not window.controller.busy and not window.tree._refresh.scheduled())
    session = window.controller.session
    assert session.project.layers["block.add"].quantize is True and window.controller.dirty
    for name in FLAGGED:
        assert name_cell(window, name, Qt.ItemDataRole.DecorationRole) is None
        assert window.tree.model.lint_text(name) == ""
    panel = window.extra_tabs["TensorRT"].lint
    assert panel.warnings.count() == 0 and "No fusion warnings" in panel.summary.text()


def test_an_edit_marks_the_warnings_stale_and_the_panel_button_fixes(window, qtbot):
    state = lint(window, qtbot)
    window.controller.set_quantize(["fc"], False)
    qtbot.waitUntil(lambda: not window.controller.busy and not window.tree._refresh.scheduled())
    assert state.stale
    assert name_cell(window, "block.conv2", Qt.ItemDataRole.ToolTipRole).count("lint again") == 1  # shown, greyed
    panel = window.extra_tabs["TensorRT"].lint
    assert panel.summary.text().startswith("The project changed since this lint")
    panel.warnings.setCurrentRow(0)
    with qtbot.waitSignal(state.changed, timeout=60000, check_params_cb=lambda *a: not state.stale):
        qtbot.mouseClick(panel.fix_button, Qt.MouseButton.LeftButton)
    assert window.controller.session.project.layers["block.add"].quantize is True
    assert state.warnings is not None and all("block.conv2" not in w.modules for w in state.warnings)


def test_lint_before_calibration_says_so_and_offers_to_calibrate(qtbot, tmp_path, replies):
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2))
    plant_hazard(session)
    project = session.save(tmp_path / "raw.qwb")
    window = open_window(qtbot, tmp_path, project)
    try:
        state, panel = window.controller.lint_state, window.extra_tabs["TensorRT"].lint
        replies["question"] = Buttons.No
        assert not window.lint()
        assert replies["asked"] == ["Lint for TensorRT"]
        assert state.problem == NOT_CALIBRATED and panel.summary.text() == NOT_CALIBRATED
        assert panel.calibrate_button.isVisibleTo(panel) and state.warnings is None
        assert not window.error_dialogs  # said in the tab, not as a failure
        replies["question"] = Buttons.Yes  # calibrate now, lint after
        with qtbot.waitSignal(state.changed, timeout=60000, check_params_cb=lambda *a: state.warnings is not None):
            assert window.lint()
        assert window.controller.session.project.current_calibration is not None
        assert [w.modules for w in state.warnings] == [FLAGGED] and state.problem == ""
        assert not panel.calibrate_button.isVisibleTo(panel)
    finally:
        window.shutdown()


def test_quantizers_calibrated_with_other_settings_stop_lint_and_calibrating_again_helps(qtbot, tmp_path, replies):
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2))
    session.calibrate(method="max")
    session.set_setting("fold_bn", not session.project.settings["fold_bn"])  # the weight amax no longer fit
    plant_hazard(session)
    project = session.save(tmp_path / "stale.qwb")
    window = open_window(qtbot, tmp_path, project)
    try:
        state, panel = window.controller.lint_state, window.extra_tabs["TensorRT"].lint
        with qtbot.waitSignal(state.changed, timeout=60000, check_params_cb=lambda *a: bool(state.problem)):
            assert window.lint()
        assert state.problem.startswith("Lint could not run: 4 quantizers are not calibrated")
        assert panel.summary.text() == state.problem and panel.calibrate_button.isVisibleTo(panel)
        assert window.error_dialogs and window.error_dialogs[-1].title == "Linting for TensorRT failed"
        with qtbot.waitSignal(state.changed, timeout=60000, check_params_cb=lambda *a: state.warnings is not None):
            qtbot.mouseClick(panel.calibrate_button, Qt.MouseButton.LeftButton)
        assert [w.modules for w in state.warnings] == [FLAGGED] and state.problem == ""
    finally:
        window.shutdown()
