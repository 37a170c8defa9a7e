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
                                 "amax_json": False, "calibration_cache": False, "strict": False}
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
                        "calibration_cache": True, "strict": False}

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
    assert f"{report.quantize_nodes} QuantizeLinear, {report.dequantize_nodes} DequantizeLinear in the file; " \
           f"{report.expected_qdq} quantized tensors in the PyTorch pass" in text
    assert f"{report.per_channel} per-channel, {report.per_tensor} per-tensor" in text
    assert "opset" in text and "13" in text and report.exporter in text and report.exporter_note[:30] in text
    assert format_size(report.file_size) in text
    assert "digits.amax.json" in text and "digits.calib.cache" in text
    assert "static" in text  # no dynamic batch asked for
    for warning in report.warnings:
        assert warning in text
    for note in report.notes:  # shown apart, after the warnings
        assert note in text[text.index("Notes ("):]
    copied = json.loads(shown.copy_json())
    assert copied == json.loads(QApplication.clipboard().text())
    assert copied["quantize_nodes"] == report.quantize_nodes and copied["path"] == report.path

    # the same report as the project stores it (a dict) shows the same numbers
    stored = ExportReportDialog(session.project.exports[-1].report)
    qtbot.addWidget(stored)
    assert stored.plain_text() == text


def test_report_shows_notes_apart_and_the_headline_in_the_checks_table(qtbot):
    # a BERT export's report as the project stores it: its headline comes from the dynamic-sequence check
    note = "ReduceMean: removed noop_with_empty_axes (default value, unknown to opset 17)"
    warning = "1 of 7 weight GEMMs keep a float weight (no Q/DQ; TensorRT runs them in floating point): pooler/Gemm"

    def check(name, diff, cosine, counted=True):
        return {"check": name, "output": "logits", "shape": [2, 3], "max_abs_diff": diff, "cosine": cosine,
                "in_headline": counted}

    report = {"path": "/tmp/bert.onnx", "exporter": "dynamo", "exporter_note": "torch.export-based exporter",
              "opset": 17, "requested_opset": 17, "input_names": ["input_ids"], "output_names": ["logits"],
              "dynamic_batch": True, "quantize_nodes": 10, "dequantize_nodes": 10, "expected_qdq": 10,
              "outputs": [{"name": "logits", "shape": [2, 3], "max_abs_diff": 2e-5, "cosine": 0.9999999}],
              "max_abs_diff": 0.00141, "cosine": 0.9999,
              "dynamic_batch_check": {"name": "logits", "shape": [3, 3], "max_abs_diff": 3e-5, "cosine": 0.9999998},
              "checks": [check("sample inputs", 2e-5, 0.9999999), check("batch size 3", 3e-5, 0.9999998),
                         check("sequence length 9", 0.00141, 0.9999),
                         check("onnxruntime's default graph optimizations (information)", 0.02, 0.99, False)],
              "warnings": [warning], "notes": [note], "entry_kinds": {warning: "float_gemms", note: "opset_conversion"}}
    dialog = ExportReportDialog(report)
    qtbot.addWidget(dialog)
    text = dialog.plain_text()
    warnings_part = text[text.index("Warnings (1)"):text.index("Notes (1)")]
    assert warning in warnings_part and note not in warnings_part
    assert note in text[text.index("Notes (1)"):]
    table = text[text.index("checks"):text.index("Warnings (1)")]
    assert "sequence length 9" in table and "0.00141" in table  # the headline's number has its row
    assert "matches PyTorch to 0.00141" in text
    assert "batch size 3" in table and "optimizations (information)" in table
    # a warning: no green tick in the headline, which says how many warnings there are
    assert "bert.onnx written and validated, with 1 warning (below)" in text and "✔ bert.onnx" not in text


def test_the_report_names_the_quantizers_without_q_dq_and_counts_the_file_s_nodes(qtbot):
    missing = "2 quantizer(s) ran in PyTorch but have no Q/DQ in the file (...): a._input_quantizer, b._input_quantizer"
    constant = "c._input_quantizer: no Q/DQ on its input, the constant /ConstantOfShape (ConstantOfShape 0): ..."
    report = {"path": "/tmp/m.onnx", "exporter": "torchscript", "exporter_note": "TorchScript exporter: because",
              "opset": 17, "requested_opset": 17, "input_names": ["x"], "output_names": ["logits", "pred_boxes"],
              "dynamic_batch": False, "quantize_nodes": 48, "dequantize_nodes": 48, "expected_qdq": 51,
              "outputs": [], "max_abs_diff": 0.0, "cosine": 1.0, "checks": [],
              "quantizers_without_qdq": ["a._input_quantizer", "b._input_quantizer", "c._input_quantizer"],
              "warnings": [missing], "notes": [constant],
              "entry_kinds": {missing: "quantizers_without_qdq", constant: "constant_qdq"}}
    dialog = ExportReportDialog(report)
    qtbot.addWidget(dialog)
    text = dialog.plain_text()
    assert "48 QuantizeLinear, 48 DequantizeLinear in the file; 51 quantized tensors in the PyTorch pass" in text
    assert "see the JSON" not in text
    assert "3 quantizers: a._input_quantizer, b._input_quantizer, c._input_quantizer" in text
    assert "logits, pred_boxes" in text and "TorchScript exporter: because" in text
    assert "with 1 warning" in text


def test_a_report_that_failed_parity_says_not_validated_with_its_diagnosis(qtbot):
    diagnosis = {"verdict": "operation", "module": "norm", "first": "conv2._input_quantizer",
                 "text": "parity diagnosis (sample inputs): an operation computed differently: module 'norm' parts"}
    shown = ExportReportDialog({"path": "/tmp/m.onnx", "validated": False, "cosine": 0.38, "max_abs_diff": 8.3,
                                "quantize_nodes": 4, "dequantize_nodes": 4, "expected_qdq": 4,
                                "parity_diagnosis": diagnosis, "warnings": []})
    qtbot.addWidget(shown)
    text = shown.plain_text()
    assert "m.onnx written, NOT VALIDATED" in text and "written and validated" not in text
    assert "module 'norm' parts" in text and "below the threshold" in text
