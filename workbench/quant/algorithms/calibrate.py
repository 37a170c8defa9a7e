"""Calibration as a job: feed sample batches through a model and set every quantizer's amax.

:func:`calibrate` is what the reference scripts' ``collect_stats`` + ``compute_amax`` do, made safe to
run from a GUI worker thread: progress per batch, cancel between batches, and on cancel or error the
model's quantizers are left exactly as they were (state_dict, enable flags, collected statistics).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

import torch
from torch import nn

from workbench.quant.algorithms.batches import model_device, model_inputs, run_model, sqnr_db, sqnr_powers
from workbench.quant.algorithms.blocks import DEFAULT_BLOCK_METHOD
from workbench.quant.algorithms.calibration_amax import (
    AUTO_BATCHES,
    Amaxes,
    check_histograms,
    compute_amax,
    pick_auto_methods,
    refine_blocks,
    suspicious,
    zero_warnings,
)
from workbench.quant.algorithms.calibration_collect import (
    REPLAY_BYTES,
    Collection,
    collect,
    dealt,
    merge_ranks,
    nonfinite_warnings,
    start_collecting,
)
from workbench.quant.algorithms.calibration_results import (
    AmaxError,
    CalibrationCancelled,
    CalibrationError,
    CalibrationResult,
    CancelToken,
    NonFiniteCalibrationError,
    NothingReachedError,
    ProgressCallback,
    QuantizerCalibration,
)
from workbench.quant.algorithms.distributed import SINGLE, Digest, DistContext
from workbench.quant.algorithms.experts_routing import start_routing_counts, unrouted_experts_warnings
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.quant.calib import PERCENTILE, AmaxMethod
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

logger = logging.getLogger(__name__)

# The job's public face: its results and errors are defined beside it but imported from here by every caller.
__all__ = ["calibrate", "CalibrationResult", "QuantizerCalibration", "CalibrationCancelled", "CalibrationError",
           "NonFiniteCalibrationError", "NothingReachedError", "AmaxError", "AUTO_BATCHES", "REPLAY_BYTES",
           "CancelToken", "ProgressCallback", "model_inputs", "run_model", "sqnr_db", "model_device"]


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
        report_sqnr: also run the calibration batches quantized and report the output SQNR against the
            collecting pass's (float) outputs, pooled over all of them (one extra forward pass per batch; two
            for a batch whose output is over ``REFERENCE_BYTES``), so that a collapsed amax is visible.
        context: the process's place in a distributed job (None: one process). Rank ``r`` of ``N``
            runs batches ``r, r + N, ...`` of the same first ``num_batches``, the statistics are
            merged across ranks (:func:`~workbench.quant.algorithms.merge.merge_calibrators`), and every
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
    method, percentile, quantizers = checked_arguments(model, method, percentile, num_batches)
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
        batches = dealt(batches, num_batches, context, data_digest)
        num_batches = None
        local_progress = context.progress(context.main_only(progress), total, "calibration")

    try:
        if run_device != original_device:
            model.to(run_device)
        model.eval()
        calibrating = start_collecting(quantizers)
        start_routing_counts(model)
        collection = collect(model, batches, num_batches, run_device, context, total, cancel, local_progress,
                              keep=report_sqnr or method == AmaxMethod.AUTO.value, keep_outputs=report_sqnr)
        if context.distributed:
            merge_ranks(model, calibrating, collection, context, local_progress, data_digest, method, percentile,
                         total)
        if collection.done == 0:
            raise ValueError("No calibration batches: the data source yielded nothing.")
        collected = time.perf_counter()
        routing = unrouted_experts_warnings(model)

        amaxes = compute_amax(calibrating, method, percentile, run_device, collection.done)
        results = amaxes.results
        refine_blocks(model, results, block_method)
        amax_done = time.perf_counter()
        if amaxes.candidates:
            pick_auto_methods(model, calibrating, amaxes.candidates, results, collection.kept, run_device, context,
                               cancel)
        auto_done = time.perf_counter()
        check_histograms(calibrating, results)
    except BaseException:
        unrouted_experts_warnings(model)  # stops the counting
        if run_device != original_device:
            model.to(original_device)
        snapshot.restore()
        raise

    result = _commit(model, snapshot, quantizers, amaxes, collection, method, percentile, run_device, context,
                     report_sqnr, timings=(started, collected, amax_done, auto_done))
    for warning in routing:  # mixture-of-experts layers: experts no calibration token was routed to
        logger.warning(warning)
    result.warnings.extend(routing)
    return result


def checked_arguments(model: nn.Module, method: str, percentile: float,
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



def _commit(model: nn.Module, snapshot: ModelSnapshot, quantizers: dict[str, TensorQuantizer], amaxes: Amaxes,
            collection: Collection, method: str, percentile: float, run_device: torch.device,
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
                                                 collection.references, run_device, context)
    snapshot.restore_modes()
    done = collection.done
    result = CalibrationResult(quantizers=results, method=method, percentile=percentile, num_batches=done,
                               wall_time_s=time.perf_counter() - started, device=str(run_device),
                               unused=amaxes.unused, output_sqnr_db=output_sqnr, sqnr_batches=sqnr_batches,
                               warnings=nonfinite_warnings(results, collection.mostly_nonfinite, done)
                               + zero_warnings(results) + amaxes.thin + suspicious(results, quantizers)
                               + [str(w) for item in results.values() for w in item.warnings],
                               collect_time_s=collected - started, amax_time_s=amax_done - collected,
                               auto_time_s=auto_done - amax_done)
    for warning in result.warnings:
        logger.warning(warning)
    logger.info(result.summary())
    return result



def _output_sqnr(model: nn.Module, quantizers: dict[str, TensorQuantizer], batches: list, references: list,
                 device: torch.device, context: DistContext) -> tuple[float | None, int]:
    """The model output's SQNR, INT8 vs FP32, with signal and noise summed over ``batches`` (and the ranks),
    and how many batches that was.

    ``references``: per batch, its float output kept from the collect pass (quantization off), or None: that batch
    runs again with every quantizer off. The collect pass's output is the float model's, bit for bit, but where a
    quantized attention takes its decomposed path while collecting and the fused one when off (float rounding:
    ~1e-6 dB, as the sequential run's tail-pass reference)."""
    enabled = {name: q.is_enabled for name, q in quantizers.items()}
    signal = noise = 0.0
    counted = 0
    try:
        with torch.no_grad():
            for number, batch in enumerate(batches):
                quantized = run_model(model, batch, device)
                reference = references[number] if number < len(references) else None
                if reference is None:
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
