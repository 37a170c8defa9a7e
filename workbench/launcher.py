"""Run a job in N local processes through PyTorch's elastic launcher, and report a failed one clearly.

``workbench calibrate PROJECT --workers N`` uses :func:`launch` so that a user with a multi-GPU box (or
many cores) needs no torchrun knowledge: the elastic agent (``torch.distributed.launcher.api``) starts
the workers with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and a rendezvous already set, exactly as
``torchrun --standalone --nproc-per-node=N`` would, watches them, and stops them all as soon as one
fails. What this module adds: no restarts (a calibration that failed once fails again), worker
errors recorded in the agent's error files and turned into one :class:`WorkerFailed` that names the
rank and its error, each worker given its share of the CPU cores, and the agent's own log lines kept
out of the user's terminal.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.quant.algorithms.distributed import (
    SINGLE,
    DistContext,
    init_from_env,
    launched_by_torchrun,
    timeout_from_env,
)

logger = logging.getLogger(__name__)

__all__ = ["launch", "WorkerFailed", "WorkerError", "RankFailure", "worker_threads", "job_context", "JobInterrupted",
           "in_launched_worker", "INTERRUPTED_EXIT"]

INTERRUPTED_EXIT = 130  # 128 + SIGINT: what shells and CI expect of a command stopped by Ctrl-C
_WORKER_ENV = "WORKBENCH_LAUNCHED_WORKER"

# what the workers of a failed job report when only a peer's death, or the agent stopping them because of
# it, ended them: never the root cause while another rank has one
_PEER_LOST_MARKERS = ("DistributedError", "RankNotAnswering", "did not answer within",
                      "Connection closed by peer", "Connection reset by peer", "Broken pipe",
                      "SignalException", "got signal")


class JobInterrupted(Exception):
    """The launched job was stopped by a signal (Ctrl-C: SIGINT) sent to this process or to its workers;
    every worker has been stopped.

    Attributes:
        signum: the signal.
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"interrupted ({signal.Signals(self.signum).name}): every worker was stopped")


def in_launched_worker() -> bool:
    """True in a worker process started by :func:`launch` (Ctrl-C there is the launcher's business)."""
    return os.environ.get(_WORKER_ENV) == "1"


def _exit_interrupted(signum, frame) -> None:  # pragma: no cover - runs in a worker process
    # the terminal sends Ctrl-C to the whole process group: the launcher reports it once; a worker ends
    # at once and quietly (no traceback, no error file that would name it as the cause)
    os._exit(INTERRUPTED_EXIT)


# what RankNotAnswering says (workbench.quant.algorithms.distributed): "rank 1 did not answer within 60 s: it never
# reached ...", "ranks 1, 3 (on node-b) did not answer ..."
_NOT_ANSWERING = re.compile(r"ranks? ((?:\d+(?: \([^)]*\))?(?:, )?)+) did not answer within ([\d.e+]+ s)")


class WorkerError(Exception):
    """Raised in a worker to report a message as it is: :class:`WorkerFailed` shows it without a type name."""


@dataclass
class RankFailure:
    """How one rank ended: its global rank, exit code and error (the exception's type and message)."""

    rank: int
    exitcode: int
    message: str
    hung: str | None = None  # another rank's word that this one never reached a collective (then stopped)

    @property
    def killed_by(self) -> str | None:
        """The signal's name when the process was killed (OOM killer: SIGKILL), else None."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        if self.hung is not None:
            return f"rank {self.rank} did not answer: {self.hung}"
        if self.killed_by is not None:
            hint = " (out of memory?)" if self.killed_by == "SIGKILL" else ""
            return f"rank {self.rank} was killed by {self.killed_by}{hint}"
        return f"rank {self.rank} failed: {self.message}"


class WorkerFailed(RuntimeError):
    """A worker process of a launched job failed; every other worker has been stopped.

    Attributes:
        failures: every rank that failed, the root cause first (a rank whose error was only that a
            peer went away comes after the rank that went away).
        world_size: how many processes the job had.
    """

    def __init__(self, failures: list[RankFailure], world_size: int) -> None:
        self.failures = failures
        self.world_size = world_size
        first = failures[0].describe() if failures else "a worker failed without reporting why"
        others = [f.rank for f in failures[1:]]
        extra = f" (then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} stopped too)" if others \
            else ""
        super().__init__(f"The {world_size}-process job stopped: {first}{extra}.")

    @property
    def rank(self) -> int | None:
        return self.failures[0].rank if self.failures else None


def worker_threads(nprocs: int) -> int:
    """Intra-op threads per worker: an equal share of this machine's cores (at least one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, nprocs))


