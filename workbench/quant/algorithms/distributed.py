"""Where a job runs among several processes: rank, world size, device, and the collectives it uses.

A job launched by ``torchrun`` (or by :mod:`workbench.launcher`) finds ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK`` in its environment; :func:`init_from_env` joins the process group (gloo on CPU, nccl
when every rank has its own GPU, ``LOCAL_RANK`` picking it) with a timeout on every collective, so a
rank that dies never leaves the others waiting forever. A single process gets :data:`SINGLE`, and
every helper here is then a no-op, so the jobs keep one code path.

Progress from all ranks goes through the rendezvous key-value store (an atomic ``add`` per step), not
through collectives: ranks do different amounts of work, and a collective per step would make the
fastest wait for the slowest at every batch.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

__all__ = ["DistContext", "SINGLE", "init_from_env", "launched_by_torchrun", "shard", "deal", "DEFAULT_TIMEOUT_S",
           "TIMEOUT_ENV", "DistributedError", "RanksDisagree", "RankNotAnswering", "Digest"]

T = TypeVar("T")

# Every collective gives up after this long (seconds); WORKBENCH_DIST_TIMEOUT overrides it.
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "WORKBENCH_DIST_TIMEOUT"
ProgressCallback = Callable[[int, int, str], None]


class DistributedError(RuntimeError):
    """A distributed job cannot start or a collective failed (a peer died, or it timed out)."""


class RankNotAnswering(DistributedError):
    """A collective timed out and these ranks never reached it (hung or lost); the message names them.

    Attributes:
        ranks: the ranks that did not answer.
    """

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = list(ranks)


class RanksDisagree(DistributedError, ValueError):
    """The ranks of a job do not hold the same data or settings: merging their results would mix two jobs.
    A ValueError too: it is the user's set-up to fix (exit code 2), not an internal error.

    Attributes:
        part: what differs ("data", "settings", "model").
        groups: the ranks grouped by the digest they hold, largest group first.
    """

    def __init__(self, job: str, part: str, groups: list[list[int]], digests: list[str]) -> None:
        self.part, self.groups = part, groups
        described = "; ".join(f"rank{'s' if len(g) > 1 else ''} {', '.join(map(str, g))}: {d[:12]}"
                              for g, d in zip(groups, digests))
        super().__init__(f"The ranks of this {job} do not have the same {part} ({described}); nothing was merged "
                         "and the project was not changed. Give every rank (every node) the same project, model "
                         "and data files.")


class Digest:
    """A running digest of what a rank works on: tensors (dtype, shape and bytes), numbers, strings,
    and tuples, lists and dicts of them. Ranks compare digests before they merge (:meth:`DistContext.check_same`)."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=20)

    def update(self, value: Any) -> Digest:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to("cpu").contiguous()
            self._hash.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
            self._hash.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        elif isinstance(value, dict):
            self._hash.update(b"{")
            for key in sorted(value, key=str):
                self.update(str(key)).update(value[key])
            self._hash.update(b"}")
        elif isinstance(value, (tuple, list)):
            self._hash.update(b"[")
            for item in value:
                self.update(item)
            self._hash.update(b"]")
        else:
            self._hash.update(f"{type(value).__name__}:{value!r};".encode())
        return self

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@dataclass
class DistContext:
    """One process's place in a job.

    Attributes:
        rank: this process's index, 0 to ``world_size - 1``. Rank 0 reports and writes.
        world_size: how many processes take part.
        local_rank: index among the processes on this machine (picks the GPU).
        device: where this rank runs the model.
        backend: ``"gloo"``, ``"nccl"``, or ``""`` for a single process.
        timeout_s: how long a collective waits for the others.
        store: the rendezvous key-value store (progress counters), None without one.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = None
    backend: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    store: Any = None
    _progress_keys: int = 0
    _collectives: int = 0  # every rank calls the same collectives in the same order: the count names each one

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that reports progress, returns the merged result and writes files."""
        return self.rank == 0

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        arrival = self._arrive()
        try:
            dist.all_gather_object(gathered, value)
        except Exception as error:  # a peer died or the timeout passed: say so in our terms
            self._raise_absent(arrival, "gathering results", error)
            raise DistributedError(f"rank {self.rank}: gathering results from the other ranks failed "
                                   f"({type(error).__name__}: {error})") from error
        return gathered

    def all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """``tensor`` reduced in place over all ranks with ``op`` (``"max"`` or ``"sum"``), on the backend's device."""
        if not self.distributed:
            return tensor
        reduce_op = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}[op]
        work = tensor.to(self.collective_device)
        arrival = self._arrive()
        try:
            dist.all_reduce(work, op=reduce_op)
        except Exception as error:
            self._raise_absent(arrival, f"the all-reduce ({op})", error)
            raise DistributedError(f"rank {self.rank}: all-reduce ({op}) with the other ranks failed "
                                   f"({type(error).__name__}: {error})") from error
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    def check_same(self, parts: dict[str, str], job: str) -> None:
        """Compare every rank's digests of its data, settings and model (``{part: digest}``) before a merge.

        Raises:
            RanksDisagree: some rank holds another digest for a part; the message groups the ranks by digest.
        """
        if not self.distributed:
            return
        gathered = self.all_gather(dict(parts))
        for part in parts:
            by_digest: dict[str, list[int]] = {}
            for rank, theirs in enumerate(gathered):
                by_digest.setdefault(str(theirs.get(part)), []).append(rank)
            if len(by_digest) > 1:
                ordered = sorted(by_digest.items(), key=lambda item: (-len(item[1]), item[1]))
                raise RanksDisagree(job, part, [ranks for _, ranks in ordered], [d for d, _ in ordered])

    # ----- which rank did not answer -------------------------------------------------------------

    def _arrive(self) -> str | None:
        """Mark in the store that this rank reached the next collective; the key's prefix, or None."""
        self._collectives += 1
        if self.store is None:
            return None
        prefix = f"workbench/arrived/{self._collectives}"
        try:
            self.store.set(f"{prefix}/{self.rank}", socket.gethostname())
        except Exception:  # the store is gone (its host died): the collective's own error says enough
            return None
        return prefix

    def _raise_absent(self, prefix: str | None, step: str, error: BaseException) -> None:
        """After a failed collective: raise :class:`RankNotAnswering` naming the ranks that never reached it."""
        text = f"{error} {error.__cause__ or ''}".lower()
        if prefix is None or self.store is None or not ("timed out" in text or "timeout" in text):
            return  # a peer that died closes its connections at once: the launcher reports its death
        try:
            absent = [r for r in range(self.world_size) if not self.store.check([f"{prefix}/{r}"])]
            hosts = {r: self.store.get(f"workbench/hosts/{r}").decode() for r in absent
                     if self.store.check([f"workbench/hosts/{r}"])}
        except Exception:  # the store is unreachable too: nothing more can be learned
            return
        if not absent:
            return
        here = socket.gethostname()
        named = ", ".join(f"{r}" + (f" (on {hosts[r]})" if hosts.get(r, here) != here else "") for r in absent)
        many = len(absent) > 1
        raise RankNotAnswering(
            f"rank{'s' if many else ''} {named} did not answer within {self.timeout_s:g} s: "
            f"{'they' if many else 'it'} never reached {step} (hung, or lost with {'their' if many else 'its'} "
            f"node); rank {self.rank} stopped waiting ({type(error).__name__})", absent) from error

    @property
    def collective_device(self) -> torch.device:
        """nccl reduces on the GPU, gloo on the CPU."""
        if self.backend == "nccl" and self.device is not None:
            return self.device
        return torch.device("cpu")

    # ----- progress -----------------------------------------------------------------------------

    def progress(self, callback: ProgressCallback | None, steps: int, label: str, *, offset: int = 0,
                 total: int | None = None) -> ProgressCallback | None:
        """A progress callback for this rank's share of ``steps`` steps shared by all ranks.

        Each rank counts its own steps in the store (call it as ``report(done_here, _, message)``);
        rank 0 calls ``callback(offset + steps done by all ranks, total, message)``, other ranks never
        call ``callback``. ``total`` defaults to ``offset + steps``. Single process: ``callback`` itself.
        """
        if not self.distributed:
            return callback
        self._progress_keys += 1
        return _RankProgress(self, callback, f"{label}/{self._progress_keys}", steps, offset,
                             offset + steps if total is None else total)

    def main_only(self, callback: ProgressCallback | None) -> ProgressCallback | None:
        """``callback`` on rank 0, None elsewhere: only rank 0 reports."""
        return callback if self.is_main else None

    def wait_for_peers(self, report: ProgressCallback | None, message: str, poll_s: float = 0.2) -> None:
        """Say this rank's share is done; on rank 0, keep reporting the summed progress until every rank
        has said so (or the timeout passes; the collective that follows then fails on its own).

        Rank 0 often finishes its share first; without this its progress bar would stall until the
        final gather. Call it on every rank after its share (a no-op for a single process).
        """
        if not isinstance(report, _RankProgress) or self.store is None:
            return
        finished = int(self.store.add(report.finished_key, 1))
        if not self.is_main or report.callback is None:
            return
        deadline = time.monotonic() + self.timeout_s
        last = -1
        while True:
            summed = report.summed()
            if summed != last:
                report.callback(report.offset + summed, report.total, f"{message} ({self.world_size} processes)")
                last = summed
            if finished >= self.world_size or time.monotonic() > deadline:
                return
            time.sleep(poll_s)
            finished = int(self.store.add(report.finished_key, 0))

    def close(self) -> None:
        """Leave the process group (if this context joined one)."""
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


