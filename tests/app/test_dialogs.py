"""The calibration forms list the one amax vocabulary and edit the percentile within its one range."""
import pytest

pytest.importorskip("PySide6")

from workbench.app.descriptor_editor import DescriptorEditor  # noqa: E402
from workbench.app.dialogs import CalibrationOptions, percentile_spin_box  # noqa: E402
from workbench.project.settings import CalibrationSettings  # noqa: E402
from workbench.quant.calib import AMAX_METHODS, PERCENTILE  # noqa: E402


def test_calibration_form_lists_every_method_and_enables_the_percentile_only_for_it(qtbot):
    form = CalibrationOptions(CalibrationSettings.from_stored({"method": "mse", "num_batches": 4, "percentile": 99.9}))
    qtbot.addWidget(form)
    assert [form.method.itemText(i) for i in range(form.method.count())] == list(AMAX_METHODS)
    assert form.method.currentText() == "mse" and not form.percentile.isEnabled()
    form.method.setCurrentText("percentile")
    assert form.percentile.isEnabled()
    assert form.options() == {"method": "percentile", "num_batches": 4, "percentile": 99.9, "sequential": False}

    editor = DescriptorEditor()
    qtbot.addWidget(editor)
    assert [editor.method.itemText(i) for i in range(editor.method.count())] == list(AMAX_METHODS)


def test_calibration_form_shows_and_sets_the_sequential_setting(qtbot):
    form = CalibrationOptions(CalibrationSettings.from_stored({"sequential": True}))
    qtbot.addWidget(form)
    assert form.sequential.isChecked()
    form.sequential.setChecked(False)
    assert form.options()["sequential"] is False
    # what the dialog gives back is a valid calibration setting (the project keeps it)
    assert CalibrationSettings.from_stored({**form.options(), "sequential": True}).sequential is True


def test_percentile_box_stays_inside_the_valid_range(qtbot):
    box = percentile_spin_box()
    qtbot.addWidget(box)
    assert box.value() == PERCENTILE.default
    box.setValue(0.0)
    assert PERCENTILE.contains(box.value()) and box.value() > 0
    box.setValue(150.0)
    assert box.value() == PERCENTILE.high
