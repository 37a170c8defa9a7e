"""A saved project's job in N local worker processes, driven from a front end that must not block.

``workbench calibrate PROJECT --workers N`` runs the whole command in each worker. A front end that
holds an open session (the GUI) needs more around the launch, and this module is that part, free of
Qt: the project is saved first (the workers read it from its file), the job runs through
:func:`workbench.launcher.launch` while the caller's thread keeps reporting the progress summed over
all ranks and passing on a cancel, and the project is then read back from disk, where rank 0 wrote
it. A failed or cancelled job leaves the file exactly as it was: rank 0 writes only after every rank
has finished its share.

Rank 0 already sees the progress of every rank (:meth:`DistContext.progress` sums it in the
rendezvous store); it writes that sum to a small file in a folder the parent made, which the parent
polls. The same folder carries the cancel: the parent creates a file there, and every rank's cancel
token looks for it between batches, so all ranks stop at their next check.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workbench import bounded_json
from workbench.analysis import AnalysisCancelled
from workbench.launcher import WorkerFailed, job_context, launch
from workbench.plurals import count_text
from workbench.quant.algorithms.calibrate import CalibrationCancelled, CancelToken, ProgressCallback
from workbench.session.errors import SessionError

__all__ = ["WORKER_JOBS", "WorkersResult", "run_in_workers", "PROGRESS_FILE", "CANCEL_FILE"]

# the session's jobs that run in several processes (each takes a distributed ``context``)
WORKER_JOBS = ("calibrate", "sensitivity", "fallback")
PROGRESS_FILE = "progress.json"
CANCEL_FILE = "cancel"
_WRITE_EVERY_S = 0.1  # rank 0 rewrites the progress file at most this often (and always at the end)


class SavedSession(Protocol):
    """What running a job in workers needs of a :class:`~workbench.session.Session` (this module sits above the
    session's core and is handed its session, so it imports none): its file, whether it has unsaved changes,
    its trust, saving, and its class's ``open`` (each worker, and the caller afterwards, opens the file)."""

    path: Path | None
    dirty: bool
    trust_code: bool

    def save(self, path: str | Path | None = None) -> Path: ...

    @classmethod
    def open(cls, path: str | Path, *, trust_code: bool = False, remembered: bool = True) -> SavedSession: ...


@dataclass
class WorkersResult:
    """What the caller shows of a job that ran in worker processes.

    Attributes:
        job: the session method that ran (one of :data:`WORKER_JOBS`).
        world_size: how many processes took part.
        summary: the result's one-line summary, as rank 0 wrote it.
        warnings: the result's warnings (calibration).
        session: the project read back from its file after rank 0 saved it.
    """

    job: str
    world_size: int
    summary: str
    warnings: list[str] = field(default_factory=list)
    session: SavedSession | None = None


class _ProgressWriter:
    """Rank 0's progress callback: the summed progress, written atomically to the progress file."""

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / PROGRESS_FILE
        self._last = 0.0
        self._pending: tuple[int, int, str] | None = None

    def __call__(self, done: int, total: int, message: str) -> None:
        self._pending = (int(done), int(total or 0), str(message))
        now = time.monotonic()
        if now - self._last >= _WRITE_EVERY_S or (total and done >= total):
            self._last = now
            self.flush()

    def flush(self) -> None:
        """Write the latest progress (the job's last step may have come too soon after the one before)."""
        if self._pending is None:
            return
        done, total, message = self._pending
        self._pending = None
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps({"done": done, "total": total, "message": message}))
        os.replace(partial, self.path)  # the parent never reads half a file


class _CancelFile:
    """Every rank's cancel token: set once the parent has created the cancel file."""

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / CANCEL_FILE

    def is_set(self) -> bool:
        return self.path.exists()


