"""Export dialogs: the settings of a QDQ ONNX export, and the validation report of one.

:class:`ExportSettingsDialog` edits what ``controller.export(**dialog.settings())`` uses (path, opset,
dynamic batch, side files), starting from the project's last export settings. :class:`ExportReportDialog`
shows an :class:`~workbench.export.onnx_export.ExportReport` (or the dict stored in the project)
so it reads at a glance: did the checker pass, does onnxruntime match PyTorch, are the Q/DQ counts
what the model needs, and what was written where.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.formatting import count_text, format_number, format_size
from workbench.opsets import DEFAULT_OPSET, MIN_OPSET, TENSORRT_8_MAX_OPSET, newest_opset, opset_bounds_text
from workbench.project.settings import ExportSettings
from workbench.session import jsonable

__all__ = ["ExportSettingsDialog", "ExportReportDialog", "report_dict", "opset_spin_box"]


def opset_spin_box(value: int | None = None) -> QSpinBox:
    """The ONNX opset, within the bounds the exporter writes (:mod:`workbench.export.opset`)."""
    box = QSpinBox()
    box.setRange(MIN_OPSET, newest_opset())
    box.setValue(int(value or DEFAULT_OPSET))
    box.setToolTip(f"ONNX opset: {opset_bounds_text()}; TensorRT 8.6 reads up to {TENSORRT_8_MAX_OPSET}")
    return box


class ExportSettingsDialog(QDialog):
    """Where and how to export: ``settings()`` is a dict for ``controller.export(**settings)``."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setWindowTitle("Export QDQ ONNX")
        self.setMinimumWidth(560)
        session = controller.session
        stored = session.settings.export if session is not None else ExportSettings()
        default_path = controller.default_export_path() if session is not None else Path.cwd() / "model.qdq.onnx"

        layout = QVBoxLayout(self)
        form = QFormLayout()
        path_row = QHBoxLayout()
        self.path_edit = QLineEdit(str(default_path))
        self.path_edit.textChanged.connect(self._validate)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(browse)
        form.addRow("File", path_row)
        self.opset_spin = opset_spin_box(stored.opset)
        self.opset_spin.valueChanged.connect(self._validate)
        form.addRow("Opset", self.opset_spin)
        self.dynamic_check = QCheckBox("Dynamic batch dimension (checked at a second batch size)")
        self.dynamic_check.setChecked(stored.dynamic_batch)
        form.addRow("", self.dynamic_check)
        self.amax_check = QCheckBox("Write the amax of every quantizer as JSON")
        self.amax_check.setChecked(stored.amax_json)
        self.amax_check.toggled.connect(self._validate)
        form.addRow("", self.amax_check)
        self.cache_check = QCheckBox("Write a TensorRT calibration cache (activation scales)")
        self.cache_check.setChecked(stored.calibration_cache)
        self.cache_check.toggled.connect(self._validate)
        form.addRow("", self.cache_check)
        self.strict_check = QCheckBox("Strict: refuse the file when onnxruntime and the model disagree (else it is "
                                      "written marked not validated, with the diagnosis)")
        form.addRow("", self.strict_check)
        layout.addLayout(form)
        self.hint = QLabel()
        self.hint.setWordWrap(True)
        self.hint.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.hint)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Export")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self._validate()

    def target(self) -> Path:
        """The file to write (``.onnx`` added when the name has no suffix)."""
        path = Path(self.path_edit.text().strip()).expanduser()
        return path if path.suffix else path.with_suffix(".onnx")

    def settings(self) -> dict[str, Any]:
        """``{"path", "opset", "dynamic_batch", "amax_json", "calibration_cache", "strict"}``, as controller.export
        takes them."""
        return {"path": self.target(), "opset": self.opset_spin.value(),
                "dynamic_batch": self.dynamic_check.isChecked(), "amax_json": self.amax_check.isChecked(),
                "calibration_cache": self.cache_check.isChecked(), "strict": self.strict_check.isChecked()}

    def problem(self) -> str | None:
        """Why the settings cannot be used (None when they can)."""
        text = self.path_edit.text().strip()
        if not text:
            return "Choose a file to write."
        target = self.target()
        if target.is_dir():
            return f"{target} is a folder: give a file name."
        if not target.parent.is_dir():
            return f"The folder {target.parent} does not exist."
        return None

    def _validate(self, *_: Any) -> None:
        problem = self.problem()
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(problem is None)
        if problem is not None:
            self.hint.setText(f"<span style='color:#b00020'>{html.escape(problem)}</span>")
            return
        target = self.target()
        lines = [f"Writes <b>{html.escape(target.name)}</b> in {html.escape(str(target.parent))}"
                 + (" (replacing the file there)" if target.exists() else "")]
        if self.amax_check.isChecked():
            lines.append(f"and {html.escape(target.with_suffix('.amax.json').name)}")
        if self.cache_check.isChecked():
            lines.append(f"and {html.escape(target.with_suffix('.calib.cache').name)}")
        note = ""
        if self.opset_spin.value() > TENSORRT_8_MAX_OPSET:
            note = (f"<br><span style='color:#a05000'>TensorRT 8.6 reads opset {TENSORRT_8_MAX_OPSET} at most; "
                    "newer TensorRT versions read more.</span>")
        self.hint.setText(", ".join(lines) + "." + note)

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export QDQ ONNX to", str(self.target()),
                                              "ONNX (*.onnx);;All files (*)")
        if path:
            self.path_edit.setText(path)


