"""Calibration as a job: feed sample batches through a model and set every quantizer's amax.

:func:`calibrate` is what the reference scripts' ``collect_stats`` + ``compute_amax`` do, made safe to
run from a GUI worker thread: progress per batch, cancel between batches, and on cancel or error the
model's quantizers are left exactly as they were (state_dict, enable flags, collected statistics).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from workbench.quant.algorithms.auto_method import MethodChoice, choose_methods
from workbench.quant.algorithms.batches import flat_tensors, model_device, model_inputs, run_model, sqnr_db, sqnr_powers  # noqa: F401
from workbench.quant.algorithms.blocks import DEFAULT_BLOCK_METHOD, refine_block_amax
from workbench.quant.calib import PERCENTILE, AmaxMethod, HistogramCalibrator, MaxCalibrator
from workbench.quant.calib.checks import CalibrationWarning, histogram_warnings
from workbench.quant.calib.max import extremes
from workbench.quant.calib.memory import abs_max_in_place
from workbench.quant.calib.merge import merge_calibrators
from workbench.quant.algorithms.distributed import SINGLE, Digest, DistContext
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.algorithms.snapshot import ModelSnapshot

logger = logging.getLogger(__name__)

__all__ = ["calibrate", "CalibrationResult", "QuantizerCalibration", "CalibrationCancelled", "CalibrationError",
           "NonFiniteCalibrationError", "NothingReachedError", "AmaxError", "AUTO_BATCHES", "REPLAY_BYTES",
           "CancelToken", "ProgressCallback", "model_inputs", "run_model", "sqnr_db", "model_device"]

ProgressCallback = Callable[[int, int, str], None]


class CancelToken(Protocol):
    """Anything with ``is_set()``, such as :class:`threading.Event`."""

    def is_set(self) -> bool: ...


class CalibrationCancelled(Exception):
    """The run was cancelled; the model is as it was before the call."""


class CalibrationError(RuntimeError):
    """The model failed on a batch; the model is as it was before the call.

    Attributes:
        batch_index: 0-based index of the batch that failed.
        original: the exception the model raised.
    """

    def __init__(self, batch_index: int, original: BaseException) -> None:
        self.batch_index = batch_index
        self.original = original
        super().__init__(f"The model failed on calibration batch {batch_index}: "
                         f"{type(original).__name__}: {original}")


class NothingReachedError(ValueError):
    """The model ran on the calibration data without calling any quantizer that calibrates: nothing can be
    learned, and an empty result must not replace a good calibration. The model is unchanged.

    Attributes:
        names: the quantizers that were waiting for data.
        batches: how many batches ran.
    """

    def __init__(self, names: list[str], batches: int) -> None:
        self.names, self.batches = list(names), batches
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        super().__init__(f"Calibration reached no quantizer: the model ran on {batches} batch"
                         f"{'es' if batches != 1 else ''} without calling any of its {len(names)} quantizers "
                         f"({shown}). Nothing was changed (the previous calibration, if any, is kept). Check that "
                         "the model's forward goes through its quantized layers for this data (a fused fast path, a "
                         "branch on the input, or a different model than the one the layers were chosen on skips "
                         "them).")


class NonFiniteCalibrationError(ValueError):
    """Some quantizers saw no finite value (all NaN/Inf): no amax can be set. The model is unchanged.

    Attributes:
        names: the quantizers that saw no finite value.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        super().__init__(f"Calibration saw no finite value at {shown}: every value that reached "
                         f"{'it' if len(names) == 1 else 'them'} was NaN or Inf, so no range can be set. Check the "
                         "calibration data (or the model's output of the layers before) for NaN/Inf; nothing was "
                         "changed.")


class AmaxError(ValueError):
    """A quantizer's amax could not be computed by the method (e.g. entropy on a histogram with fewer bins than
    its start bin). The model is unchanged.

    Attributes:
        quantizer: the quantizer's name.
        method: the amax method that failed.
    """

    def __init__(self, quantizer: str, method: str, original: Exception) -> None:
        self.quantizer = quantizer
        self.method = method
        super().__init__(f"{quantizer}: the {method} amax cannot be computed: {original} Calibrate this quantizer "
                         f"with another method (max or percentile), or with more data; nothing was changed.")


