"""Sequential calibration split over the ranks of a distributed job (issue 37 point 5: scale out by splitting,
not copying).

The ranks split the *batches*, and each walks the blocks on its share, one block's weights resident at a time
(:mod:`workbench.quant.algorithms.sequential`): no rank ever holds the whole model, and the job needs no pipeline.
Rank ``r`` of ``N`` runs batches ``r, r + N, ...`` (round robin, as :func:`~workbench.quant.algorithms.calibrate.
calibrate` deals them); before each block's amax is computed (while its weights are still in memory) the ranks merge
that block's calibrators (:func:`~workbench.quant.algorithms.merge.merge_calibrators`: running max by an all-reduce
MAX, histograms summed on a common grid), so every rank computes the amax one process computes on all the batches,
bit for bit, and refines its INT4 weight blocks on the same numbers. The modules outside the blocks merge the same
way after the tail pass.

Why batches and not blocks: splitting the blocks (a pipeline, rank ``r`` holding blocks of its share and passing
activations on) keeps the ranks waiting on each other block after block and needs activations sent between ranks;
splitting the batches runs every rank all the time, and a block's weights cost one read per rank (from the page
cache after the first). Memory per rank: one block, the modules outside the blocks, and its share of the
activations.

:class:`RankShare` is what the sequential walk asks of the job: its batches, the global index of a batch (errors and
warnings name batches by their place among all of them), the merges, and sums over the ranks. For a single process
(:data:`~workbench.quant.algorithms.distributed.SINGLE`) each of them is the identity.
"""
from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from workbench.quant.algorithms.block_walk import NO_BATCHES
from workbench.quant.algorithms.calibration_collect import dealt, settings_digest
from workbench.quant.algorithms.distributed import SINGLE, Digest, DistContext
from workbench.quant.algorithms.merge import merge_calibrators
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["RankShare"]

_JOB = "sequential calibration"


class RankShare:
    """This process's share of a sequential calibration (see the module's docstring).

    Args:
        context: the process's place in the job (None: one process).
    """

    def __init__(self, context: DistContext | None = None) -> None:
        self.context = context or SINGLE
        self._data = Digest()  # every batch, whichever rank runs it: ranks with other data refuse to merge

    @property
    def distributed(self) -> bool:
        return self.context.distributed

    def deal(self, batches: Iterable, num_batches: int | None) -> tuple[Iterable, int | None]:
        """This rank's batches among the first ``num_batches``, and how many of them to run (None: all dealt)."""
        if not self.distributed:
            return batches, num_batches
        return dealt(batches, num_batches, self.context, self._data), None

    def index(self, local: int) -> int:
        """The place among all the batches of this rank's ``local``-th batch."""
        return self.context.rank + local * self.context.world_size

    def first(self, count: int, done: int) -> list[tuple[int, int]]:
        """``(local, global)`` indices of this rank's batches among the first ``count`` of all (auto's measurement
        runs on those, summed over the ranks, as one process runs it on its first ``count``)."""
        return [(local, self.index(local)) for local in range(done) if self.index(local) < count]

    def joined(self, done: int, mostly_nonfinite: list[int], calibrating: dict[str, TensorQuantizer], method: str,
               percentile: float) -> tuple[int, list[int]]:
        """After the capture pass: check the ranks run the same job (data and settings), and return the batches
        run by all ranks and (global indices) those mostly NaN/Inf.

        Raises:
            RanksDisagree: a rank holds other data or settings.
            ValueError: no rank had a batch.
        """
        if self.distributed:
            gathered = self.context.all_gather((done, list(mostly_nonfinite)))
            done = sum(count for count, _ in gathered)
            mostly_nonfinite = sorted(index for _, flagged in gathered for index in flagged)
            self.context.check_same({"calibration data": self._data.hexdigest(),
                                     "calibration settings": settings_digest(calibrating, method, percentile, done)},
                                    _JOB)
        if done == 0:
            raise ValueError(NO_BATCHES)
        return done, mostly_nonfinite

    def merge(self, quantizers: dict[str, TensorQuantizer], module: nn.Module | None) -> None:
        """Before the amax of ``quantizers`` (those of ``module``, whose weights are in memory now): check every rank
        holds the same weights of ``module``, and leave each rank's calibrators with all ranks' statistics.

        Raises:
            RanksDisagree: a rank holds other weights for ``module``.
            CalibratorMergeError: the ranks' calibrators differ.
        """
        if not self.distributed or not quantizers:
            return
        if module is not None:
            weights = Digest().update({name: p for name, p in module.named_parameters() if not p.is_meta})
            self.context.check_same({"model weights": weights.hexdigest()}, _JOB)
        merge_calibrators({name: q.calibrator for name, q in quantizers.items()}, self.context)

    def summed(self, *values: float) -> tuple[float, ...]:
        """``values`` summed over the ranks (the output SQNR's signal, noise and batch count)."""
        if not self.distributed:
            return values
        gathered = self.context.all_gather(tuple(values))
        return tuple(sum(part[i] for part in gathered) for i in range(len(values)))