def _worker(entrypoint: Callable[..., Any], threads: int | None, folder: str, *args: Any) -> Any:
    """What each worker process runs: set its thread share, run the job, record any error for the agent; in
    ``folder``, its pid (so the launcher can stop it) and, once done, that it is (rank 0: with its result)."""
    import torch
    from torch.distributed.elastic.multiprocessing.errors import record

    os.environ[_WORKER_ENV] = "1"
    signal.signal(signal.SIGINT, _exit_interrupted)
    rank = os.environ.get("RANK", "0")
    Path(folder, f"pid-{rank}").write_text(str(os.getpid()))
    if threads is not None:
        torch.set_num_threads(threads)
    result = record(entrypoint)(*args)
    if rank == "0":
        partial = Path(folder, "result-0.tmp")
        partial.write_bytes(pickle.dumps(result))
        os.replace(partial, Path(folder, "result-0.pkl"))
    Path(folder, f"done-{rank}").touch()
    return result


class _Watchdog(threading.Thread):
    """Once rank 0 has finished, give the other ranks the job's timeout to finish too, then stop (SIGKILL: it
    also ends a stopped process) those that did not: a rank hung after its work must not hold the job forever
    (the elastic agent waits for every worker without a limit)."""

    def __init__(self, folder: str, nprocs: int, timeout_s: float, poll_s: float = 0.1) -> None:
        super().__init__(name="workbench-watchdog", daemon=True)
        self.folder, self.nprocs, self.timeout_s, self.poll_s = Path(folder), nprocs, timeout_s, poll_s
        self.stopped: list[int] = []  # ranks killed after rank 0 finished
        self.finished = threading.Event()

    def run(self) -> None:
        deadline = None
        while not self.finished.wait(self.poll_s):
            done = {r for r in range(self.nprocs) if (self.folder / f"done-{r}").exists()}
            if len(done) == self.nprocs:
                return
            if 0 not in done:
                continue
            deadline = deadline or time.monotonic() + self.timeout_s
            if time.monotonic() < deadline:
                continue
            for rank in sorted(set(range(self.nprocs)) - done):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int((self.folder / f"pid-{rank}").read_text()), signal.SIGKILL)
                    self.stopped.append(rank)
            return


def _failures(error: Any) -> list[RankFailure]:
    failures = []
    for rank, failure in sorted(error.failures.items()):
        message = failure.message
        if isinstance(message, dict):  # the error file's structured form
            message = message.get("message", "")
        if failure.error_file_data.get("errorTraits") or not message:  # no error file: it only exited
            message = f"exited with code {failure.exitcode} before reporting an error"
        message = str(message).strip().removeprefix(f"{WorkerError.__name__}: ")
        failures.append(RankFailure(rank=int(rank), exitcode=int(failure.exitcode), message=str(message).strip()))
    # a rank that timed out waiting names the ranks that never arrived (RankNotAnswering): those hung,
    # and the agent then stopped them; they are the root cause, not the rank that gave up waiting
    for failure in list(failures):
        found = _NOT_ANSWERING.search(failure.message)
        if found is None:
            continue
        for rank in (int(number) for number in re.findall(r"(\d+)(?: \([^)]*\))?", found.group(1))):
            hung = next((f for f in failures if f.rank == rank), None)
            if hung is None:  # it never failed on its own: the agent stopped it with the others
                hung = RankFailure(rank=rank, exitcode=-signal.SIGTERM, message="")
                failures.append(hung)
            elif hung.killed_by != "SIGTERM":  # it ended with an error (or a kill) of its own: that is the cause
                continue
            hung.hung = (f"no answer within the timeout ({found.group(2)}); rank {failure.rank} stopped waiting "
                         "for it")
    # the root cause first: a rank that lost its peers failed because of another one
    failures.sort(key=lambda f: (f.hung is None, f.hung is None and (f.killed_by == "SIGTERM" or (
        f.killed_by is None and any(m in f.message for m in _PEER_LOST_MARKERS))), f.rank))
    return failures