SINGLE = DistContext()


class _RankProgress:
    """A rank's progress callback: counts its steps in the store; rank 0 reports the sum."""

    def __init__(self, context: DistContext, callback: ProgressCallback | None, key: str, steps: int, offset: int,
                 total: int) -> None:
        self.context, self.callback, self.key = context, callback, f"workbench/progress/{key}"
        self.finished_key = f"{self.key}/finished"
        self.steps, self.offset, self.total = steps, offset, total
        self._local = 0

    def summed(self, step: int = 0) -> int:
        store = self.context.store
        return int(store.add(self.key, step)) if store is not None else self._local

    def __call__(self, done: int, _total: int, message: str) -> None:
        step, self._local = done - self._local, done
        summed = self.summed(step)
        if self.context.is_main and self.callback is not None:
            self.callback(self.offset + summed, self.total, f"{message} ({self.context.world_size} processes)")


def shard(items: Sequence[T], context: DistContext) -> list[T]:
    """This rank's share of ``items``: indices ``rank, rank + world_size, ...`` (round robin).

    Round robin rather than contiguous blocks: neighbouring items cost about the same (batches of one
    loader, layers at similar depths), so every rank gets a similar load.
    """
    return list(items[context.rank::context.world_size])


def deal(count: int, context: DistContext) -> list[int]:
    """This rank's share of ``count`` tasks whose cost falls (or rises) steadily with their index.

    Dealt back and forth (0, 1, 1, 0, 0, 1, ... for two ranks), so that each rank's share of a linear
    cost profile is the same to within one task; round robin would give rank 0 the costlier task of
    every round. Sensitivity units are such tasks: with cached activations, a unit near the input
    costs a nearly full pass, one near the output almost nothing.
    """
    size = context.world_size
    return [i for i in range(count) if (i % size if (i // size) % 2 == 0 else size - 1 - i % size) == context.rank]


def launched_by_torchrun() -> bool:
    """Whether the environment describes a process of a multi-process job (``WORLD_SIZE`` > 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise DistributedError(f"{name} is not set: start the job with torchrun or --workers.")
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name} must be an integer, got {value!r}.") from None


def timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise DistributedError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}.") from None
    if not value > 0:
        raise DistributedError(f"{TIMEOUT_ENV} must be positive, got {text!r}.")
    return value


def init_from_env(device: str | None = None, timeout_s: float | None = None) -> DistContext:
    """Join the job described by the environment, or return :data:`SINGLE` for a single process.

    Backend: nccl when CUDA is available, ``device`` does not ask for the CPU and every local rank
    has its own GPU; gloo otherwise. The GPU is ``cuda:LOCAL_RANK``.

    Raises:
        DistributedError: a malformed environment, or the rendezvous failed (within the timeout).
    """
    if not launched_by_torchrun():
        return SINGLE
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)) or world_size)
    timeout_s = timeout_s if timeout_s is not None else timeout_from_env()
    wants_cpu = device is not None and torch.device(device).type == "cpu"
    if not wants_cpu and torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        backend, run_device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(run_device)
    else:
        backend, run_device = "gloo", torch.device("cpu") if device is None or wants_cpu else torch.device(device)
    timeout = timedelta(seconds=timeout_s)
    if dist.is_initialized():
        raise DistributedError("A process group is already initialised in this process; a workbench job "
                               "joins its own.")
    try:
        # our own rendezvous, so that the store it returns can also carry the progress counters
        store, rank, world_size = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
        jobs_store = dist.PrefixStore("workbench/jobs", store)
        # so that a rank that stops answering can be named with its machine (multi-node jobs)
        jobs_store.set(f"workbench/hosts/{rank}", socket.gethostname())
        # every rank says it is here before the process group forms: one that hangs while starting is named,
        # where the process group's own timeout only lists its internal store keys
        _join_barrier(jobs_store, rank, world_size, timeout_s)
        dist.init_process_group(backend, store=dist.PrefixStore("workbench/pg", store), rank=rank,
                                world_size=world_size, timeout=timeout)
    except RankNotAnswering:
        raise
    except Exception as error:
        raise DistributedError(f"rank {rank}: could not join the {world_size}-process job "
                               f"({type(error).__name__}: {error})") from error
    logger.info("rank %d of %d on %s (%s)", rank, world_size, run_device, backend)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=run_device, backend=backend,
                       timeout_s=timeout_s, store=jobs_store)


def _join_barrier(store: Any, rank: int, world_size: int, timeout_s: float) -> None:
    """Mark this rank as joining and wait (``timeout_s`` at most) until every rank has.

    Raises:
        RankNotAnswering: the ranks that never joined, with their machine where it is known (a rank that
            never reached the store has told nobody its host; its torchrun node index is given instead).
    """
    store.set(f"workbench/joining/{rank}", socket.gethostname())
    keys = [f"workbench/joining/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
        return
    except Exception as error:  # noqa: BLE001 - a timeout (DistStoreError), or the store's host went away
        try:
            absent = [r for r in range(world_size) if not store.check([keys[r]])]
            hosts = {r: store.get(f"workbench/hosts/{r}").decode() for r in absent
                     if store.check([f"workbench/hosts/{r}"])}
        except Exception:  # noqa: BLE001 - the store is gone: the generic message says what is known
            raise DistributedError(f"rank {rank}: could not join the {world_size}-process job (the rendezvous "
                                   f"store stopped answering: {type(error).__name__}: {error})") from error
        if not absent:
            raise DistributedError(f"rank {rank}: could not join the {world_size}-process job "
                                   f"({type(error).__name__}: {error})") from error
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    here = socket.gethostname()

    def where(r: int) -> str:
        if r in hosts:
            return f" (on {hosts[r]})" if hosts[r] != here else ""
        return f" (node {r // local} of {nodes})" if nodes > 1 and local > 0 else ""

    named = ", ".join(f"{r}{where(r)}" for r in absent)
    many = len(absent) > 1
    raise RankNotAnswering(
        f"rank{'s' if many else ''} {named} did not answer within {timeout_s:g} s: {'they' if many else 'it'} "
        f"never joined the {world_size}-process job (hung or stopped while starting, or lost with "
        f"{'their' if many else 'its'} node); rank {rank} stopped waiting", absent)
