"""The status bar's job clock keeps telling: a long ETA is shown whole, and an ETA counted down to nothing while
the job still runs says "finishing", not a frozen "ETA 0.0 s" (pytest-qt, offscreen)."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("PySide6")

from workbench.app.jobs import JobProgress  # noqa: E402
from workbench.app.status import JobStatus  # noqa: E402


def test_the_clock_is_never_cut_and_never_frozen_at_zero(controller, qtbot, monkeypatch):
    status = JobStatus(controller)
    qtbot.addWidget(status)
    status._started("Fallback search")
    status.show()
    started = status.started_at
    # 65 s in, 8 min 20 s to go: the whole clock reads, none of it elided
    monkeypatch.setattr(time, "monotonic", lambda: started + 65.0)
    status.show_progress(JobProgress("Fallback search", 3, 20, "", elapsed_s=65.0, eta_s=500.0))
    text = status.eta.text()
    assert text == "1 min 05 s elapsed · ETA 8 min 20 s"
    assert status.eta.fontMetrics().horizontalAdvance(text) <= status.eta.width()
    # the last batch reported, the ETA spent, the job still measuring: it says so
    status.show_progress(JobProgress("Calibrating", 16, 16, "", elapsed_s=65.0, eta_s=0.0))
    monkeypatch.setattr(time, "monotonic", lambda: started + 85.0)
    status._tick()
    assert status.eta.text() == "1 min 25 s elapsed · finishing"
