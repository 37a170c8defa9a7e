"""Calibration's collect step: run the batches with every calibrator collecting, and (distributed) merge what
the ranks collected.

Also what the collect step notices on the way: the batches kept to run again (within :data:`REPLAY_BYTES`),
and the batches whose inputs are mostly NaN/Inf.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.batches import flat_tensors, model_inputs, run_model, select_output
from workbench.quant.algorithms.calibration_results import (
    CalibrationCancelled,
    CalibrationError,
    CancelToken,
    ProgressCallback,
    QuantizerCalibration,
)
from workbench.quant.algorithms.distributed import Digest, DistContext
from workbench.quant.algorithms.merge import merge_calibrators
from workbench.quant.calib.max import extremes
from workbench.quant.calib.memory import abs_max_in_place
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

# The batches a run keeps to run again (auto's measurement, the output SQNR) take at most this many bytes;
# beyond, the SQNR covers the batches kept and says so.
REPLAY_BYTES = 1 << 30
# The float outputs kept from the collect pass as the output SQNR's reference take at most this many bytes; a kept
# batch whose output does not fit is run again with every quantizer off (the pass this saves: a third of the job).
REFERENCE_BYTES = 512 << 20


def start_collecting(quantizers: dict[str, TensorQuantizer]) -> dict[str, TensorQuantizer]:
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
class Collection:
    """What the passes over the data left: how many batches ran, and the batches to run again."""

    done: int = 0
    # the batches to run again (auto, output SQNR), within REPLAY_BYTES, with their index among all batches
    kept: list[tuple[int, Any]] = field(default_factory=list)
    # per kept batch, the compared part of its float output (collecting runs with quantization off), or None where
    # it was not kept (not asked for, over REFERENCE_BYTES, or no tensor to compare)
    references: list[Any] = field(default_factory=list)
    mostly_nonfinite: list[int] = field(default_factory=list)  # batches whose inputs are more NaN/Inf than finite


def collect(model: nn.Module, batches: Iterable, num_batches: int | None, run_device: torch.device,
             context: DistContext, total: int, cancel: CancelToken | None, progress: ProgressCallback | None,
             keep: bool, keep_outputs: bool = False) -> Collection:
    """Step 2: run the batches (this rank's share) so that the calibrators collect their statistics.

    Args:
        keep: keep the batches (within :data:`REPLAY_BYTES`) for auto's measurement and the output SQNR.
        keep_outputs: also keep each kept batch's output (the part the SQNR compares, within
            :data:`REFERENCE_BYTES`): every quantizer collects with quantization off, so it is the float model's
            output, the output SQNR's reference without another forward.

    Returns:
        The batches run on this rank, those kept, and those mostly NaN/Inf.

    Raises:
        CalibrationCancelled: ``cancel`` was set before a batch.
        CalibrationError: the model raised on a batch.
    """
    collection = Collection()
    kept_bytes = reference_bytes = 0
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
                output = run_model(model, batch, run_device)
            except Exception as error:  # the user's model: report which batch, keep the cause
                raise CalibrationError(index, error) from error
            if keep and kept_bytes <= REPLAY_BYTES:
                size = batch_bytes(batch)
                if kept_bytes + size <= REPLAY_BYTES:
                    collection.kept.append((index, batch))
                    reference = compared_part(output) if keep_outputs else None
                    reference_size = 0 if reference is None else value_size(reference)
                    if reference_bytes + reference_size > REFERENCE_BYTES:
                        reference = None
                    reference_bytes += reference_size if reference is not None else 0
                    collection.references.append(reference)
                kept_bytes += size
            del output  # a model's output (logits, a cache) is not held into the next batch's forward
            if nonfinite_share(batch) > MOSTLY_NONFINITE:
                collection.mostly_nonfinite.append(index)
            collection.done += 1
            if progress is not None:
                progress(collection.done, total, f"calibration batch {collection.done}"
                         + (f" of {total}" if total else ""))
    return collection


def merge_ranks(model: nn.Module, calibrating: dict[str, TensorQuantizer], collection: Collection,
                 context: DistContext, progress: ProgressCallback | None, data_digest: Digest, method: str,
                 percentile: float, total: int) -> None:
    """Step 2b (distributed): check the ranks ran the same job, merge their statistics and batch counts.

    ``collection`` ends with the counts summed over the ranks.
    """
    context.wait_for_peers(progress, "calibration batches")
    context.check_same({"calibration data": data_digest.hexdigest(),
                        "calibration settings": settings_digest(calibrating, method, percentile, total),
                        "model weights": weights_digest(model)}, "calibration")
    merge_calibrators({name: q.calibrator for name, q in calibrating.items()}, context)
    counts_and_flags = context.all_gather((collection.done, collection.mostly_nonfinite))
    collection.done = sum(count for count, _ in counts_and_flags)
    collection.mostly_nonfinite = sorted(index for _, flagged in counts_and_flags for index in flagged)


def compared_part(output: Any) -> Any:
    """The part of a model output the output SQNR compares (:func:`select_output`), None where it has no tensor."""
    try:
        return select_output(output)
    except ValueError:
        return None


def value_size(value: Any) -> int:
    """The bytes of the tensors in ``value``."""
    return sum(t.numel() * t.element_size() for t in flat_tensors(value))


def batch_bytes(batch: Any) -> int:
    args, kwargs = model_inputs(batch)
    return sum(t.numel() * t.element_size() for t in flat_tensors((args, kwargs)))


# A batch whose inputs are more than this share NaN/Inf is reported.
MOSTLY_NONFINITE = 0.5


def nonfinite_share(batch: Any) -> float:
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


def nonfinite_warnings(results: dict[str, QuantizerCalibration], mostly: list[int], done: int) -> list[str]:
    """NaN/Inf in the data must not pass as a clean run: which batches, and which quantizers it reached."""
    warnings = []
    if mostly:
        shown = ", ".join(str(i) for i in mostly[:10]) + (", ..." if len(mostly) > 10 else "")
        warnings.append(f"calibration batches {shown} ({len(mostly)} of {done}) are mostly NaN/Inf (over "
                        f"{MOSTLY_NONFINITE:.0%} of their input values); those values were left out of every range.")
    touched = [item for item in results.values() if item.nonfinite_count]
    if touched:
        worst = max(touched, key=lambda item: item.nonfinite_count / max(item.num_samples, 1))
        warnings.append(f"{len(touched)} quantizers saw NaN/Inf values (left out of amax); most at {worst.name}: "
                        f"{worst.nonfinite_count} of {worst.num_samples} values.")
    return warnings


def dealt(batches: Iterable, num_batches: int | None, context: DistContext, digest: Digest) -> Iterable:
    """This rank's batches (round robin over the ranks); every batch up to ``num_batches`` goes into ``digest``."""
    for index, batch in enumerate(batches):
        if num_batches is not None and index >= num_batches:
            return
        digest.update(batch)
        if index % context.world_size == context.rank:
            yield batch


def settings_digest(calibrating: dict[str, TensorQuantizer], method: str, percentile: float, total: int) -> str:
    """What decides a calibration besides the data and weights: method, batches, and each quantizer's setup."""
    digest = Digest().update([method, percentile, total])
    for name, q in calibrating.items():
        calibrator = q.calibrator
        digest.update([name, q.num_bits, q.axis, q.unsigned, q.narrow_range, type(calibrator).__name__,
                       getattr(calibrator, "num_bins", None)])
    return digest.hexdigest()


def weights_digest(model: nn.Module) -> str:
    """The model's parameters (not the quantizers' buffers, which calibration is about to set)."""
    return Digest().update({name: p for name, p in model.named_parameters()}).hexdigest()


def forget_collected_weights(module: nn.Module) -> None:
    """The calibrators under ``module`` let go of the last weight they saw (a max calibrator remembers it to skip
    the next batch's identical pass), so that a block's weights can be released (sequential calibration)."""
    for quantizer in module.modules():
        calibrator = quantizer.calibrator if isinstance(quantizer, TensorQuantizer) else None
        if calibrator is not None and hasattr(calibrator, "forget_last_input"):
            calibrator.forget_last_input()
