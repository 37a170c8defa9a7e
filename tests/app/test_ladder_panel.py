"""The fallback panel's ladder: the mixed-precision search from the GUI, its curve of metric against weight
bytes, and Apply (the GUI twin of `sensitivity --ladder ... --apply`)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from demo_project import shown  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from workbench import cli  # noqa: E402
from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


@pytest.fixture
def project(calibrated_block_project):
    return calibrated_block_project


def test_the_ladder_search_plots_metric_against_bytes_and_applies_the_mix(controller, qtbot, project):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.open_project(project, trust_code=True)
    session = controller.session
    tab = shown(SensitivityTab(controller), qtbot, 1100, 800)
    panel = tab.fallback_panel
    panel._metric = lambda: "sqnr"
    panel.metric_changed()
    assert [panel.ladder_box.itemText(i) for i in range(2)] == ["int8,float", "int8,fp8,float"]
    panel.ladder_box.setCurrentText("int8, fp9")
    with qtbot.waitSignal(controller.error, timeout=10000) as blocker:
        assert not panel.run_fallback()
    assert "unknown precision 'fp9'" in blocker.args[1]

    panel.ladder_box.setCurrentText("int8,fp8,float")
    panel.goal_box.setCurrentIndex(panel.goal_box.findData("target"))
    panel.goal_spin.setValue(25)
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000) as blocker:
        qtbot.mouseClick(panel.fallback_button, Qt.MouseButton.LeftButton)
    result = blocker.args[0]
    assert result.precisions == {"fc": "fp8", "head": "int8"} and result.reached
    assert not panel.ladder_plot.isHidden() and panel.fallback_plot.isHidden()
    xs, ys = panel.ladder_curve.getData()
    assert list(xs) == result.plot_data()[0] and list(ys) == pytest.approx(result.plot_data()[1])
    assert "fc fp8" in panel.fallback_label.text() and "Reached" in panel.fallback_label.text()
    assert panel.apply_button.isEnabled()
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    assert {k: v.value for k, v in session.precisions().items()} == {"fc": "fp8", "head": "int8"}
    assert "Applied" in panel.fallback_label.text() and not panel.apply_button.isEnabled()

    # a weight budget: the best metric that fits
    panel.goal_box.setCurrentIndex(panel.goal_box.findData("budget_bytes"))
    assert panel.goal_label.text() == "Budget (bytes)"
    panel.goal_spin.setValue(8000)
    with qtbot.waitSignal(controller.ladder_changed, timeout=120000) as blocker:
        panel.run_fallback()
    assert blocker.args[0].budget_bytes == 8000 and blocker.args[0].weight_bytes <= 8000
    assert panel.ladder_budget.isVisible() and panel.ladder_budget.value() == pytest.approx(8000)


def test_a_reopened_ladder_result_names_its_own_ladder(controller, qtbot, project):
    assert cli.main(["sensitivity", str(project), "--ladder", "int8,fp8,float", "--target", "25"]) == 0
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.open_project(project, trust_code=True)
    tab = shown(SensitivityTab(controller), qtbot, 1100, 800)
    panel = tab.fallback_panel
    qtbot.waitUntil(lambda: panel.ladder_result is not None, timeout=10000)
    assert panel.ladder_box.currentText() == "int8,fp8,float"  # not the first preset, int8,float
    assert panel.ladder() == ",".join(panel.ladder_result.ladder)
