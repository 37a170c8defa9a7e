"""Merging calibrators' statistics across the processes of a distributed calibration.

Each rank collects on its own share of the batches; :func:`merge_calibrators` then leaves every rank
holding the statistics one process would have collected on all the batches:

* :class:`MaxCalibrator`: the running max is an all-reduce MAX (per tensor or per channel): exact.
* :class:`HistogramCalibrator`: counts are an all-reduce SUM on a common grid, merged exactly.

Why no re-binning is ever needed: a histogram calibrator bins ``|x|`` on bins of width ``2**e``
starting at 0, where ``e`` is the smallest exponent whose ``2 * num_bins`` bins cover the largest
value seen (:func:`~workbench.quant.calib.histogram.width_exponent`). Bins of width ``2**E`` are unions
of ``2**(E - e)`` adjacent bins of width ``2**e``, so a rank's histogram coarsens to a wider grid by
summing neighbours (:func:`~workbench.quant.calib.histogram.merge_bins`), with no value moving to a
neighbouring bin. The ranks agree on the widest exponent (an all-reduce MAX), coarsen to it, and sum.
And since the exponent a histogram ends up with depends only on the largest value seen, the widest
rank's exponent is the one a single process would have reached: the merged histogram equals the
one-process histogram count for count, so entropy, mse and percentile give the same amax too. The
alternative (agreeing on the range before collecting) would need a pass over the data first, or
re-binning of counts onto edges that do not line up, which is not exact.

Sample, batch and NaN/Inf counts are summed, so warnings about thin histograms and non-finite values
read the same as for one process.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from workbench.quant.algorithms.distributed import DistContext
from workbench.quant.calib.calibrator import Calibrator
from workbench.quant.calib.histogram import HistogramCalibrator, merge_bins
from workbench.quant.calib.max import MaxCalibrator

__all__ = ["merge_calibrators", "CalibratorMergeError"]


class CalibratorMergeError(ValueError):
    """The ranks' calibrators cannot be merged (different models, calibrators or settings)."""


def _describe(calibrator: Calibrator) -> tuple:
    """What every rank must agree on about a calibrator, plus its counters (summed across ranks)."""
    counters = (calibrator.batches_seen, calibrator.values_seen, calibrator.nonfinite_count)
    if isinstance(calibrator, HistogramCalibrator):
        state = calibrator.state()
        return ("histogram", calibrator.num_bins, calibrator.skip_zeros, state["width_exponent"], counters)
    if isinstance(calibrator, MaxCalibrator):
        amax = calibrator.calib_amax
        return ("max", None if amax is None else tuple(amax.shape), None, None, counters)
    raise CalibratorMergeError(f"{type(calibrator).__name__} statistics cannot be merged across processes; "
                               "only MaxCalibrator and HistogramCalibrator can.")


def merge_calibrators(calibrators: Mapping[str, Calibrator], context: DistContext) -> None:
    """Merge the statistics of ``calibrators`` (by quantizer name) over all ranks of ``context``, in place.

    Every rank must call this with the same names (in the same order). Afterwards every rank's
    calibrators hold the statistics of all ranks' batches, as if one process had collected them all.
    Three collectives in all, whatever the number of quantizers: one gather of the descriptions, one
    MAX over every running max, one SUM over every histogram.

    Raises:
        CalibratorMergeError: the ranks disagree on names, calibrator kinds, bin counts or shapes.
        DistributedError: a collective failed (a peer died, or the timeout passed).
    """
    if not context.distributed:
        return
    names = list(calibrators)
    mine = [_describe(calibrators[name]) for name in names]
    everyone = context.all_gather((names, mine))
    for rank, (their_names, _) in enumerate(everyone):
        if their_names != names:
            raise CalibratorMergeError(f"rank {rank} calibrates other quantizers than rank {context.rank}: "
                                       "every rank must build the same model.")

    plan = []  # per calibrator: (kind, shape or width exponent, num_bins, summed counters); None if nobody collected
    for index, name in enumerate(names):
        descriptions = [described[index] for _, described in everyone]
        kinds = {d[0] for d in descriptions}
        if len(kinds) > 1:
            raise CalibratorMergeError(f"{name}: the ranks use different calibrators ({sorted(kinds)}).")
        kind = descriptions[0][0]
        counters = tuple(int(sum(d[4][k] for d in descriptions)) for k in range(3))
        if kind == "max":
            shapes = {d[1] for d in descriptions if d[1] is not None}
            if len(shapes) > 1:
                raise CalibratorMergeError(f"{name}: the ranks' per-channel max have different shapes "
                                           f"{sorted(shapes)}.")
            plan.append(("max", shapes.pop(), None, counters) if shapes else None)
        else:
            settings = {(d[1], d[2]) for d in descriptions}
            if len(settings) > 1:
                raise CalibratorMergeError(f"{name}: the ranks' histograms differ in bins or skip_zeros "
                                           f"({sorted(settings)}).")
            exponents = [d[3] for d in descriptions if d[3] is not None]
            # the widest grid: every other rank's bins are exact sub-bins of its bins
            plan.append(("histogram", max(exponents), descriptions[0][1], counters) if exponents else None)

    # one MAX over every running max (per-channel ones flattened) and every histogram's largest value
    pieces = []
    for name, item in zip(names, plan):
        if item is None:
            continue
        calibrator = calibrators[name]
        if item[0] == "max":
            amax = calibrator.calib_amax
            size = int(np.prod(item[1])) if item[1] else 1
            pieces.append(torch.zeros(size) if amax is None else amax.detach().float().cpu().reshape(-1))
        else:
            value = calibrator.max_value
            pieces.append(torch.zeros(1) if value is None else value.detach().float().cpu().reshape(1))
    maxima = context.all_reduce(torch.cat(pieces), "max") if pieces else torch.zeros(0)

    # one SUM over every histogram, each coarsened to the common grid
    histograms = []
    for name, item in zip(names, plan):
        if item is None or item[0] != "histogram":
            continue
        calibrator = calibrators[name]
        state = calibrator.state()
        stored = 2 * item[2]
        if state["counts"] is None:
            histograms.append(torch.zeros(stored, dtype=torch.int64))
        else:
            counts = torch.as_tensor(state["counts"], dtype=torch.int64)
            histograms.append(merge_bins(counts, 1 << (item[1] - state["width_exponent"])))
    summed = context.all_reduce(torch.cat(histograms), "sum") if histograms else torch.zeros(0, dtype=torch.int64)

    offset = hist_offset = 0
    for name, item in zip(names, plan):
        if item is None:
            continue
        calibrator = calibrators[name]
        batches, values, nonfinite = item[3]
        if item[0] == "max":
            size = int(np.prod(item[1])) if item[1] else 1
            amax = maxima[offset:offset + size].reshape(item[1]).numpy()
            offset += size
            calibrator.load_state({"kind": "max", "calib_amax": amax, "batches_seen": batches,
                                   "values_seen": values, "nonfinite_count": nonfinite})
        else:
            stored = 2 * item[2]
            counts = summed[hist_offset:hist_offset + stored].numpy()
            hist_offset += stored
            max_value = float(maxima[offset])
            offset += 1
            calibrator.load_state({"kind": "histogram", "num_bins": item[2], "width_exponent": item[1],
                                   "counts": counts, "max_value": max_value, "skip_zeros": calibrator.skip_zeros,
                                   "batches_seen": batches, "values_seen": values, "nonfinite_count": nonfinite})
