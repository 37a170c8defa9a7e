"""What the round-3 real-input run (Xvfb, xdotool, a tiny BERT and GPT-2) found, each driven through the real
widgets (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from window_waits import open_calibrated_bert, settle  # noqa: E402

INT4_LAYER = "bert.encoder.layer.0.output.dense"  # 64 input features: INT4 blocks of 64


def test_an_int4_layers_switched_off_input_says_why_in_the_histogram_within_the_plot(window, qtbot, tmp_path):
    """The histogram of an INT4 weight-only layer's input said "this quantizer uses the max calibrator... set its
    calibrator to 'histogram'" (the editor beside it is off for that input), cut off on both sides of the plot."""
    pytest.importorskip("transformers")
    open_calibrated_bert(window, qtbot, tmp_path)
    assert window.controller.set_precision([INT4_LAYER], "int4w")
    window.controller.select([INT4_LAYER])
    settle(window, qtbot)
    panel = window.layer_panel
    panel.role_tabs.setCurrentIndex(0)
    panel.quantizer_combo.setCurrentIndex(panel.quantizer_combo.findData(f"{INT4_LAYER}._input_quantizer"))
    settle(window, qtbot)
    text = panel.histogram_message.textItem.toPlainText()
    assert text.startswith("Off: this layer's precision") and "calibrator" not in text
    wrapped = panel.histogram_message.textItem.boundingRect().width()
    assert 0 < wrapped <= panel.histogram_plot.getViewBox().width()  # all of it inside the plot


def test_the_export_report_stays_in_front_when_the_main_window_is_made_again(window, qtbot, tmp_path):
    """Under Xvfb the report opened in front, then went behind the main window a second later: QtWebEngine's view
    joining the window (the graph's preload after an export) makes its native window again, which maps on top."""
    from PySide6.QtWidgets import QApplication

    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="max")
    window.controller.session.project.settings["export"]["path"] = str(tmp_path / "digits.qdq.onnx")
    with qtbot.waitSignal(window.controller.export_finished, timeout=120000):
        window.export_action.trigger()
    qtbot.waitUntil(lambda: window.export_report_dialog is not None and window.export_report_dialog.isVisible())
    report = window.export_report_dialog
    qtbot.waitUntil(lambda: QApplication.activeWindow() is report)
    # what parking the web view does to the window: a new native window, shown again (mapped over the dialog)
    window.setWindowFlags(window.windowFlags())
    window.show()
    window.activateWindow()
    assert QApplication.activeWindow() is window or QApplication.activeWindow() is report
    qtbot.waitUntil(lambda: QApplication.activeWindow() is report, timeout=5000)
    assert report.isVisible()
    report.close()


def test_the_export_report_names_the_projects_mix_not_int8(qtbot):
    """A BERT exported with FP8, INT4 W and INT8 layers: the log said "INT8+FP8+INT4 W vs FP32 ... 51.33 dB", the
    report's section "INT8 vs FP32" and its row "FP32 inf, INT8 51.33"."""
    from workbench.app.export_dialog import ExportReportDialog

    gap = {"output_sqnr_db": 51.33, "num_batches": 6, "data": "calibration", "quantized_as": "INT8+FP8+INT4 W",
           "metric": {"name": "top1", "kind": "accuracy"}, "fp32": 0.91, "int8": 0.9}
    dialog = ExportReportDialog({"path": "/tmp/bert.qdq.onnx", "validated": True, "cosine": 1.0, "max_abs_diff": 0.0,
                                 "int8_vs_fp32": gap})
    qtbot.addWidget(dialog)
    text = dialog.plain_text()
    assert "INT8+FP8+INT4 W vs FP32" in text and "INT8 vs FP32" not in text
    assert "FP32 0.91, INT8+FP8+INT4 W 0.9" in text
    # a bf16 network is compared with itself in bf16
    dialog = ExportReportDialog({"path": "/tmp/m.onnx", "validated": True, "network_dtype": "bfloat16",
                                 "int8_vs_fp32": {**gap, "quantized_as": "FP8"}})
    qtbot.addWidget(dialog)
    assert "FP8 vs BF16" in dialog.plain_text()