@dataclass
class QuantizerCalibration:
    """What calibration found for one quantizer."""

    name: str
    amax: torch.Tensor  # on the CPU; the quantizer's own copy lives on the model's device
    method: str
    calibrator: str
    batches: int
    num_samples: int
    nonfinite_count: int
    max_value: float | None = None  # largest finite |x| seen
    choice: MethodChoice | None = None  # how "auto" picked ``method`` (None: the method was given)
    warnings: list[CalibrationWarning] = field(default_factory=list)  # about this quantizer's amax

    @property
    def amax_summary(self) -> str:
        if self.amax.numel() == 1:
            return f"{float(self.amax):.4g}"
        return f"[{float(self.amax.min()):.4g}, {float(self.amax.max()):.4g}] ({self.amax.numel()} channels)"


@dataclass
class CalibrationResult:
    """Everything a calibration run produced, by quantizer name."""

    quantizers: dict[str, QuantizerCalibration]
    method: str
    percentile: float
    num_batches: int
    wall_time_s: float
    device: str
    unused: list[str] = field(default_factory=list)  # quantizers no batch reached; left unchanged
    output_sqnr_db: float | None = None  # model output, INT8 vs FP32, pooled over ``sqnr_batches`` batches
    warnings: list[str] = field(default_factory=list)  # amax values that look collapsed, thin histograms
    collect_time_s: float = 0.0  # the passes over the data
    amax_time_s: float = 0.0  # computing amax from the statistics
    sqnr_batches: int = 0  # the batches the output SQNR covers (all of them, unless too big to keep)
    auto_time_s: float = 0.0  # measuring the candidates of "auto"
    quantized_as: str = "INT8"  # what the quantized model runs in, for "output SQNR <this> vs FP32" (a mix: FP8+INT4 W)

    @property
    def nonfinite_total(self) -> int:
        return sum(q.nonfinite_count for q in self.quantizers.values())

    def summary(self) -> str:
        parts = [f"{len(self.quantizers)} quantizers calibrated ({self.method}) on {self.num_batches} batches "
                 f"in {self.wall_time_s:.2f} s"]
        if self.output_sqnr_db is not None:
            over = (f"all {self.num_batches} batches" if self.sqnr_batches == self.num_batches
                    else f"{self.sqnr_batches} of {self.num_batches} batches")
            parts.append(f"output SQNR {self.quantized_as} vs FP32 {self.output_sqnr_db:.1f} dB over {over}")
        picked = self.picked_methods()
        if picked:
            parts.append("auto picked " + ", ".join(f"{m} for {n}" for m, n in picked.items()))
        if self.nonfinite_total:
            parts.append(f"{self.nonfinite_total} NaN/Inf values left out")
        if self.unused:
            parts.append(f"{len(self.unused)} quantizers never reached: {', '.join(self.unused[:5])}")
        if self.warnings:
            parts.append(f"{len(self.warnings)} warnings")
        return "; ".join(parts)

    def picked_methods(self) -> dict[str, int]:
        """How many quantizers "auto" gave each method (empty when no method was chosen by auto)."""
        counts: dict[str, int] = {}
        for item in self.quantizers.values():
            if item.choice is not None:
                counts[item.method] = counts.get(item.method, 0) + 1
        return dict(sorted(counts.items(), key=lambda pair: -pair[1]))

    def quantizer_warnings(self) -> list[CalibrationWarning]:
        """The warnings that name one quantizer, in calibration order."""
        return [warning for item in self.quantizers.values() for warning in item.warnings]


# "auto" measures its candidates on at most this many calibration batches (per process).
AUTO_BATCHES = 4
# The batches a run keeps to run again (auto's measurement, the output SQNR) take at most this many bytes;
# beyond, the SQNR covers the batches kept and says so.
REPLAY_BYTES = 1 << 30


