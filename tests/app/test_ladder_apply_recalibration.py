"""Issue 36 round 3, point 3: the ladder's Apply calibrates only the layers whose quantizers it changed (it took
seconds recalibrating the whole model), with exactly the amax and output SQNR a whole calibration gives; when
anything else changed since the last calibration it calibrates the whole model, as before."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from bert_project import bert_specs  # noqa: E402
from demo_project import shown  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from window_waits import run_ladder  # noqa: E402

from workbench.app.sensitivity_tab import SensitivityTab  # noqa: E402


class _Mix:
    """A ladder result as Apply reads it: the mix, not applied yet."""

    def __init__(self, precisions):
        self.precisions, self.applied = precisions, False


def _amax(session):
    return {name: record.amax.copy() for name, record in session.project.current_calibration.quantizers.items()}


def _bert_session(tmp_path, method):
    from workbench.session import Session

    model, data = bert_specs(tmp_path)
    session = Session.create(model, data)
    session.set_setting("calibration", {"method": method})
    session.calibrate()
    return session


@pytest.mark.parametrize("method", ["entropy", "auto"])
def test_apply_calibrates_only_changed_layers_with_a_whole_calibrations_amax(tmp_path, method):
    session = _bert_session(tmp_path, method)
    layers = list(session.project.layers)
    mix = {name: precision.value for name, precision in session.precisions().items()}
    value, ffn, out = layers[2], layers[5], layers[6]
    mix.update({value: "fp8", ffn: "fp8", out: "float"})
    before = _amax(session)
    assert {c.layer for c in session.apply_ladder(_Mix(mix))} == {value, ffn, out}

    result = session.calibrate_applied()
    # the two layers now in FP8 were calibrated (input and weight each), and the attention products (their fused
    # path while paused would round differently downstream); no other Linear
    changed = {f"{layer}.{role}" for layer in (value, ffn) for role in ("_input_quantizer", "_weight_quantizer")}
    assert changed <= set(result.quantizers)
    assert all(".sdpa." in name for name in set(result.quantizers) - changed)
    assert len(result.quantizers) < len(session.project.current_calibration.quantizers) / 2
    partial, partial_sqnr = _amax(session), session.project.current_calibration.output_sqnr_db
    assert not any(name.startswith(out + ".") for name in partial)  # the float layer has no quantizers left
    untouched = [name for name in partial if name not in result.quantizers]
    assert untouched and all(np.array_equal(partial[name], before[name]) for name in untouched)
    assert session.build_report.stale == []  # nothing left to calibrate

    session.calibrate()  # the whole model, as Apply did before
    full = _amax(session)
    assert partial.keys() == full.keys()
    assert all(np.array_equal(partial[name], full[name]) for name in full)
    # the output SQNR's float reference is each run's collect pass, where a collecting attention takes its decomposed
    # path and a paused one torch's fused kernel: float rounding (~1e-6 relative), not a different calibration
    assert partial_sqnr == pytest.approx(session.project.current_calibration.output_sqnr_db, abs=5e-4)


def test_apply_calibrates_the_whole_model_when_more_changed_since_the_calibration(tmp_path):
    session = _bert_session(tmp_path, "max")
    layers = list(session.project.layers)
    session.set_descriptor([layers[0]], "weight", num_bits=6)  # a hand edit since the calibration, not the Apply's
    mix = {name: precision.value if precision else "custom" for name, precision in session.precisions().items()}
    mix[layers[5]] = "fp8"
    session.apply_ladder(_Mix(mix))
    result = session.calibrate_applied()
    assert f"{layers[0]}._weight_quantizer" in result.quantizers  # the edited layer is calibrated too
    assert len(result.quantizers) == len(session.project.current_calibration.quantizers)


def test_gui_apply_calibrates_the_changed_layer_only(controller, qtbot, calibrated_block_project):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.open_project(calibrated_block_project, trust_code=True)
    controller.session.update_setting("calibration", method="max")  # as it was calibrated (``calibrate --method``)
    panel = shown(SensitivityTab(controller), qtbot, 1100, 800).fallback_panel
    run_ladder(panel, controller, qtbot)
    assert panel.ladder_result.precisions == {"fc": "fp8", "head": "int8"}
    head = _amax(controller.session)["head._input_quantizer"]
    logged = []
    controller.log.connect(lambda level, text: logged.append(text))
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.busy and not panel.applying, timeout=60000)
    assert any(text.startswith("2 quantizers calibrated") for text in logged), logged  # fc's, not head's
    partial = _amax(controller.session)
    assert np.array_equal(partial["head._input_quantizer"], head)
    controller.session.calibrate()
    full = _amax(controller.session)
    assert partial.keys() == full.keys() and all(np.array_equal(partial[k], full[k]) for k in full)
