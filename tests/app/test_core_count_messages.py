"""Issue 36 round 3, the GPT-2 run: the log said "1 attention modules left in floating point" (the core's reports
built their counts by hand, the app's labels through a helper of their own). Every count message, the core's and the
app's, says its noun through the one helper (workbench.plurals)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("transformers")

from bert_project import bert_specs  # noqa: E402
from window_waits import settle  # noqa: E402

from workbench import plurals  # noqa: E402
from workbench.app import formatting  # noqa: E402


def test_the_app_and_the_core_share_one_plural_rule():
    assert formatting.count_text is plurals.count_text
    assert plurals.count_text(1, "attention module") == "1 attention module"
    assert plurals.count_text(2, "worker process", "worker processes") == "2 worker processes"
    assert plurals.agree(1, "is", "are") == "is" and plurals.agree(0, "is", "are") == "are"


def test_core_reports_count_in_the_singular(tmp_path):
    from workbench.graph.fold import FoldReport
    from workbench.graph.functional import FunctionalQuantReport, SkippedOp

    report = FunctionalQuantReport()
    report.unquantized_attention.append(SkippedOp("h.0.attn", "sdpa attention function", "ignored by policy"))
    report.attention_modules.append("h.1.attn")
    assert report.attention_text().startswith("1 attention module left in floating point: h.0.attn")
    assert "1 attention module (0 modules traced)" in report.summary()
    assert FoldReport().summary().startswith("folded 0 BatchNorms")


def test_one_attention_left_in_float_reads_in_the_singular_in_the_log(window, qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    model, data = bert_specs(tmp_path, layers=1)
    controller = window.controller
    with qtbot.waitSignal(controller.session_changed, timeout=120000):
        assert controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    attention = next(name for name in controller.session.project.layers if name.endswith(".sdpa"))
    assert controller.set_precision([attention], "float") is not None
    settle(window, qtbot)
    path = tmp_path / "bert.qwb"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(path), "")))
    assert window.save()
    with qtbot.waitSignal(controller.session_changed, timeout=120000):  # reopened: built with the attention float
        assert window.open_project(path, confirmed=True)
    settle(window, qtbot)
    log = window.log_panel.text.toPlainText()
    assert "1 attention module left in floating point" in log
    assert "attention modules" not in log