def launch(entrypoint: Callable[..., Any], args: tuple = (), *, nprocs: int, start_method: str = "spawn",
           threads: int | None = None, quiet: bool = True) -> Any:
    """Run ``entrypoint(*args)`` in ``nprocs`` local worker processes; return rank 0's return value.

    Each worker finds ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set
    (:func:`workbench.quant.algorithms.distributed.init_from_env` joins the job from them). ``entrypoint`` must
    be importable by the workers (a module-level function) and its arguments picklable.

    Args:
        entrypoint: the job, run once per worker.
        args: its arguments.
        nprocs: how many workers (>= 1).
        start_method: ``"spawn"`` (default: safe with threads) or ``"forkserver"``/``"fork"``.
        threads: torch threads per worker; None: an equal share of the cores, unless
            ``OMP_NUM_THREADS`` is set.
        quiet: keep the elastic agent's informational log lines out of the output.

    Raises:
        ValueError: ``nprocs`` < 1.
        WorkerFailed: a worker raised, exited with an error or was killed; the others were stopped.
        JobInterrupted: Ctrl-C (or SIGTERM, SIGHUP) stopped the job; every worker was stopped.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"The number of workers must be a positive integer, got {nprocs!r}.")
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if threads is None and not os.environ.get("OMP_NUM_THREADS"):
        threads = worker_threads(nprocs)
    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    # torch's elastic modules give each of their loggers a level of its own (LOGLEVEL): a parent's level
    # does not reach them, so each one is quieted ("Received 2 death signal, shutting down workers")
    quieted = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.startswith(prefixes)] + [logging.getLogger(name) for name in prefixes]
    levels = [quiet_logger.level for quiet_logger in quieted]
    if quiet:
        for quiet_logger in quieted:
            quiet_logger.setLevel(logging.CRITICAL)  # WorkerFailed says what went wrong, once
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-launch-") as log_dir, \
                tempfile.TemporaryDirectory(prefix="workbench-ranks-") as ranks_dir:
            config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=uuid.uuid4().hex,
                                  rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                                  monitor_interval=0.1, start_method=start_method,
                                  logs_specs=DefaultLogsSpecs(log_dir=log_dir))
            watchdog = _Watchdog(ranks_dir, nprocs, timeout_from_env())
            watchdog.start()
            try:
                results = elastic_launch(config, _worker)(entrypoint, threads, ranks_dir, *args)
            except SignalException as error:  # the agent stopped the workers and re-raised the signal
                raise JobInterrupted(error.sigval) from None
            except ChildFailedError as error:
                failures = _failures(error)
                finished = Path(ranks_dir, "result-0.pkl")
                if watchdog.stopped and finished.exists() and {f.rank for f in failures} <= set(watchdog.stopped):
                    # the job's result was complete; only ranks that hung after it were stopped
                    logger.warning("rank%s %s did not finish within %g s of rank 0 and %s stopped; the job's "
                                   "result is complete.", "s" if len(watchdog.stopped) > 1 else "",
                                   ", ".join(map(str, watchdog.stopped)), watchdog.timeout_s,
                                   "were" if len(watchdog.stopped) > 1 else "was")
                    return pickle.loads(finished.read_bytes())  # our own file, written by our rank 0
                if failures and all(f.exitcode in (INTERRUPTED_EXIT, -signal.SIGINT) for f in failures):
                    raise JobInterrupted(signal.SIGINT) from None  # the workers saw Ctrl-C first
                raise WorkerFailed(failures, nprocs) from None
            finally:
                watchdog.finished.set()
    finally:
        for quiet_logger, level in zip(quieted, levels):
            quiet_logger.setLevel(level)
    return results[0]


@contextlib.contextmanager
def job_context(device: str | None = None) -> Iterator[DistContext]:
    """This process's place in the job: joined from the environment under torchrun or ``--workers``, else
    :data:`~workbench.quant.algorithms.distributed.SINGLE`. Ranks other than 0 log errors only (rank 0 speaks for
    the job); the process group is left on exit."""
    if not launched_by_torchrun():
        yield SINGLE
        return
    context = init_from_env(device)
    quieted = logging.getLogger("workbench")
    level = quieted.level
    if not context.is_main:
        quieted.setLevel(logging.ERROR)
    try:
        yield context
    finally:
        quieted.setLevel(level)
        context.close()
