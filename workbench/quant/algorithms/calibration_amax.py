"""Calibration's compute step: each reached quantizer's amax from its statistics, blockwise refinement, the
choice of "auto", and the warnings an amax deserves (thin, collapsed or zero ranges, clipping).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.auto_method import choose_methods
from workbench.quant.algorithms.blocks import refine_block_amax
from workbench.quant.algorithms.calibration_results import (
    AmaxError,
    CalibrationCancelled,
    CancelToken,
    NonFiniteCalibrationError,
    NothingReachedError,
    QuantizerCalibration,
)
from workbench.quant.algorithms.distributed import DistContext
from workbench.quant.calib import AmaxMethod, HistogramCalibrator, MaxCalibrator
from workbench.quant.calib.checks import histogram_warnings
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

logger = logging.getLogger(__name__)

# "auto" measures its candidates on at most this many calibration batches (per process).
AUTO_BATCHES = 4



@dataclass
class Amaxes:
    """Step 3's outcome."""

    results: dict[str, QuantizerCalibration]
    candidates: dict[str, dict[str, float]]  # auto: each quantizer's amax by method
    unused: list[str]  # quantizers no batch reached
    thin: list[str]  # warnings: histogram quantizers that saw too few values for the method (max instead)


def compute_amax(calibrating: dict[str, TensorQuantizer], method: str, percentile: float,
                  run_device: torch.device, done: int) -> Amaxes:
    """Step 3: load each reached quantizer's amax from its statistics (max for a thin histogram).

    Returns:
        The results by quantizer, auto's candidates, the quantizers never reached, the thin-histogram warnings.

    Raises:
        AmaxError: the method cannot run on a quantizer's histogram.
        NonFiniteCalibrationError: some quantizers saw only NaN/Inf.
        NothingReachedError: no calibrating quantizer saw a batch.
    """
    amaxes = Amaxes(results={}, candidates={}, unused=[], thin=[])
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
        if isinstance(calibrator, HistogramCalibrator) and too_thin_for(calibrator, used_method):
            # a histogram search on a few hundred values (a squeeze-excite or classifier input) picks
            # an amax from noise: the largest |x| seen is the honest answer there
            amaxes.thin.append(f"{name}: only {calibrator.values_seen - calibrator.nonfinite_count} values for a "
                               f"{calibrator.num_bins}-bin histogram, too few for {used_method}: amax is the "
                               f"largest |x| seen (max) instead; calibrate on more batches to use {used_method} "
                               "here.")
            used_method = AmaxMethod.MAX.value
        try:
            if isinstance(calibrator, HistogramCalibrator) and used_method == AmaxMethod.AUTO.value:
                amaxes.candidates[name] = candidates(name, calibrator, percentile)
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


def refine_blocks(model: nn.Module, results: dict[str, QuantizerCalibration], block_method: str) -> None:
    """Step 3b: blockwise (INT4) weight amax by ``block_method``; the same on every rank (weights)."""
    for name, amax in refine_block_amax(model, block_method).items():
        if name in results:
            results[name].amax = amax.cpu().clone()
            results[name].method = f"block {block_method}"


def pick_auto_methods(model: nn.Module, calibrating: dict[str, TensorQuantizer],
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


def check_histograms(calibrating: dict[str, TensorQuantizer], results: dict[str, QuantizerCalibration]) -> None:
    """Step 5: each INT histogram quantizer's warnings about its amax (clipping, a thin or lopsided histogram)."""
    for name, item in results.items():
        calibrator = calibrating[name].calibrator
        if isinstance(calibrator, HistogramCalibrator) and calibrator.calib_hist is not None \
                and isinstance(calibrator.num_bits, int):  # the INT grid: what the checks reason about
            item.warnings = histogram_warnings(
                name, calibrator.calib_hist.cpu().numpy(), calibrator.bin_width, float(item.amax.max()),
                item.max_value or 0.0, num_bits=calibrator.num_bits, unsigned=calibrator.unsigned,
                method=item.method)



# Below this many values per bin a histogram is too thin for entropy and percentile to mean much.
MIN_VALUES_PER_BIN = 4


def candidates(name: str, calibrator: HistogramCalibrator, percentile: float) -> dict[str, float]:
    """Every single method's amax for "auto" to measure; searches a thin histogram cannot support are left out."""
    values = {}
    for method in AmaxMethod.singles():
        if too_thin_for(calibrator, method.value):
            continue
        try:
            amax = calibrator.compute_amax(method.value, percentile=percentile)
        except ValueError as error:
            logger.info("%s: %s amax not available for auto: %s", name, method.value, error)
            continue
        if amax is not None:
            values[method.value] = float(amax)
    return values



def too_thin_for(calibrator: HistogramCalibrator, method: str) -> bool:
    """Whether a histogram holds fewer finite values than bins: too few for a search over its bins (entropy,
    mse) to mean anything. Between one and :data:`MIN_VALUES_PER_BIN` values a bin the method runs, with a warning."""
    if method not in (AmaxMethod.ENTROPY.value, AmaxMethod.MSE.value):
        return False
    return calibrator.values_seen - calibrator.nonfinite_count < calibrator.num_bins


def suspicious(results: dict[str, QuantizerCalibration], quantizers: dict[str, TensorQuantizer]) -> list[str]:
    """Plain-language warnings for amax values worth a second look (a collapse must not be silent)."""
    warnings = []
    for name, item in results.items():
        if item.calibrator != "HistogramCalibrator" or item.method == "max" or not item.max_value:
            continue
        bins = quantizers[name].calibrator.num_bins
        if item.num_samples < MIN_VALUES_PER_BIN * bins:
            warnings.append(f"{name}: only {item.num_samples} values for a {bins}-bin histogram; {item.method} is "
                            "unreliable on so few (use more batches, or max/percentile for this quantizer).")
    return warnings


def zero_warnings(results: dict[str, QuantizerCalibration]) -> list[str]:
    """A quantizer that saw only zeros gets amax 0, which quantizes every later input to 0."""
    return [f"{item.name}: calibration saw only zeros, so its amax is 0 and every input it gets is quantized to 0; "
            "use calibration data that reaches this layer with non-zero values, or leave the layer in float."
            for item in results.values() if item.max_value is not None and item.max_value == 0
            and float(item.amax.abs().max()) == 0]

