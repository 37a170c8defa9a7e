"""Jobs in 2 real processes (gloo, through the elastic launcher) against the same jobs in one process.

Each launch starts two workers on a shared 2-core machine, so each test launches once and checks
everything it can on that run.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import distributed_jobs as jobs
import pytest

from workbench.launcher import WorkerFailed, launch
from workbench.quant.algorithms.distributed import SINGLE, init_from_env

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _short_collective_timeout(monkeypatch):
    # a healthy rank waiting for a dead one must give up long before the test's own timeout
    monkeypatch.setenv("WORKBENCH_DIST_TIMEOUT", "60")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def live_children() -> list[int]:
    """Processes (not zombies) whose parent is this test process; multiprocessing's resource tracker,
    which lives as long as its parent by design, does not count."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"resource_tracker" not in command:
            found.append(int(entry.name))
    return found


def new_children(before: set[int], grace_s: float = 30.0) -> set[int]:
    """Children that are not in ``before`` and still live after ``grace_s`` (exiting takes a moment on a
    loaded machine; a worker left waiting in a collective would still be there)."""
    deadline = time.monotonic() + grace_s
    while (left := set(live_children()) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_calibration_in_two_processes_equals_one_process():
    # the last batch is 8x wider, so the ranks' histograms start on different bin widths
    one = jobs.calibration_amax("entropy", 5, scale_last=8.0)
    two = launch(jobs.calibration_amax, ("entropy", 5, 8.0), nprocs=2)
    assert two["world_size"] == 2 and two["rank"] == 0
    assert two["num_batches"] == one["num_batches"] == 5
    assert two["amax"] == one["amax"]  # max (weights, per channel) and entropy (inputs): equal
    assert two["histograms"] == one["histograms"]  # merged count for count
    assert two["by_method"] == one["by_method"]  # so every method picks the same amax
    assert two["bin_width"] == one["bin_width"]
    assert two["num_samples"] == one["num_samples"]
    # rank 0 reports progress summed over both ranks, ending at the total
    assert two["progress"][-1] == (5, 5)
    assert all(total == 5 for _, total in two["progress"])
    assert [done for done, _ in two["progress"]] == sorted(done for done, _ in two["progress"])


def test_sensitivity_and_fallback_in_two_processes_equal_one_process():
    one = jobs.sensitivity_values(), jobs.fallback_values(73.5)
    two = launch(jobs.analysis_values, (73.5,), nprocs=2)
    assert two["world_size"] == 2
    names = [name for name, _, _ in one[0]["units"]]
    assert [name for name, _, _ in two["sensitivity"]["units"]] == names
    for (_, value, rank), (_, expected, expected_rank) in zip(two["sensitivity"]["units"], one[0]["units"]):
        assert rank == expected_rank
        assert math.isclose(value, expected, rel_tol=1e-6)
    assert two["sensitivity"]["progress"][-1] == (len(names) + 2, len(names) + 2)
    # the ranks exchanged batch outputs, and each still started its units from cached activations
    assert two["sensitivity"]["cache"] == one[0]["cache"] != "off"
    fallback = two["fallback"]
    # the goal is met with 3 units in float: rank 1 also measured 4 in that round, which is dropped
    assert [k for k, _, _ in one[1]["curve"]] == [0, 1, 2, 3] and one[1]["reached"]
    assert fallback["chosen"] == one[1]["chosen"]
    assert fallback["ranking"] == one[1]["ranking"]
    assert fallback["reached"] == one[1]["reached"]
    assert [(k, unit) for k, unit, _ in fallback["curve"]] == [(k, unit) for k, unit, _ in one[1]["curve"]]
    for (_, _, value), (_, _, expected) in zip(fallback["curve"], one[1]["curve"]):
        assert math.isclose(value, expected, rel_tol=1e-6)


@pytest.mark.parametrize("how, expected", [("raise", "rank 1 failed: ValueError: rank 1 could not read its batches"),
                                           ("kill", "rank 1 was killed by SIGKILL")])
def test_a_failed_rank_stops_the_job_and_is_named(how, expected):
    before = set(live_children())  # other tests' helpers (a resource tracker, a server) may live on
    with pytest.raises(WorkerFailed) as caught:
        launch(jobs.failing_rank, (how,), nprocs=2)
    assert expected in str(caught.value)
    assert caught.value.rank == 1 and caught.value.world_size == 2
    assert new_children(before) == set()  # the healthy rank was stopped, not left waiting


def test_a_hanging_rank_times_the_others_out(monkeypatch):
    monkeypatch.setenv("WORKBENCH_DIST_TIMEOUT", "3")
    before = set(live_children())
    with pytest.raises(WorkerFailed) as caught:
        launch(jobs.failing_rank, ("hang",), nprocs=2)
    # rank 0 gave up waiting, and the launcher stopped the hanging rank 1 rather than wait for it; the rank
    # named is the one that hung (it was "rank 0 failed": the healthy rank blamed)
    assert str(caught.value).startswith("The 2-process job stopped: rank 1 did not answer: no answer within the "
                                        "timeout (3 s); rank 0 stopped waiting for it"), str(caught.value)
    assert caught.value.rank == 1
    assert new_children(before) == set()


def test_one_process_needs_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_from_env() is SINGLE
    assert launch(jobs.world, nprocs=1) == (0, 1)


def test_launch_refuses_a_bad_worker_count():
    with pytest.raises(ValueError, match="positive integer"):
        launch(jobs.world, nprocs=0)


def test_malformed_environment_is_explained(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "one")
    from workbench.quant.algorithms.distributed import DistributedError

    with pytest.raises(DistributedError, match="RANK must be an integer"):
        init_from_env()
    assert os.environ["WORLD_SIZE"] == "2"
