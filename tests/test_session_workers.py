"""run_in_workers refuses what cannot run in worker processes before starting any (the launch itself is
tested with real processes in tests/app/test_workers_gui.py and tests/distributed)."""
from __future__ import annotations

import pytest

from workbench.demo_run import create_demo_session
from workbench.session import SessionError
from workbench.session.workers import WORKER_JOBS, run_in_workers


@pytest.fixture(scope="module")
def demo():
    return create_demo_session(calib_batches=1)


def test_a_project_never_saved_is_refused(demo):
    with pytest.raises(SessionError, match="never been saved: save it first"):
        run_in_workers(demo, "calibrate", 2)


def test_unsaved_changes_are_refused_unless_saving_is_allowed(demo, tmp_path):
    demo.save(tmp_path / "demo.qwb")
    demo.set_setting("calibration", {"method": "max"})
    before = (tmp_path / "demo.qwb").read_bytes()
    with pytest.raises(SessionError, match="demo.qwb has unsaved changes: save them first"):
        run_in_workers(demo, "calibrate", 2)
    assert (tmp_path / "demo.qwb").read_bytes() == before and demo.dirty


def test_only_the_distributed_jobs_run_in_workers(demo):
    assert WORKER_JOBS == ("calibrate", "sensitivity", "fallback")
    with pytest.raises(SessionError, match="'export' does not run in several processes"):
        run_in_workers(demo, "export", 2)