def calibrate(model: nn.Module, batches: Iterable, *, num_batches: int | None, method: str,
              percentile: float = PERCENTILE.default, device: torch.device | str | None = None,
              progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
              report_sqnr: bool = True, context: DistContext | None = None,
              block_method: str = DEFAULT_BLOCK_METHOD) -> CalibrationResult:
    """Calibrate every enabled quantizer of ``model`` on ``batches``.

    Quantizers with a calibrator collect statistics with quantization off; the others are bypassed
    meanwhile. Calibrators start empty. Batches run in eval mode under ``torch.no_grad()``. Then Max
    calibrators load their running max and histogram calibrators load ``method``; amax goes to the
    model's device and every quantizer gets its flags back. Disabled quantizers are left alone.

    Args:
        model: a model containing TensorQuantizers.
        batches: an iterable of batches (see :func:`model_inputs`).
        num_batches: stop after this many batches (None: all of them).
        method: ``"entropy"``, ``"mse"``, ``"percentile"`` or ``"max"`` for histogram calibrators, or
            ``"auto"``: per quantizer, the one of those whose layer output is closest to FP32 on the first
            :data:`AUTO_BATCHES` calibration batches (:mod:`workbench.quant.algorithms.auto_method`).
        percentile: for ``method="percentile"``.
        block_method: amax of blockwise (INT4) weight blocks: ``"max"`` or ``"mse"`` (a search per block,
            :func:`workbench.quant.algorithms.blocks.refine_block_amax`).
        device: where to run; the model is moved there (and back if the run fails). Default: the
            model's current device.
        progress: called as ``progress(done, total, message)`` after each batch (total is 0 when
            unknown).
        cancel: checked before each batch; when set, :class:`CalibrationCancelled` is raised.
        report_sqnr: also run the calibration batches with and without quantization and report the output
            SQNR pooled over all of them (two extra forward passes per batch), so that a collapsed amax is
            visible.
        context: the process's place in a distributed job (None: one process). Rank ``r`` of ``N``
            runs batches ``r, r + N, ...`` of the same first ``num_batches``, the statistics are
            merged across ranks (:func:`~workbench.quant.calib.merge.merge_calibrators`), and every
            rank ends with the amax one process would have found; rank 0 reports progress summed
            over the ranks; the output SQNR and auto's measurements are summed over the ranks.

    Returns:
        A :class:`CalibrationResult`: each calibrated quantizer's amax, method and statistics, the quantizers
        no batch reached (left unchanged), the output SQNR, the warnings, and the time of each step.

    Raises:
        ValueError: bad arguments, no quantizers, or no batches.
        CalibrationCancelled: ``cancel`` was set; the model is unchanged.
        CalibrationError: the model raised on a batch (its index and the original error are kept);
            the model is unchanged.
        AmaxError: a method cannot compute a quantizer's amax (the quantizer is named); the model is unchanged.
        NonFiniteCalibrationError: some quantizers saw only NaN/Inf; the model is unchanged.
        NothingReachedError: the batches reached no calibrating quantizer; the model is unchanged.
    """
    method, percentile, quantizers = _checked_arguments(model, method, percentile, num_batches)
    context = context or SINGLE
    original_device = model_device(model)
    run_device = torch.device(device) if device is not None else original_device
    snapshot = ModelSnapshot(model, calibrators=True)
    total = num_batches if num_batches is not None else _length_or_zero(batches)
    started = time.perf_counter()
    local_progress = progress
    data_digest = Digest()
    if context.distributed:
        # this rank's share: the same batches in all as one process, dealt round robin; every batch is
        # read (and digested) on every rank, so that ranks with different data refuse to merge
        batches = _dealt(batches, num_batches, context, data_digest)
        num_batches = None
        local_progress = context.progress(context.main_only(progress), total, "calibration")

    try:
        if run_device != original_device:
            model.to(run_device)
        model.eval()
        calibrating = _start_collecting(quantizers)
        collection = _collect(model, batches, num_batches, run_device, context, total, cancel, local_progress,
                              keep=report_sqnr or method == AmaxMethod.AUTO.value)
        if context.distributed:
            _merge_ranks(model, calibrating, collection, context, local_progress, data_digest, method, percentile,
                         total)
        if collection.done == 0:
            raise ValueError("No calibration batches: the data source yielded nothing.")
        collected = time.perf_counter()

        amaxes = _compute_amax(calibrating, method, percentile, run_device, collection.done)
        results = amaxes.results
        _refine_blocks(model, results, block_method)
        amax_done = time.perf_counter()
        if amaxes.candidates:
            _pick_auto_methods(model, calibrating, amaxes.candidates, results, collection.kept, run_device, context,
                               cancel)
        auto_done = time.perf_counter()
        _check_histograms(calibrating, results)
    except BaseException:
        if run_device != original_device:
            model.to(original_device)
        snapshot.restore()
        raise

    return _commit(model, snapshot, quantizers, amaxes, collection, method, percentile, run_device, context,
                   report_sqnr, timings=(started, collected, amax_done, auto_done))


