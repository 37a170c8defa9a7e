"""The export settings dialog (round trip through the project) and the report dialog (what it shows)."""
import json

import pytest

pytest.importorskip("PySide6")

from PySide6.QtWidgets import QApplication, QDialogButtonBox  # noqa: E402

from workbench.app.export_dialog import ExportReportDialog, ExportSettingsDialog  # noqa: E402
from workbench.app.formatting import format_number, format_size  # noqa: E402
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402


def test_settings_round_trip_and_the_report(controller, qtbot, tmp_path):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.new_project(ModelSpec("demo", "digits"),
                               DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2),
                               base_dir=tmp_path)
    session = controller.session

    # defaults: the project's export settings and its default path
    dialog = ExportSettingsDialog(controller)
    qtbot.addWidget(dialog)
    assert dialog.settings() == {"path": session.default_export_path(), "opset": 17, "dynamic_batch": True,
                                 "amax_json": False, "calibration_cache": False}
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    dialog.path_edit.setText(str(tmp_path / "missing" / "x.onnx"))
    assert not ok.isEnabled() and "does not exist" in dialog.hint.text()
    dialog.path_edit.setText(str(tmp_path / "digits"))  # no suffix: .onnx is added
    dialog.opset_spin.setValue(13)
    dialog.dynamic_check.setChecked(False)
    dialog.amax_check.setChecked(True)
    dialog.cache_check.setChecked(True)
    assert ok.isEnabled() and "digits.amax.json" in dialog.hint.text() and "digits.calib.cache" in dialog.hint.text()
    settings = dialog.settings()
    assert settings == {"path": tmp_path / "digits.onnx", "opset": 13, "dynamic_batch": False, "amax_json": True,
                        "calibration_cache": True}

    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        controller.calibrate(method="max")
    with qtbot.waitSignal(controller.export_finished, timeout=120000) as blocker:
        assert controller.export(**settings)
    report = blocker.args[0]
    assert report.opset == 13 and (tmp_path / "digits.calib.cache").is_file()

    # the next dialog starts from what was used
    again = ExportSettingsDialog(controller)
    qtbot.addWidget(again)
    assert again.settings() == settings

    # the report, readable
    shown = ExportReportDialog(report)
    qtbot.addWidget(shown)
    text = shown.plain_text()
    assert "digits.onnx written and validated" in text
    assert "onnx.checker" in text and "passed (full check)" in text
    # what quantizing costs (INT8 vs FP32 on the project's data) is shown beside the file's parity
    assert report.int8_vs_fp32 is not None and "INT8 vs FP32" in text
    assert f"{format_number(report.int8_vs_fp32['output_sqnr_db'])} dB on {report.int8_vs_fp32['num_batches']}" in text
    assert f"max abs diff {report.max_abs_diff:.3g}" in text and f"{report.cosine:.6f}" in text
    assert f"{report.quantize_nodes} QuantizeLinear, {report.dequantize_nodes} DequantizeLinear; expected " \
           f"{report.expected_qdq}" in text
    assert f"{report.per_channel} per-channel, {report.per_tensor} per-tensor" in text
    assert "opset" in text and "13" in text and report.exporter in text and report.exporter_note[:30] in text
    assert format_size(report.file_size) in text
    assert "digits.amax.json" in text and "digits.calib.cache" in text
    assert "static" in text  # no dynamic batch asked for
    for warning in report.warnings:
        assert warning in text
    copied = json.loads(shown.copy_json())
    assert copied == json.loads(QApplication.clipboard().text())
    assert copied["quantize_nodes"] == report.quantize_nodes and copied["path"] == report.path

    # the same report as the project stores it (a dict) shows the same numbers
    stored = ExportReportDialog(session.project.exports[-1].report)
    qtbot.addWidget(stored)
    assert stored.plain_text() == text
