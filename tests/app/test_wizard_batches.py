"""The new-project wizard's "Number of batches" is the project's: calibration runs that many, and the Calibrate
and Settings dialogs show it (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")


from workbench.project.settings import DEFAULTS  # noqa: E402


def test_the_wizards_batches_are_what_calibration_runs_and_the_dialogs_show(window, qtbot):
    batches = 3
    assert batches != DEFAULTS.calibration.num_batches
    wizard = window.new_project()
    wizard.next()  # model page (the demo) -> calibration data, as the user clicks Next
    wizard.calibration_page.form.num_batches.setValue(batches)
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        wizard.accept()
    qtbot.waitUntil(lambda: not window.controller.busy)
    session = window.controller.session
    assert session.settings.calibration.num_batches == batches
    calibrate = window.calibrate_dialog()
    assert calibrate.num_batches.value() == batches
    calibrate.reject()
    settings = window.settings_dialog()
    assert settings.calibration.num_batches.value() == batches
    settings.reject()
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.calibrate_action.trigger()  # the toolbar's Calibrate: the project's settings
    qtbot.waitUntil(lambda: not window.controller.busy)
    assert session.project.current_calibration.num_batches == batches
    assert f"{batches} batches" in window.summary_label.text()
