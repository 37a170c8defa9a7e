"""Issue 36 round 3, point 3: after the ladder's Apply (which recalibrates the layers it changed) Undo apply left
16 quantizers "need recalibrating". Undo puts back the calibration from before Apply: every quantizer's amax as it
was, in the project and in the live model, and nothing stale."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")

from bert_project import bert_specs  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from window_waits import run_ladder, settle  # noqa: E402

from workbench.quant.algorithms.snapshot import quantizer_names  # noqa: E402


class _Mix:
    """A ladder result as Apply reads it: the mix, not applied yet."""

    def __init__(self, precisions):
        self.precisions, self.applied = precisions, False


def _recorded(session):
    return {name: record.amax.copy() for name, record in session.project.current_calibration.quantizers.items()}


def _live(session):
    return {name: q.amax.detach().clone().numpy() for name, q in quantizer_names(session.quantized_model()).items()
            if q.is_enabled and q.amax is not None}


def _fp8_mix(session):
    layers = list(session.project.layers)
    mix = {name: precision.value for name, precision in session.precisions().items()}
    mix.update({layers[2]: "fp8", layers[5]: "fp8", layers[6]: "float"})
    return mix


def _equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[name], b[name]) for name in a)


def test_undo_apply_puts_back_the_calibration_from_before_apply(tmp_path):
    from workbench.session import Session

    model, data = bert_specs(tmp_path)
    session = Session.create(model, data)
    session.calibrate(method="max")
    recorded, live, sqnr = _recorded(session), _live(session), session.project.current_calibration.output_sqnr_db

    session.apply_ladder(_Mix(_fp8_mix(session)))
    session.calibrate_applied()  # what the GUI's Apply does next: the changed layers in FP8
    assert not _equal(_recorded(session), recorded)

    session.undo_ladder_apply()
    assert session.build_report.stale == []  # nothing "needs recalibrating"
    assert _equal(_recorded(session), recorded)
    assert _equal(_live(session), live)  # the model itself computes with the amax it had
    run = session.project.current_calibration
    assert run.output_sqnr_db == sqnr and run.state_digest == session.state_digest()  # not "changed since"
    assert len({r.id for r in session.project.calibrations}) == len(session.project.calibrations)


def test_undo_keeps_a_calibration_made_since_when_the_project_is_not_as_before(tmp_path):
    """A setting changed after the Apply: the old calibration does not describe the project any more, so Undo does
    not bring it back (what it does not describe shows as needing a calibration)."""
    from workbench.session import Session

    model, data = bert_specs(tmp_path)
    session = Session.create(model, data)
    session.calibrate(method="max")
    session.apply_ladder(_Mix(_fp8_mix(session)))
    session.calibrate_applied()
    session.update_setting("rules", maxpool=not session.settings.rules.maxpool)
    runs = len(session.project.calibrations)
    session.undo_ladder_apply()
    assert len(session.project.calibrations) == runs


def test_gui_undo_apply_leaves_nothing_to_recalibrate(window, qtbot, calibrated_block_project):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        window.open_project(calibrated_block_project, trust_code=True, confirmed=True)
    settle(window, qtbot)
    session = window.controller.session
    session.update_setting("calibration", method="max")  # as it was calibrated (``calibrate --method``)
    recorded = _recorded(session)
    panel = window.extra_tabs["Sensitivity"].fallback_panel
    run_ladder(panel, window.controller, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)  # fc in FP8, calibrated
    qtbot.waitUntil(lambda: not window.controller.busy and not panel.applying, timeout=60000)
    qtbot.mouseClick(panel.undo_apply_button, Qt.MouseButton.LeftButton)
    settle(window, qtbot)
    assert session.build_report.stale == []
    assert "recalibrat" not in window.summary_label.text() and "changed since" not in window.summary_label.text()
    assert _equal(_recorded(session), recorded)
