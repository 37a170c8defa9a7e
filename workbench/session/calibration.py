"""Calibration as session jobs: a pass over the calibration data, and switching amax methods from the
stored histograms, each kept in the project's calibration records.

Functions of the quantized model, its data and project, returning the records the
:class:`~workbench.session.Session` keeps (its methods call them, apply what they return and tell the
front ends); nothing here touches the session.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from workbench.plurals import agree, count_text
from workbench.project import CalibrationRecord, Project, QuantizerRecord
from workbench.project.model import now_iso
from workbench.project.settings import CalibrationSettings
from workbench.quant import TensorQuantizer
from workbench.quant.algorithms.calibrate import CalibrationResult, CancelToken, ProgressCallback
from workbench.quant.algorithms.calibrate import calibrate as run_calibration
from workbench.quant.algorithms.distributed import DistContext
from workbench.quant.algorithms.precision_registry import BLOCK_METHODS
from workbench.quant.algorithms.residency import BlockResidency
from workbench.quant.algorithms.sequential import calibrate_sequential
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.quant.calib import PERCENTILE, AmaxMethod, HistogramCalibrator
from workbench.session.build import descriptor_of, layer_of
from workbench.session.errors import SessionError
from workbench.sources.data_source import DataSource

__all__ = ["calibrate", "check_calibrated", "checked_block_method", "recompute_amax"]


def calibrate(model: nn.Module, data: DataSource, project: Project, options: CalibrationSettings, *,
              device: torch.device, folded: Iterable[str], method: str | None = None,
              num_batches: int | None = None, percentile: float | None = None,
              progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
              context: DistContext | None = None, block_method: str | None = None,
              sequential: bool | None = None,
              residency: BlockResidency | None = None) -> tuple[CalibrationResult, CalibrationRecord]:
    """Calibrate ``model`` on ``data`` (the calibration data); returns the result and its record (amax,
    histograms) for the project's calibrations. Options not given are ``options``' (the project's
    ``calibration`` setting); ``folded``: the layers a BatchNorm is folded into.

    ``block_method`` (default: the project's ``calibration.block_method``) chooses the amax of INT4 weight
    blocks: their max, or an mse search per block (:func:`workbench.quant.algorithms.blocks.refine_block_amax`).

    ``sequential`` (default: the project's ``calibration.sequential``) calibrates one block at a time
    (:func:`workbench.quant.algorithms.sequential.calibrate_sequential`: the same amax, one block's weights
    resident, loaded and released by ``residency``); progress then counts the blocks. With a distributed
    ``context`` each rank walks the blocks on its share of the batches, the same amax as one process.
    """
    sequential = options.sequential if sequential is None else sequential
    block_method = checked_block_method(block_method or options.block_method)
    method = method or options.method.value
    # a count the user chose (here, or in the project's settings), not the default "up to 16"
    asked = num_batches if num_batches is not None else (
        options.num_batches if options.num_batches != type(options)().num_batches else None)
    num_batches = num_batches if num_batches is not None else options.num_batches
    percentile = percentile if percentile is not None else options.percentile
    available = data.num_batches
    short = None
    if available is not None:  # progress totals count the batches that really run
        if asked is not None and asked > available:  # asked for more than there is: say so
            short = (f"{asked} calibration batches asked for, the data has {available}: calibrated on "
                     f"{available}.")
        num_batches = available if num_batches is None else min(num_batches, available)
    if sequential:  # with several processes, each walks the blocks on its share of the batches
        result = calibrate_sequential(model, data.batches(), num_batches=num_batches, method=method,
                                      percentile=percentile, device=device, progress=progress, cancel=cancel,
                                      block_method=block_method, residency=residency, context=context)
    else:
        result = run_calibration(model, data.batches(), num_batches=num_batches, method=method,
                                 percentile=percentile, device=device, progress=progress, cancel=cancel,
                                 context=context, block_method=block_method)
    if short is not None:
        result.warnings.insert(0, short)
    from workbench.quant.algorithms.precision import mix_label
    from workbench.session.decisions import precisions

    result.quantized_as = mix_label(precisions(project, model).values())
    quantizers = quantizer_names(model)
    records: dict[str, QuantizerRecord] = {}
    for name, quantizer in quantizers.items():
        item = result.quantizers.get(name) or _shared_result(result, quantizers, quantizer)
        if item is None:
            continue
        state = quantizer.calibrator.state() if quantizer.calibrator is not None else None
        records[name] = QuantizerRecord.from_calibration(item, name=name, calibrator_state=state,
                                                         descriptor=descriptor_of(quantizer))
    record = CalibrationRecord.from_result(
        result, id=project.next_id(project.calibrations), created=now_iso(), quantizers=records,
        folded=sorted(folded))
    return result, record


def check_calibrated(model: nn.Module, run: CalibrationRecord | None) -> None:
    """Refuse a ``model`` with a quantizer that has no amax (never calibrated, or stale after its descriptor
    changed), but those ``run`` (the project's current calibration) never reached: no data flowed through them,
    and export leaves them in float and says so.

    Raises:
        SessionError: naming (the first five of) the quantizers not calibrated.
    """
    unreached = set(run.unused) if run is not None else set()
    missing = [name for name, q in quantizer_names(model).items()
               if q.is_enabled and q.is_quant_enabled and not q.learn_amax and not q.has_amax
               and name not in unreached]  # stale after a descriptor change, or never calibrated
    if missing:
        raise SessionError(f"{count_text(len(missing), 'quantizer')} {agree(len(missing), 'is', 'are')} not calibrated "
                           f"({', '.join(missing[:5])}"
                           f"{'...' if len(missing) > 5 else ''}): calibrate first.")


def checked_block_method(block_method: str) -> str:
    """``block_method`` if it is one of :data:`~workbench.quant.algorithms.precision_registry.BLOCK_METHODS`;
    SessionError if not."""
    if block_method not in BLOCK_METHODS:
        raise SessionError(f"block method must be one of {', '.join(BLOCK_METHODS)}, got {block_method!r}.")
    return block_method


def recompute_amax(model: nn.Module, project: Project, names: Iterable[str], method: str,
                   percentile: float | None = None, *, device: torch.device) -> dict[str, float]:
    """New amax from the stored histograms of ``names`` (quantizers or layers) of ``model``; the project's
    current calibration record is updated (and a range learned while fine-tuning gives way).

    ``method="auto"`` puts back the method "auto" picked for each quantizer when the run measured it (its
    record keeps the choice); a quantizer it did not measure is refused, since measuring needs the data.

    Raises:
        SessionError: nothing calibrated, an unknown method or percentile, a quantizer without its
            histogram, or none of the names with a histogram calibrator.
    """
    run = project.current_calibration
    if run is None:
        raise SessionError("Nothing is calibrated yet: calibrate first.")
    try:  # one check of the method and its parameter, before any quantizer changes
        method = AmaxMethod.parse(method).value
        percentile = PERCENTILE.check(percentile if percentile is not None else run.percentile)
    except ValueError as error:
        raise SessionError(str(error)) from None
    quantizers = quantizer_names(model)
    targets = []
    for name in names:
        if name in quantizers:
            targets.append(name)
        else:
            targets += [q for q in quantizers if layer_of(q)[0] == name]
    updated = {}
    auto = method == AmaxMethod.AUTO.value
    if auto:
        unmeasured = [name for name in targets if isinstance(quantizers[name].calibrator, HistogramCalibrator)
                      and (run.quantizers.get(name) is None or not run.quantizers[name].choice)]
        if unmeasured:
            raise SessionError(f"{', '.join(unmeasured[:5])}: 'auto' was not measured for "
                               f"{'this quantizer' if len(unmeasured) == 1 else 'these quantizers'} in the current "
                               "calibration (it compares the methods on the calibration data): calibrate with "
                               "method auto, or pick a method.")
    for name in targets:
        quantizer = quantizers[name]
        if not isinstance(quantizer.calibrator, HistogramCalibrator):
            continue
        if quantizer.calibrator.calib_hist is None:
            raise SessionError(f"{name} has no histogram (it was not calibrated): calibrate first.")
        picked = run.quantizers[name].choice["method"] if auto else method
        try:
            quantizer.load_calib_amax(picked, percentile=percentile)
        except ValueError as error:  # e.g. entropy on a histogram with fewer bins than its start bin
            raise SessionError(f"{name}: the {picked} amax cannot be computed: {error}") from None
        quantizer.move_amax_to(device)
        record = run.quantizers.get(name)
        if record is not None:
            record.amax = quantizer.amax.detach().cpu().numpy().astype(np.float32)
            record.method = picked
            if not auto and record.choice:  # the user's pick replaces auto's: the reason no longer applies
                record.choice = {**record.choice, "overridden": method}
            elif auto and record.choice:
                record.choice = {key: value for key, value in record.choice.items() if key != "overridden"}
        updated[name] = float(quantizer.amax.max())
        if project.current_finetune is not None:  # a range learned while fine-tuning gives way
            project.current_finetune.amax.pop(name, None)
    if not updated:
        raise SessionError("None of these quantizers has a histogram calibrator; use calib_method 'histogram'.")
    return updated


def _shared_result(result: CalibrationResult, quantizers: dict[str, TensorQuantizer], quantizer: TensorQuantizer):
    """The calibration result of a quantizer reached under another name (shared by a placement rule)."""
    for name, other in quantizers.items():
        if other is quantizer and name in result.quantizers:
            return result.quantizers[name]
    return None