def _checked_arguments(model: nn.Module, method: str, percentile: float,
                       num_batches: int | None) -> tuple[str, float, dict[str, TensorQuantizer]]:
    """Step 0, before anything changes: the method's and percentile's canonical values and the model's quantizers.

    Returns:
        ``(method, percentile, quantizers by qualified name)``.

    Raises:
        ValueError: a bad argument, or a model without TensorQuantizer.
    """
    method = AmaxMethod.parse(method).value
    percentile = PERCENTILE.check(percentile)
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, int)
                                    or num_batches < 1):
        raise ValueError(f"num_batches must be a positive integer or None, got {num_batches!r}.")
    quantizers = {name: m for name, m in model.named_modules() if isinstance(m, TensorQuantizer)}
    if not quantizers:
        raise ValueError("The model has no TensorQuantizer to calibrate: quantize it first "
                         "(replace_to_quantization_module or quant_modules.initialize).")
    return method, percentile, quantizers


def _start_collecting(quantizers: dict[str, TensorQuantizer]) -> dict[str, TensorQuantizer]:
    """Step 1: empty calibrators collecting with quantization off; enabled quantizers without one are bypassed.

    Returns:
        The quantizers that collect, by name (disabled quantizers are left alone and not listed).
    """
    calibrating: dict[str, TensorQuantizer] = {}
    for name, q in quantizers.items():
        if not q.is_enabled:
            continue
        if q.calibrator is not None:
            q.calibrator.reset()
            q.disable_quant()
            q.enable_calib()
            calibrating[name] = q
        else:
            q.disable()
    return calibrating


@dataclass
class _Collection:
    """What the passes over the data left: how many batches ran, and the batches to run again."""

    done: int = 0
    # the batches to run again (auto, output SQNR), within REPLAY_BYTES, with their index among all batches
    kept: list[tuple[int, Any]] = field(default_factory=list)
    mostly_nonfinite: list[int] = field(default_factory=list)  # batches whose inputs are more NaN/Inf than finite


def _collect(model: nn.Module, batches: Iterable, num_batches: int | None, run_device: torch.device,
             context: DistContext, total: int, cancel: CancelToken | None, progress: ProgressCallback | None,
             keep: bool) -> _Collection:
    """Step 2: run the batches (this rank's share) so that the calibrators collect their statistics.

    Args:
        keep: keep the batches (within :data:`REPLAY_BYTES`) for auto's measurement and the output SQNR.

    Returns:
        The batches run on this rank, those kept, and those mostly NaN/Inf.

    Raises:
        CalibrationCancelled: ``cancel`` was set before a batch.
        CalibrationError: the model raised on a batch.
    """
    collection = _Collection()
    kept_bytes = 0
    with torch.no_grad():
        for local_index, batch in enumerate(batches):
            if num_batches is not None and local_index >= num_batches:
                break
            # the batch's place among all the batches, whichever rank runs it (errors and warnings name it)
            index = context.rank + local_index * context.world_size
            if cancel is not None and cancel.is_set():
                raise CalibrationCancelled(f"Calibration cancelled after {collection.done} of {total or '?'} "
                                           "batches.")
            try:
                run_model(model, batch, run_device)
            except Exception as error:  # the user's model: report which batch, keep the cause
                raise CalibrationError(index, error) from error
            if keep and kept_bytes <= REPLAY_BYTES:
                size = _batch_bytes(batch)
                if kept_bytes + size <= REPLAY_BYTES:
                    collection.kept.append((index, batch))
                kept_bytes += size
            if _nonfinite_share(batch) > _MOSTLY:
                collection.mostly_nonfinite.append(index)
            collection.done += 1
            if progress is not None:
                progress(collection.done, total, f"calibration batch {collection.done}"
                         + (f" of {total}" if total else ""))
    return collection


