"""The fine-tune tab on the real demo session: settings, a live run with plots and history, Cancel, reset."""
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import open_demo, shown  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from workbench.app.finetune_tab import HISTORY_COLUMNS, FinetuneTab  # noqa: E402


def make_tab(controller, qtbot):
    return shown(FinetuneTab(controller), qtbot, 1000, 700)


def column(tab, index):
    return [tab.table.item(row, index).text() for row in range(tab.table.rowCount())]


def test_without_a_project_nothing_runs(controller, qtbot):
    tab = make_tab(controller, qtbot)
    assert not tab.run_button.isEnabled() and not tab.cancel_button.isEnabled()
    assert "Open a project" in tab.status_label.text()


def test_a_run_plots_live_and_shows_the_history(controller, qtbot):
    session = open_demo(controller, qtbot, metric="top1", method="percentile", percentile=95.0)
    tab = make_tab(controller, qtbot)
    assert tab.run_button.isEnabled() and not tab.reset_button.isEnabled()
    assert tab.epochs_spin.value() == 2 and float(tab.lr_edit.text()) == 1e-4  # the project's defaults
    tab.original_lr_edit.setText("0.1")
    tab.original_epochs_spin.setValue(20)
    qtbot.mouseClick(tab.recipe_button, Qt.MouseButton.LeftButton)
    assert float(tab.lr_edit.text()) == pytest.approx(1e-3) and tab.epochs_spin.value() == 2
    tab.optimizer_combo.setCurrentIndex(tab.optimizer_combo.findData("adam"))
    tab.steps_spin.setValue(6)
    epochs_seen = []
    controller.finetune_epoch.connect(lambda record: epochs_seen.append(record.epoch))
    with qtbot.waitSignal(controller.finetune_finished, timeout=120000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
        assert tab.cancel_button.isEnabled() and not tab.run_button.isEnabled()
    result = blocker.args[0]
    assert not result.cancelled and result.steps == 12 and epochs_seen == [0, 1, 2]
    tab._redraw()  # the throttled redraw, now
    steps, losses = tab.loss_curve.getData()
    assert list(steps) == list(range(1, 13)) and all(loss > 0 for loss in losses)
    epochs, metrics = tab.metric_curve.getData()
    assert list(epochs) == [0, 1, 2] and metrics[0] == pytest.approx(result.baseline.metric)
    assert list(tab.best_point.getData()[0]) == [result.best_epoch]
    assert tab.table.columnCount() == len(HISTORY_COLUMNS) and column(tab, 0) == ["0", "1", "2"]
    assert column(tab, 5)[result.best_epoch] == "kept"
    assert tab.status_label.text() == result.summary()
    qtbot.waitUntil(lambda: not controller.busy)
    assert tab.progress_bar.value() == tab.progress_bar.maximum() > 0  # shows done, not "0%"
    assert session.project.current_finetune is not None and tab.reset_button.isEnabled()
    assert session.project.settings["finetune"]["optimizer"] == "adam"

    # reopening the tab on the project shows the stored history
    other = make_tab(controller, qtbot)
    assert column(other, 0) == ["0", "1", "2"] and "last fine-tune" in other.status_label.text()
    with qtbot.waitSignal(controller.calibration_changed):
        qtbot.mouseClick(tab.reset_button, Qt.MouseButton.LeftButton)
    assert session.project.current_finetune is None and not tab.reset_button.isEnabled()


def test_cancel_keeps_the_model_consistent(controller, qtbot):
    session = open_demo(controller, qtbot, metric="top1", method="percentile", percentile=95.0)
    tab = make_tab(controller, qtbot)
    model = session.quantized_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tab.epochs_spin.setValue(3)
    # what Cancel does (controller.cancel_job), at the first step in the worker itself, so that the
    # cancel lands mid-epoch however fast the steps are
    controller.finetune_progress.connect(lambda epoch, step, loss: controller.cancel_job(),
                                         Qt.ConnectionType.DirectConnection)
    with qtbot.waitSignal(controller.finetune_finished, timeout=120000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    result = blocker.args[0]
    assert result.cancelled and result.epochs_completed == 0
    assert tab.status_label.text().startswith("Cancelled before the first epoch ended: nothing changed")
    after = session.quantized_model().state_dict()
    assert all(before[k].equal(after[k]) for k in before)
    assert session.project.finetunes == [] and tab.run_button.isEnabled() and not tab.cancel_button.isEnabled()


def test_a_bad_learning_rate_is_reported_not_run(controller, qtbot):
    open_demo(controller, qtbot, metric="top1", method="percentile", percentile=95.0)
    tab = make_tab(controller, qtbot)
    tab.lr_edit.setText("")
    assert tab.run() is False and "learning rate" in tab.status_label.text()
    tab.lr_edit.setText("1e-4")
    tab.learn_amax_check.setChecked(True)
    assert tab.options()["learn_amax"] == [r"_input\d*_quantizer$"] and tab.learn_amax_edit.isEnabled()
