"""Issue 38, cases 6-7 and the family "a hang at every phase of a distributed job": the rank that hung is the
one named, on every phase, and no wait lasts longer than the timeout (WORKBENCH_DIST_TIMEOUT)."""
import distributed_jobs as jobs
import pytest
from test_launch import live_children, new_children

from workbench.launcher import WorkerFailed, launch

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length


@pytest.mark.parametrize("phase, step", [("join", "never joined the 2-process job"),
                                         ("work", "never reached gathering results")])
def test_the_rank_that_hangs_is_named_not_rank_0(monkeypatch, phase, step):
    monkeypatch.setenv("WORKBENCH_DIST_TIMEOUT", "3")
    before = set(live_children())
    with pytest.raises(WorkerFailed) as caught:
        launch(jobs.hangs_at, (phase,), nprocs=2)
    text = str(caught.value)
    assert text.startswith("The 2-process job stopped: rank 1 did not answer: no answer within the timeout (3 s); "
                           "rank 0 stopped waiting for it"), text
    assert caught.value.rank == 1
    rank0 = next(f for f in caught.value.failures if f.rank == 0)
    assert step in rank0.message and "DistStoreError" not in text
    assert new_children(before) == set()


def test_a_rank_hung_after_its_work_is_stopped_and_the_result_stands(monkeypatch, caplog):
    monkeypatch.setenv("WORKBENCH_DIST_TIMEOUT", "3")
    before = set(live_children())
    with caplog.at_level("WARNING", logger="workbench.launcher"):
        assert launch(jobs.hangs_at, ("end",), nprocs=2) == 0  # rank 0's result (it was waited for forever)
    assert "rank 1 did not finish within 3 s of rank 0 and was stopped" in caplog.text
    assert new_children(before) == set()