def _merge_ranks(model: nn.Module, calibrating: dict[str, TensorQuantizer], collection: _Collection,
                 context: DistContext, progress: ProgressCallback | None, data_digest: Digest, method: str,
                 percentile: float, total: int) -> None:
    """Step 2b (distributed): check the ranks ran the same job, merge their statistics and batch counts.

    ``collection`` ends with the counts summed over the ranks.
    """
    context.wait_for_peers(progress, "calibration batches")
    context.check_same({"calibration data": data_digest.hexdigest(),
                        "calibration settings": _settings_digest(calibrating, method, percentile, total),
                        "model weights": _weights_digest(model)}, "calibration")
    merge_calibrators({name: q.calibrator for name, q in calibrating.items()}, context)
    counts_and_flags = context.all_gather((collection.done, collection.mostly_nonfinite))
    collection.done = sum(count for count, _ in counts_and_flags)
    collection.mostly_nonfinite = sorted(index for _, flagged in counts_and_flags for index in flagged)


@dataclass
class _Amaxes:
    """Step 3's outcome."""

    results: dict[str, QuantizerCalibration]
    candidates: dict[str, dict[str, float]]  # auto: each quantizer's amax by method
    unused: list[str]  # quantizers no batch reached
    thin: list[str]  # warnings: histogram quantizers that saw too few values for the method (max instead)


def _compute_amax(calibrating: dict[str, TensorQuantizer], method: str, percentile: float,
                  run_device: torch.device, done: int) -> _Amaxes:
    """Step 3: load each reached quantizer's amax from its statistics (max for a thin histogram).

    Returns:
        The results by quantizer, auto's candidates, the quantizers never reached, the thin-histogram warnings.

    Raises:
        AmaxError: the method cannot run on a quantizer's histogram.
        NonFiniteCalibrationError: some quantizers saw only NaN/Inf.
        NothingReachedError: no calibrating quantizer saw a batch.
    """
    amaxes = _Amaxes(results={}, candidates={}, unused=[], thin=[])
    blind: list[str] = []  # quantizers that saw only NaN/Inf
    for name, q in calibrating.items():
        calibrator = q.calibrator
        if calibrator.batches_seen == 0:
            amaxes.unused.append(name)
            continue
        if calibrator.values_seen <= calibrator.nonfinite_count:
            blind.append(name)
            continue
        used_method = "max" if isinstance(calibrator, MaxCalibrator) else method
        if isinstance(calibrator, HistogramCalibrator) and _too_thin_for(calibrator, used_method):
            # a histogram search on a few hundred values (a squeeze-excite or classifier input) picks
            # an amax from noise: the largest |x| seen is the honest answer there
            amaxes.thin.append(f"{name}: only {calibrator.values_seen - calibrator.nonfinite_count} values for a "
                               f"{calibrator.num_bins}-bin histogram, too few for {used_method}: amax is the "
                               f"largest |x| seen (max) instead; calibrate on more batches to use {used_method} "
                               "here.")
            used_method = AmaxMethod.MAX.value
        try:
            if isinstance(calibrator, HistogramCalibrator) and used_method == AmaxMethod.AUTO.value:
                amaxes.candidates[name] = _candidates(name, calibrator, percentile)
                q.load_calib_amax(AmaxMethod.MAX.value)  # until auto has measured the candidates
            elif isinstance(calibrator, HistogramCalibrator):
                q.load_calib_amax(used_method, percentile=percentile)
            else:
                q.load_calib_amax()
        except ValueError as error:  # a search that cannot run on this histogram: say which quantizer
            raise AmaxError(name, used_method, error) from error
        q.move_amax_to(run_device)
        max_value = calibrator.max_value if isinstance(calibrator, HistogramCalibrator) else calibrator.calib_amax
        amaxes.results[name] = QuantizerCalibration(
            name=name, amax=q.amax.detach().cpu().clone(), method=used_method,
            calibrator=type(calibrator).__name__, batches=calibrator.batches_seen,
            num_samples=calibrator.values_seen, nonfinite_count=calibrator.nonfinite_count,
            max_value=None if max_value is None else float(max_value.max()))
    if blind:
        raise NonFiniteCalibrationError(blind)
    if calibrating and not amaxes.results:
        raise NothingReachedError(list(calibrating), done)
    return amaxes


