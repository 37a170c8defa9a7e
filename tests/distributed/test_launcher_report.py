"""How a failed job is reported: the root cause first, whatever order the ranks ended in (no processes)."""
from __future__ import annotations

from types import SimpleNamespace

from workbench.launcher import WorkerFailed, _failures


def failure(message: str, exitcode: int = 1) -> SimpleNamespace:
    return SimpleNamespace(message={"message": message, "extraInfo": {}}, exitcode=exitcode, error_file_data={})


def test_the_rank_that_caused_it_comes_before_the_ranks_it_took_down():
    error = SimpleNamespace(failures={
        0: failure("SignalException: Process 11 got signal: 15"),
        1: failure("DistributedError: rank 1: gathering results from the other ranks failed"),
        2: failure("ValueError: rank 2 could not read its batches"),
        3: failure("", exitcode=-15)})
    ordered = _failures(error)
    assert [f.rank for f in ordered] == [2, 0, 1, 3]
    message = str(WorkerFailed(ordered, 4))
    assert message.startswith("The 4-process job stopped: rank 2 failed: ValueError: rank 2 could not read")
    assert "(then ranks 0, 1, 3 stopped too)" in message


def test_a_killed_rank_is_the_cause_and_out_of_memory_is_suggested():
    ordered = _failures(SimpleNamespace(failures={0: failure("DistributedError: lost rank 1"),
                                                  1: failure("", exitcode=-9)}))
    assert ordered[0].rank == 1
    assert ordered[0].describe() == "rank 1 was killed by SIGKILL (out of memory?)"


def test_a_worker_message_is_shown_as_it_is():
    ordered = _failures(SimpleNamespace(failures={1: failure("WorkerError: no such project file: x.qwb")}))
    assert ordered[0].describe() == "rank 1 failed: no such project file: x.qwb"
