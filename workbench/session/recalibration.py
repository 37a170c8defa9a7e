"""Calibrating only what an edit made stale: after a ladder's Apply, the layers whose quantizers changed.

Calibration collects every quantizer's statistics with quantization off everywhere
(:func:`workbench.quant.algorithms.calibrate.calibrate`), so what one quantizer collects does not depend on the
others: calibrating the changed layers alone, on the same batches with the same settings, gives them the amax a
whole-model calibration gives them, and every other quantizer keeps the amax the current calibration gave it
(restored onto the model, bit for bit). That is only true while nothing else changed since that calibration:
:func:`partial_allowed` checks it (the project's state then, the calibration settings, the weights), and the
Session calibrates the whole model when it is not.

Pure functions: the Session passes the model, its data and project, and stores the record returned.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping

import torch
from torch import nn

from workbench.project import CalibrationRecord, Project, QuantizerRecord
from workbench.project.model import now_iso
from workbench.project.settings import CalibrationSettings
from workbench.quant.algorithms.batches import sqnr_powers
from workbench.quant.algorithms.calibrate import CalibrationResult, CancelToken, ProgressCallback, run_model
from workbench.quant.algorithms.calibrate import calibrate as run_calibration
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.session.build import FUNCTIONAL_MODULES, descriptor_of, layer_of
from workbench.session.in_place import LayerState
from workbench.session.state import state_digest
from workbench.sources.data_source import DataSource

__all__ = ["partial_allowed", "stale_layers", "calibrate_layers", "restored_run"]


def partial_allowed(project: Project, before: Mapping[str, LayerState], options: CalibrationSettings,
                    data: DataSource, *, weights_digest: str | None) -> str | None:
    """Why calibrating only the layers of ``before`` (an edit's layers, with their decisions before it) would not
    give what a whole-model calibration gives; None when it would: the current calibration was taken on the
    project exactly as it was before the edit (its state digest), with the calibration settings of now, on these
    weights, in one pass over the whole model."""
    run = project.current_calibration
    if run is None or run.state_digest is None:
        return "nothing calibrated yet (or a calibration saved before its state was recorded)"
    layers = {name: dataclasses.replace(decision) for name, decision in project.layers.items()}
    for name, (quantize, input_desc, weight_desc) in before.items():
        if name in layers:
            layers[name] = dataclasses.replace(layers[name], quantize=quantize, input_desc=input_desc,
                                               weight_desc=weight_desc)
    if state_digest(dataclasses.replace(project, layers=layers)) != run.state_digest:
        return "the project changed since the last calibration in more than these layers"
    if options.sequential or project.smoothing:
        return "block-by-block calibration and smoothing calibrate the whole model"
    if run.method != options.method.value or not math.isclose(run.percentile, options.percentile):
        return "the calibration method changed since the last calibration"
    available = data.num_batches
    wanted = options.num_batches if available is None else min(options.num_batches or available, available)
    if wanted is None or run.num_batches != wanted:
        return "the number of calibration batches changed since the last calibration"
    if weights_digest is not None and run.weights_digest is not None and weights_digest != run.weights_digest:
        return "the model's weights are not the ones the last calibration saw"
    return None


def stale_layers(model: nn.Module, run: CalibrationRecord) -> list[str]:
    """The layers of ``model`` with an enabled calibrating quantizer that ``run`` (the current calibration) does not
    describe: no record, a record taken with another descriptor, or no amax on the quantizer (new ones)."""
    layers: list[str] = []
    for name, quantizer in quantizer_names(model).items():
        record = run.quantizers.get(name)
        stale = record is None or not quantizer.has_amax or (
            record.descriptor is not None and record.descriptor != descriptor_of(quantizer))
        if _calibrates(quantizer) and stale:
            layer = layer_of(name)[0]
            if layer not in layers:
                layers.append(layer)
    return layers


def calibrate_layers(model: nn.Module, data: DataSource, project: Project, options: CalibrationSettings,
                     layers: list[str], *, device: torch.device, folded: list[str],
                     progress: ProgressCallback | None = None,
                     cancel: CancelToken | None = None) -> tuple[CalibrationResult, CalibrationRecord]:
    """Calibrate the quantizers of ``layers`` and of the attention products only (every other one keeps its amax),
    on the calibration batches and settings the current calibration used; then measure the whole model's output SQNR
    on those batches. Returns the result (the quantizers calibrated now) and the new current record: the current one
    with these quantizers calibrated again (quantizers the model no longer has are left out, as a whole calibration
    leaves them). On cancel or error the model is as it was."""
    run = project.current_calibration
    assert run is not None, "partial_allowed() first"
    started = time.perf_counter()
    quantizers = quantizer_names(model)
    modules = dict(model.named_modules())
    # attention products compute another way (torch's fused attention) while their quantizers are off: pausing
    # them would change every activation after them by a rounding, so they are calibrated again too
    wanted = set(layers) | {layer_of(name)[0] for name in quantizers
                            if isinstance(modules.get(layer_of(name)[0]), FUNCTIONAL_MODULES)}
    targets = {id(q) for name, q in quantizers.items() if layer_of(name)[0] in wanted}
    # the others are switched off while the targets collect (quantization is off for all of them then anyway)
    paused = [q for q in dict.fromkeys(quantizers.values()) if id(q) not in targets and q.is_enabled]
    for quantizer in paused:
        quantizer.disable()
    try:
        result = run_calibration(model, data.batches(), num_batches=run.num_batches, method=options.method.value,
                                 percentile=options.percentile, device=device, progress=progress, cancel=cancel,
                                 report_sqnr=False, block_method=options.block_method)
    finally:
        for quantizer in paused:
            quantizer.enable()
    result.output_sqnr_db, result.sqnr_batches = _output_sqnr(model, data, run.num_batches, device)
    result.wall_time_s = time.perf_counter() - started
    from workbench.quant.algorithms.precision import mix_label
    from workbench.session.decisions import precisions

    result.quantized_as = mix_label(precisions(project, model).values())
    records: dict[str, QuantizerRecord] = {}
    by_id = {id(q): name for name, q in reversed(list(quantizers.items())) if name in result.quantizers}
    for name, quantizer in quantizers.items():
        if id(quantizer) in targets:
            item = result.quantizers.get(name) or result.quantizers.get(by_id.get(id(quantizer), ""))
            if item is not None:
                state = quantizer.calibrator.state() if quantizer.calibrator is not None else None
                records[name] = QuantizerRecord.from_calibration(item, name=name, calibrator_state=state,
                                                                 descriptor=descriptor_of(quantizer))
        elif _calibrates(quantizer) and name in run.quantizers:
            records[name] = dataclasses.replace(run.quantizers[name])  # its own copy: amax methods edit records
    unused = [name for name in run.unused if name in quantizers and id(quantizers[name]) not in targets]
    record = dataclasses.replace(
        run, id=project.next_id(project.calibrations), created=now_iso(), wall_time_s=result.wall_time_s,
        output_sqnr_db=result.output_sqnr_db, sqnr_batches=result.sqnr_batches, quantizers=records,
        warnings=list(dict.fromkeys(result.warnings)), unused=unused + list(result.unused), folded=sorted(folded),
        state_digest=None)
    return result, record


def restored_run(project: Project, run: CalibrationRecord | None) -> CalibrationRecord | None:
    """The calibration ``run`` (the current one before an edit that was then undone) as a new current record: its
    amax, statistics and output SQNR, under a new id. Only when it describes the project exactly as it is now (its
    state digest: the same decisions, settings and fine-tune) and is not the current one already; else None (the
    project's calibration stays as it is, and what it does not describe shows as stale)."""
    if run is None or run.state_digest is None or project.current_calibration is run:
        return None
    if state_digest(dataclasses.replace(project, calibrations=[run])) != run.state_digest:
        return None
    copy = dataclasses.replace(run, id=project.next_id(project.calibrations), created=now_iso(),
                               quantizers={name: dataclasses.replace(r) for name, r in run.quantizers.items()},
                               warnings=list(run.warnings), unused=list(run.unused))
    copy.state_digest = state_digest(dataclasses.replace(project, calibrations=[copy]))
    return copy


def _calibrates(quantizer: TensorQuantizer) -> bool:
    """Whether a calibration gives ``quantizer`` an amax: enabled, quantizing, with a calibrator."""
    return quantizer.is_enabled and quantizer.is_quant_enabled and quantizer.calibrator is not None \
        and not quantizer.learn_amax


def _output_sqnr(model: nn.Module, data: DataSource, num_batches: int, device: torch.device
                 ) -> tuple[float | None, int]:
    """The model output's SQNR (quantized vs every quantizer off), signal and noise pooled over the first
    ``num_batches`` calibration batches, as a whole calibration reports it."""
    quantizers = list(dict.fromkeys(quantizer_names(model).values()))
    enabled = [q.is_enabled for q in quantizers]
    signal = noise = 0.0
    counted = 0
    model.eval()
    try:
        with torch.no_grad():
            for index, batch in enumerate(data.batches()):
                if index >= num_batches:
                    break
                quantized = run_model(model, batch, device)
                for quantizer in quantizers:
                    quantizer.disable()
                reference = run_model(model, batch, device)
                for quantizer, on in zip(quantizers, enabled):
                    quantizer.set_enabled(on)
                powers = sqnr_powers(reference, quantized)
                if powers is not None:
                    signal, noise, counted = signal + powers[0], noise + powers[1], counted + 1
    finally:
        for quantizer, on in zip(quantizers, enabled):
            quantizer.set_enabled(on)
    if counted == 0:
        return None, 0
    if noise == 0:
        return math.inf, counted
    return (-math.inf if signal == 0 else 10 * math.log10(signal / noise)), counted