def _refine_blocks(model: nn.Module, results: dict[str, QuantizerCalibration], block_method: str) -> None:
    """Step 3b: blockwise (INT4) weight amax by ``block_method``; the same on every rank (weights)."""
    for name, amax in refine_block_amax(model, block_method).items():
        if name in results:
            results[name].amax = amax.cpu().clone()
            results[name].method = f"block {block_method}"


def _pick_auto_methods(model: nn.Module, calibrating: dict[str, TensorQuantizer],
                       candidates: dict[str, dict[str, float]], results: dict[str, QuantizerCalibration],
                       kept: list[tuple[int, Any]], run_device: torch.device, context: DistContext,
                       cancel: CancelToken | None) -> None:
    """Step 4 (``method="auto"``): measure each quantizer's candidates and load the chosen amax.

    Raises:
        CalibrationCancelled: ``cancel`` was set while measuring.
    """
    # the first AUTO_BATCHES of all the batches, wherever they ran: N processes measure what one does
    measured = [batch for index, batch in kept if index < AUTO_BATCHES]
    choices = choose_methods(model, calibrating, candidates, measured, run_device, context=context,
                             cancel=None if cancel is None else cancel.is_set)
    if cancel is not None and cancel.is_set():
        raise CalibrationCancelled("Calibration cancelled while measuring the methods of 'auto'.")
    for name, choice in choices.items():
        calibrating[name].amax = torch.tensor(candidates[name][choice.method], dtype=torch.float32)
        results[name].amax = calibrating[name].amax.detach().cpu().clone()
        results[name].method = choice.method
        results[name].choice = choice


def _check_histograms(calibrating: dict[str, TensorQuantizer], results: dict[str, QuantizerCalibration]) -> None:
    """Step 5: each INT histogram quantizer's warnings about its amax (clipping, a thin or lopsided histogram)."""
    for name, item in results.items():
        calibrator = calibrating[name].calibrator
        if isinstance(calibrator, HistogramCalibrator) and calibrator.calib_hist is not None \
                and isinstance(calibrator.num_bits, int):  # the INT grid: what the checks reason about
            item.warnings = histogram_warnings(
                name, calibrator.calib_hist.cpu().numpy(), calibrator.bin_width, float(item.amax.max()),
                item.max_value or 0.0, num_bits=calibrator.num_bits, unsigned=calibrator.unsigned,
                method=item.method)