def report_dict(report: Any) -> dict[str, Any]:
    """An ExportReport, or the dict a project stores for one, as a plain dict."""
    if isinstance(report, dict):
        return dict(report)
    if hasattr(report, "to_dict"):
        return report.to_dict()
    raise TypeError(f"Not an export report: {type(report).__name__}")


_OK = "<span style='color:#1a7f37'>✔</span>"
_WARN = "<span style='color:#b35900'>⚠</span>"


class ExportReportDialog(QDialog):
    """The validation report of an export, readable, with "Copy as JSON"."""

    def __init__(self, report: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.report = report_dict(report)
        self.setWindowTitle(f"Export report: {Path(str(self.report.get('path', ''))).name}")
        self.resize(760, 640)
        layout = QVBoxLayout(self)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.browser.anchorClicked.connect(self._open_link)
        self.browser.setHtml(self.to_html())
        layout.addWidget(self.browser, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = buttons.addButton("Copy as JSON", QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(self.copy_json)
        self.folder_button = buttons.addButton("Open folder", QDialogButtonBox.ButtonRole.ActionRole)
        self.folder_button.clicked.connect(self.open_folder)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)

    def to_json(self) -> str:
        return json.dumps(jsonable(self.report), indent=2)

    def copy_json(self) -> str:
        """Put the whole report on the clipboard as JSON (and return it)."""
        text = self.to_json()
        QGuiApplication.clipboard().setText(text)
        self.copy_button.setText("Copied")
        return text

    def open_folder(self) -> bool:
        folder = Path(str(self.report.get("path", ""))).parent
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def _open_link(self, url: QUrl) -> None:
        QDesktopServices.openUrl(url)

    def plain_text(self) -> str:
        """What the dialog shows, as text (what a user reads; used by tests and "select all, copy")."""
        return self.browser.toPlainText()

    def to_html(self) -> str:
        r = self.report
        esc = html.escape
        path = Path(str(r.get("path", "")))
        rows: list[str] = []

        def section(title: str) -> None:
            rows.append(f"<tr><td colspan='3' style='padding-top:12px'><b style='font-size:13px'>{esc(title)}"
                        "</b></td></tr>")

        def row(mark: str, label: str, value: str) -> None:
            rows.append(f"<tr><td width='18'>{mark}</td><td style='color:#555;padding-right:14px'>{esc(label)}</td>"
                        f"<td>{value}</td></tr>")

        gap = r.get("int8_vs_fp32")
        if isinstance(gap, dict):  # what quantizing costs, before the file's parity with the fake-quant model
            # the project's mix (INT8+FP8+INT4 W), as the log's headline names it; reports before it knew: INT8
            label = str(gap.get("quantized_as") or "INT8")
            float_name = {"bfloat16": "BF16", "float16": "FP16"}.get(str(r.get("network_dtype")), "FP32")
            section(f"{label} vs {float_name}")
            metric = dict(gap.get("metric") or {})
            row("", "output SQNR", f"<b>{format_number(gap.get('output_sqnr_db'))} dB</b> on "
                                   f"{esc(str(gap.get('num_batches')))} {esc(str(gap.get('data', 'evaluation')))} "
                                   "batches")
            if metric.get("name") not in (None, "sqnr"):
                row("", str(metric.get("name")), f"{float_name} {format_number(gap.get('fp32'))}, {esc(label)} "
                                                      f"<b>{format_number(gap.get('int8'))}</b>")

        section("Validation")
        row(_OK, "onnx.checker", "passed (full check)")
        outputs = r.get("outputs") or []
        cosine, max_diff = r.get("cosine"), r.get("max_abs_diff")
        validated = r.get("validated", True)
        row(_OK if validated else _WARN, "onnxruntime vs PyTorch",
            f"max abs diff <b>{format_number(max_diff, 3)}</b>, lowest cosine <b>{format_number(cosine, spec='.6f')}"
            "</b>" + ("" if validated else " <b style='color:#b00020'>below the threshold: NOT VALIDATED</b>"))
        diagnosis = r.get("parity_diagnosis")
        if isinstance(diagnosis, dict):
            row(_WARN, "diagnosis", esc(str(diagnosis.get("text", ""))))
        checks = [c if isinstance(c, dict) else getattr(c, "__dict__", {}) for c in r.get("checks") or []]
        if not checks:  # a report stored before the checks were listed: the sample's rows only
            checks = [{**(o if isinstance(o, dict) else getattr(o, "__dict__", {})), "check": "sample inputs"}
                      for o in outputs]
        if checks:
            # every check behind the headline, one row each: the headline's number is always in this table
            table = ["<table cellspacing='0' cellpadding='3' style='border-collapse:collapse'>"
                     "<tr style='background:#eef1f5'><th align='left'>check</th><th align='left'>output</th>"
                     "<th align='left'>shape</th><th align='right'>max abs diff</th><th align='right'>cosine</th>"
                     "</tr>"]
            for check in checks:
                shape = "×".join(str(s) for s in check.get("shape", ()))
                counted = check.get("in_headline", True)
                headline = counted and check.get("max_abs_diff") == max_diff
                style = "" if counted else " style='color:#777'"
                diff = format_number(check.get("max_abs_diff"), 3)
                table.append(f"<tr{style}><td>{esc(str(check.get('check', '')))}</td>"
                             f"<td>{esc(str(check.get('output', check.get('name', ''))))}</td><td>{esc(shape)}</td>"
                             f"<td align='right'>{f'<b>{diff}</b>' if headline else diff}</td>"
                             f"<td align='right'>{format_number(check.get('cosine'), spec='.6f')}</td></tr>")
            table.append("</table>")
            row("", "checks", "".join(table))
        dynamic = r.get("dynamic_batch_check")
        if r.get("dynamic_batch"):
            if isinstance(dynamic, dict):
                batch = (dynamic.get("shape") or ["?"])[0]
                row(_OK, "dynamic batch", f"checked at batch {esc(str(batch))}: max abs diff "
                                          f"{format_number(dynamic.get('max_abs_diff'), 3)}, cosine "
                                          f"{format_number(dynamic.get('cosine'), spec='.6f')}")
            else:
                row(_WARN, "dynamic batch", "declared, not checked at a second batch size")
        else:
            row("", "batch", "static (the sample's batch size)")

        section("Quantize / Dequantize")
        q, dq, expected = r.get("quantize_nodes"), r.get("dequantize_nodes"), r.get("expected_qdq")
        matches = q == expected and dq == expected
        kinds = r.get("entry_kinds") or {}
        # the counts are the file's own nodes; the quantizers that have none are named, each with its reason
        missing = list(r.get("quantizers_without_qdq") or [])
        unexplained = any(kind == "quantizers_without_qdq" for kind in kinds.values())
        row(_OK if matches or not unexplained else _WARN, "Q / DQ nodes",
            f"<b>{q}</b> QuantizeLinear, <b>{dq}</b> DequantizeLinear in the file; "
            f"<b>{expected}</b> quantized tensors in the PyTorch pass"
            + (" (one pair per quantized tensor)" if matches else ""))
        if missing:
            row(_WARN if unexplained else "", "without Q/DQ",
                f"{count_text(len(missing), 'quantizer')}: " + esc(", ".join(missing[:12]))
                + (" ..." if len(missing) > 12 else "")
                + " (why: under Warnings or Notes)")
        elif not matches:
            row("", "", f"{esc(str(expected))} tensors quantized in PyTorch, the file's {q} Q / {dq} DQ: every "
                        "quantizer has its Q/DQ; the difference is pairs shared or repeated (Notes)")
        row("", "quantizers", f"{r.get('quantizers')} exported: {r.get('per_channel')} per-channel, "
                              f"{r.get('per_tensor')} per-tensor"
                              + (f", {r.get('unsigned')} unsigned" if r.get("unsigned") else "")
                              + (f", {r.get('narrow_range')} narrow-range" if r.get("narrow_range") else ""))
        if r.get("clip_nodes"):
            row("", "Clip nodes", f"{r.get('clip_nodes')} (narrow range: Clip(-127, 127) between Q and DQ)")

        section("File")
        row("", "path", f"<a href='{QUrl.fromLocalFile(str(path)).toString()}'>{esc(str(path))}</a>")
        row("", "size", format_size(r.get("file_size")))
        opset, requested = r.get("opset"), r.get("requested_opset")
        row("", "opset", f"{opset}" + (f" (asked for {requested})" if requested not in (None, opset) else ""))
        row("", "exporter", f"<b>{esc(str(r.get('exporter', '')))}</b>: {esc(str(r.get('exporter_note', '')))}")
        row("", "inputs / outputs", f"{esc(', '.join(r.get('input_names') or []))} → "
                                    f"{esc(', '.join(r.get('output_names') or []))}")
        row("", "time", f"export {format_number(r.get('export_time_s'), spec='.2f')} s, validation "
                        f"{format_number(r.get('validation_time_s'), spec='.2f')} s, "
                        f"total {format_number(r.get('total_time_s'), spec='.2f')} s")

        side = [("amax JSON", r.get("amax_json_path")), ("TensorRT calibration cache", r.get("calibration_cache_path")),
                ("float ONNX", r.get("float_onnx_path"))]
        side = [(label, value) for label, value in side if value]
        section("Side files")
        if side:
            for label, value in side:
                exists = Path(str(value)).is_file()
                row(_OK if exists else _WARN, label, esc(str(value)) + ("" if exists else " (missing now)"))
        else:
            row("", "", "none (amax JSON and calibration cache are options of the export settings)")

        warnings = r.get("warnings") or []
        section(f"Warnings ({len(warnings)})")
        if warnings:
            for warning in warnings:
                row(_WARN, "", esc(str(warning)))
        else:
            row(_OK, "", "none")
        notes = r.get("notes") or []
        if notes:  # what the exporter did on its own: for the curious, nothing to act on
            section(f"Notes ({len(notes)})")
            for note in notes:
                row("", "", f"<span style='color:#666'>{esc(str(note))}</span>")

        # the green tick only when every check passed and nothing needs the user's attention
        if not r.get("validated", True):
            verdict = f"{_WARN} {esc(path.name)} written, NOT VALIDATED: onnxruntime and the model disagree"
        elif warnings:
            verdict = (f"{_WARN} {esc(path.name)} written and validated, with {count_text(len(warnings), 'warning')}"
                       " (below)")
        else:
            verdict = f"{_OK} {esc(path.name)} written and validated"
        head = (f"<h3 style='margin-bottom:2px'>{verdict}</h3>"
                f"<div style='color:#555'>{q or 0} Q / {dq or 0} DQ · opset {opset} · "
                f"{format_size(r.get('file_size'))} · "
                f"onnxruntime matches PyTorch to {format_number(max_diff, 3)}</div>")
        return f"{head}<table cellspacing='0' cellpadding='2'>{''.join(rows)}</table>"
