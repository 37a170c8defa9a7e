"""Issue 36 round 3, point 4: "1 quantizers need recalibrating" (every count label says its noun in the right number,
through one helper), and a toolbar button's hover text squeezed beside the running job's label in the status bar
("Write and valid|Exporting: ...")."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QCoreApplication  # noqa: E402
from PySide6.QtGui import QStatusTipEvent  # noqa: E402
from window_waits import settle  # noqa: E402

from workbench.app.formatting import count_text  # noqa: E402


def test_count_text_says_the_noun_in_the_right_number():
    assert count_text(1, "quantizer") == "1 quantizer"
    assert count_text(16, "quantizer") == "16 quantizers"
    assert count_text(0, "layer") == "0 layers"
    assert count_text(1, "batch", "batches") == "1 batch" and count_text(8, "batch", "batches") == "8 batches"
    assert count_text(2, "mix", "mixes") == "2 mixes"
    assert count_text(10000, "module", grouped=True) == "10,000 modules"


def _open_demo(window, qtbot):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    settle(window, qtbot)


def test_one_stale_quantizer_reads_in_the_singular(window, qtbot):
    _open_demo(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="max", num_batches=1)
    settle(window, qtbot)
    assert "1 batch," in window.summary_label.text()  # "1 batches" before
    window.controller.set_descriptor(["fc"], "input", {"num_bits": 6})  # one quantizer's descriptor changes
    settle(window, qtbot)
    assert window.controller.session.build_report.stale == ["fc._input_quantizer"]
    assert "1 quantizer needs recalibrating" in window.summary_label.text()


def _hover_tip(window, text):
    QCoreApplication.sendEvent(window.toolbar, QStatusTipEvent(text))  # what hovering a toolbar button sends
    return window.statusBar().currentMessage()


def test_a_running_jobs_label_is_not_covered_by_hover_text(window, qtbot, monkeypatch):
    from workbench.app.controller import Controller

    _open_demo(window, qtbot)
    assert _hover_tip(window, "Write and validate QDQ ONNX") == "Write and validate QDQ ONNX"  # idle: shown
    # the button clicked starts its job: the hover text it left goes (it stayed, cut: "Write and valid|Exporting")
    with qtbot.waitSignal(window.controller.busy_changed, timeout=60000):
        window.controller.calibrate(method="max", num_batches=1)
    assert window.statusBar().currentMessage() == ""
    settle(window, qtbot)
    monkeypatch.setattr(Controller, "busy", property(lambda self: True))  # a job runs
    assert _hover_tip(window, "Write and validate QDQ ONNX") == ""  # the bar tells the job only