def _commit(model: nn.Module, snapshot: ModelSnapshot, quantizers: dict[str, TensorQuantizer], amaxes: _Amaxes,
            collection: _Collection, method: str, percentile: float, run_device: torch.device,
            context: DistContext, report_sqnr: bool, timings: tuple[float, float, float, float]) -> CalibrationResult:
    """Step 6: give the quantizers their flags back (unreached ones their whole state), measure the output
    SQNR, and gather the result and its warnings.

    Args:
        timings: ``perf_counter`` at the start, after collecting, after the amax, after auto.
    """
    started, collected, amax_done, auto_done = timings
    results = amaxes.results
    snapshot.restore_flags()
    for name in amaxes.unused:  # nothing was learned about these: keep what they had
        snapshot.restore(quantizers[name])
        logger.warning("Quantizer %s saw no data during calibration; left unchanged.", name)

    output_sqnr, sqnr_batches = None, 0
    if report_sqnr:
        output_sqnr, sqnr_batches = _output_sqnr(model, quantizers, [batch for _, batch in collection.kept],
                                                 run_device, context)
    snapshot.restore_modes()
    done = collection.done
    result = CalibrationResult(quantizers=results, method=method, percentile=percentile, num_batches=done,
                               wall_time_s=time.perf_counter() - started, device=str(run_device),
                               unused=amaxes.unused, output_sqnr_db=output_sqnr, sqnr_batches=sqnr_batches,
                               warnings=_nonfinite_warnings(results, collection.mostly_nonfinite, done)
                               + _zero_warnings(results) + amaxes.thin + _suspicious(results, quantizers)
                               + [str(w) for item in results.values() for w in item.warnings],
                               collect_time_s=collected - started, amax_time_s=amax_done - collected,
                               auto_time_s=auto_done - amax_done)
    for warning in result.warnings:
        logger.warning(warning)
    logger.info(result.summary())
    return result


# Below this many values per bin a histogram is too thin for entropy and percentile to mean much.
_MIN_VALUES_PER_BIN = 4


def _candidates(name: str, calibrator: HistogramCalibrator, percentile: float) -> dict[str, float]:
    """Every single method's amax for "auto" to measure; searches a thin histogram cannot support are left out."""
    values = {}
    for method in AmaxMethod.singles():
        if _too_thin_for(calibrator, method.value):
            continue
        try:
            amax = calibrator.compute_amax(method.value, percentile=percentile)
        except ValueError as error:
            logger.info("%s: %s amax not available for auto: %s", name, method.value, error)
            continue
        if amax is not None:
            values[method.value] = float(amax)
    return values


def _batch_bytes(batch: Any) -> int:
    args, kwargs = model_inputs(batch)
    return sum(t.numel() * t.element_size() for t in flat_tensors((args, kwargs)))


def _too_thin_for(calibrator: HistogramCalibrator, method: str) -> bool:
    """Whether a histogram holds fewer finite values than bins: too few for a search over its bins (entropy,
    mse) to mean anything. Between one and ``_MIN_VALUES_PER_BIN`` values a bin the method runs, with a warning."""
    if method not in (AmaxMethod.ENTROPY.value, AmaxMethod.MSE.value):
        return False
    return calibrator.values_seen - calibrator.nonfinite_count < calibrator.num_bins


def _suspicious(results: dict[str, QuantizerCalibration], quantizers: dict[str, TensorQuantizer]) -> list[str]:
    """Plain-language warnings for amax values worth a second look (a collapse must not be silent)."""
    warnings = []
    for name, item in results.items():
        if item.calibrator != "HistogramCalibrator" or item.method == "max" or not item.max_value:
            continue
        bins = quantizers[name].calibrator.num_bins
        if item.num_samples < _MIN_VALUES_PER_BIN * bins:
            warnings.append(f"{name}: only {item.num_samples} values for a {bins}-bin histogram; {item.method} is "
                            "unreliable on so few (use more batches, or max/percentile for this quantizer).")
    return warnings


# A batch whose inputs are more than this share NaN/Inf is reported.
_MOSTLY = 0.5


def _nonfinite_share(batch: Any) -> float:
    """The share of NaN/Inf among the floating-point values of a batch's inputs (0 when it has none)."""
    args, kwargs = model_inputs(batch)
    total = bad = 0
    for tensor in flat_tensors((args, kwargs)):
        if tensor.is_floating_point() and tensor.numel():
            total += tensor.numel()
            found = abs_max_in_place(tensor)  # on the CPU, one pass of the C kernel counts them
            if found is not None:
                bad += found[1]
                continue
            high, low = extremes(tensor)  # NaN/Inf show in the extremes: a clean batch costs two reductions
            if not (math.isfinite(high) and math.isfinite(low)):
                bad += int((~torch.isfinite(tensor)).sum())
    return bad / total if total else 0.0