def _worker(kind: type[SavedSession], path: str, job: str, options: dict[str, Any], trust_code: bool,
            folder: str) -> dict[str, Any] | None:
    """One worker process: open the saved project (a session of class ``kind``), run its share of ``job``;
    rank 0 saves and reports."""
    session = kind.open(path, trust_code=trust_code)
    with job_context(str(session.device)) as context:
        report = _ProgressWriter(folder) if context.is_main else None
        result = getattr(session, job)(progress=report, cancel=_CancelFile(folder), context=context, **options)
        if report is not None:
            report.flush()
        context.all_gather(True)  # every rank is done before rank 0 writes: a late failure changes nothing
        if not context.is_main:
            return None
        session.save()
        return {"summary": result.summary(), "warnings": [str(w) for w in getattr(result, "warnings", ())],
                "world_size": context.world_size}


def _read_progress(folder: Path) -> tuple[int, int, str] | None:
    try:
        data = bounded_json.read_json_file(folder / PROGRESS_FILE)
    except (OSError, ValueError):  # not written yet
        return None
    return int(data["done"]), int(data["total"]), str(data["message"])


def run_in_workers(session: SavedSession, job: str, nprocs: int, options: dict[str, Any] | None = None, *,
                   save: bool = False, progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                   poll_s: float = 0.2) -> WorkersResult:
    """Run ``session.<job>(**options)`` in ``nprocs`` local processes on the session's project file.

    The caller's thread waits for the job, calling ``progress(done, total, message)`` with the sum over
    all ranks, and passes ``cancel`` on to every rank. The returned result holds the project read back
    from disk (``result.session``): the caller uses it in place of ``session``.

    Args:
        session: an open session with a file; with unsaved changes only when ``save`` is True.
        job: one of :data:`WORKER_JOBS`.
        nprocs: how many worker processes (the GPUs of this machine, say).
        options: the job's keyword arguments (picklable: a metric by name, not a Metric object).
        save: save unsaved changes first (a front end asks the user before passing True).
        progress: called from the caller's thread while the job runs.
        cancel: when set, every rank stops at its next check and :class:`CalibrationCancelled` or
            :class:`AnalysisCancelled` is raised; the project file is unchanged.
        poll_s: how often the progress and the cancel are looked at.

    Raises:
        SessionError: the project was never saved, has unsaved changes (and ``save`` is False), or
            ``job`` cannot run in several processes; or a worker failed: the message names its rank
            and error, the cause is the launcher's :class:`~workbench.launcher.WorkerFailed` (``.rank``,
            ``.failures``), and the project file is unchanged.
    """
    if job not in WORKER_JOBS:
        raise SessionError(f"{job!r} does not run in several processes; only {', '.join(WORKER_JOBS)} do.")
    if session.path is None:
        raise SessionError("The project has never been saved: save it first, the worker processes read it "
                           "from its file.")
    if session.dirty:
        if not save:
            raise SessionError(f"{Path(session.path).name} has unsaved changes: save them first, the worker "
                               "processes read the project from its file.")
        session.save()
    path = Path(session.path)
    with tempfile.TemporaryDirectory(prefix="workbench-workers-") as folder:
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = launch(_worker, (type(session), str(path), job, dict(options or {}),
                                                    session.trust_code, folder), nprocs=nprocs)
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread below
                outcome["error"] = error

        if progress is not None:
            progress(0, 0, f"starting {count_text(nprocs, 'worker process', 'worker processes')}")
        launcher = threading.Thread(target=run, name="workbench-launcher", daemon=True)
        launcher.start()
        shown = None
        while launcher.is_alive():
            launcher.join(poll_s)
            if cancel is not None and cancel.is_set():
                (Path(folder) / CANCEL_FILE).touch()
            current = _read_progress(Path(folder))
            if progress is not None and current is not None and current != shown:
                progress(*current)
                shown = current
        cancelled = cancel is not None and cancel.is_set()
    error = outcome.get("error")
    if isinstance(error, WorkerFailed):
        if cancelled:
            kind = CalibrationCancelled if job == "calibrate" else AnalysisCancelled
            raise kind(f"{job} in {nprocs} processes cancelled; the project was not changed.") from None
        raise SessionError(f"{error} The project file was not changed.") from error
    if error is not None:
        raise error
    value = outcome["value"]
    reopened = type(session).open(path, trust_code=session.trust_code)
    return WorkersResult(job=job, world_size=int(value["world_size"]), summary=str(value["summary"]),
                         warnings=list(value["warnings"]), session=reopened)