def _nonfinite_warnings(results: dict[str, QuantizerCalibration], mostly: list[int], done: int) -> list[str]:
    """NaN/Inf in the data must not pass as a clean run: which batches, and which quantizers it reached."""
    warnings = []
    if mostly:
        shown = ", ".join(str(i) for i in mostly[:10]) + (", ..." if len(mostly) > 10 else "")
        warnings.append(f"calibration batches {shown} ({len(mostly)} of {done}) are mostly NaN/Inf (over "
                        f"{_MOSTLY:.0%} of their input values); those values were left out of every range.")
    touched = [item for item in results.values() if item.nonfinite_count]
    if touched:
        worst = max(touched, key=lambda item: item.nonfinite_count / max(item.num_samples, 1))
        warnings.append(f"{len(touched)} quantizers saw NaN/Inf values (left out of amax); most at {worst.name}: "
                        f"{worst.nonfinite_count} of {worst.num_samples} values.")
    return warnings


def _zero_warnings(results: dict[str, QuantizerCalibration]) -> list[str]:
    """A quantizer that saw only zeros gets amax 0, which quantizes every later input to 0."""
    return [f"{item.name}: calibration saw only zeros, so its amax is 0 and every input it gets is quantized to 0; "
            "use calibration data that reaches this layer with non-zero values, or leave the layer in float."
            for item in results.values() if item.max_value is not None and item.max_value == 0
            and float(item.amax.abs().max()) == 0]


def _dealt(batches: Iterable, num_batches: int | None, context: DistContext, digest: Digest) -> Iterable:
    """This rank's batches (round robin over the ranks); every batch up to ``num_batches`` goes into ``digest``."""
    for index, batch in enumerate(batches):
        if num_batches is not None and index >= num_batches:
            return
        digest.update(batch)
        if index % context.world_size == context.rank:
            yield batch


def _settings_digest(calibrating: dict[str, TensorQuantizer], method: str, percentile: float, total: int) -> str:
    """What decides a calibration besides the data and weights: method, batches, and each quantizer's setup."""
    digest = Digest().update([method, percentile, total])
    for name, q in calibrating.items():
        calibrator = q.calibrator
        digest.update([name, q.num_bits, q.axis, q.unsigned, q.narrow_range, type(calibrator).__name__,
                       getattr(calibrator, "num_bins", None)])
    return digest.hexdigest()


def _weights_digest(model: nn.Module) -> str:
    """The model's parameters (not the quantizers' buffers, which calibration is about to set)."""
    return Digest().update({name: p for name, p in model.named_parameters()}).hexdigest()


def _output_sqnr(model: nn.Module, quantizers: dict[str, TensorQuantizer], batches: list, device: torch.device,
                 context: DistContext) -> tuple[float | None, int]:
    """The model output's SQNR, INT8 vs FP32, with signal and noise summed over ``batches`` (and the ranks),
    and how many batches that was."""
    enabled = {name: q.is_enabled for name, q in quantizers.items()}
    signal = noise = 0.0
    counted = 0
    try:
        with torch.no_grad():
            for batch in batches:
                quantized = run_model(model, batch, device)
                for q in quantizers.values():
                    q.disable()
                reference = run_model(model, batch, device)
                for name, q in quantizers.items():
                    q.set_enabled(enabled[name])
                powers = sqnr_powers(reference, quantized)
                if powers is not None:
                    signal += powers[0]
                    noise += powers[1]
                    counted += 1
    finally:
        for name, q in quantizers.items():
            q.set_enabled(enabled[name])
    if context.distributed:
        parts = context.all_gather((signal, noise, counted))
        signal, noise, counted = (sum(part[i] for part in parts) for i in range(3))
    if counted == 0:
        return None, 0
    if noise == 0:
        return math.inf, counted
    if signal == 0:
        return -math.inf, counted
    return 10 * math.log10(signal / noise), counted


def _length_or_zero(batches: Iterable) -> int:
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return 0
