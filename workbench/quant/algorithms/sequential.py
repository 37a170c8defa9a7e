"""Sequential calibration: a decoder calibrated one block at a time, with one block's weights resident.

A model whose parameters are mostly in a list of identical blocks (``model.layers`` of a Hugging Face decoder,
GPT-2's ``transformer.h``, BERT's ``encoder.layer``) is calibrated as llm-compressor's "sequential onloading"
does it:

1. a *capture pass* runs every calibration batch through the model until the first block is called (a forward
   pre-hook stops it there): the modules before the blocks (embeddings) collect, and the first block's inputs
   (hidden states, attention mask, rotary cos/sin, cache flags...) are kept;
2. for each block in turn: its weights are loaded (:class:`~workbench.quant.algorithms.residency.BlockResidency`),
   every batch's inputs go through it with its quantizers collecting, its amax are computed (and its INT4 weight
   blocks refined, which needs its weights), its outputs become the next block's inputs, and its weights are
   released;
3. a *tail pass* runs the model once more with each block replaying the last block's kept outputs, so that the
   modules after the blocks (final norm, ``lm_head``) collect; the modules before the blocks, which collected in
   the capture pass, are bypassed this time (each quantizer collects exactly once per batch).

Collecting runs with quantization off, exactly as :func:`~workbench.quant.algorithms.calibrate.calibrate`
does, so every block sees the very inputs it sees in the whole-model run and every calibrator gets the same
values in the same order: the amax and histograms are bit-identical to the whole-model run (tests/quant/
test_sequential.py). Activations between blocks stay in memory within a budget and go to a temporary folder
beyond it (:mod:`workbench.quant.algorithms.activation_store`).

A Hugging Face key/value cache among the blocks' inputs is dropped (a first forward computes the same without it).
Assumptions, said where they could matter: every block gets the same extra inputs (mask, position embeddings) as
the first one, and its hidden-state input is its first positional argument (or ``hidden_states=``); a block
returns its hidden states, or a tuple whose first item they are. A quantizer outside the blocks that runs both
before and after them is refused (its statistics would come in another order).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

import torch
from torch import nn

from workbench.quant.algorithms.activation_store import ACTIVATION_BUDGET, ActivationStore, SpillFolder
from workbench.quant.algorithms.batches import run_model, sqnr_powers
from workbench.quant.algorithms.block_walk import (
    MIN_BLOCK_SHARE,
    BlockCalibrationError,
    Blocks,
    BlockWalk,
    SequentialUnsupported,
    as_keywords,
    find_blocks,
    no_blocks_reason,
)
from workbench.quant.algorithms.blocks import DEFAULT_BLOCK_METHOD, refine_block_amax
from workbench.quant.algorithms.calibrate import calibrate, checked_arguments
from workbench.quant.algorithms.calibration_amax import (
    AUTO_BATCHES,
    Amaxes,
    check_histograms,
    compute_amax,
    pick_auto_methods,
    suspicious,
    zero_warnings,
)
from workbench.quant.algorithms.calibration_collect import nonfinite_warnings, start_collecting
from workbench.quant.algorithms.calibration_results import (
    CalibrationError,
    CalibrationResult,
    CancelToken,
    NonFiniteCalibrationError,
    NothingReachedError,
    ProgressCallback,
)
from workbench.quant.algorithms.distributed import DistContext
from workbench.quant.algorithms.residency import AllResident, BlockResidency
from workbench.quant.algorithms.sequential_ranks import RankShare
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.quant.calib import PERCENTILE, AmaxMethod
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

logger = logging.getLogger(__name__)

__all__ = ["Blocks", "BlockCalibrationError", "SequentialUnsupported", "find_blocks", "calibrate_sequential",
           "MIN_BLOCK_SHARE", "ACTIVATION_BUDGET"]


def calibrate_sequential(model: nn.Module, batches: Iterable, *, num_batches: int | None, method: str,
                         percentile: float = PERCENTILE.default, device: torch.device | str | None = None,
                         progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                         block_method: str = DEFAULT_BLOCK_METHOD, report_sqnr: bool = True,
                         residency: BlockResidency | None = None,
                         budget_bytes: int = ACTIVATION_BUDGET, spill_dir: str | None = None,
                         blocks: Blocks | None = None, context: DistContext | None = None) -> CalibrationResult:
    """Calibrate every enabled quantizer of ``model`` one block at a time (see the module's docstring): the
    same amax and statistics as :func:`~workbench.quant.algorithms.calibrate.calibrate` with one block's weights
    resident. A model without repeated blocks is calibrated whole, with a warning saying so.

    Args:
        model, batches, num_batches, method, percentile, block_method: as ``calibrate`` takes them; "auto"
            measures each block's candidates on that block's inputs (the modules outside the blocks on the model
            with the blocks replaying their outputs), as the whole-model run's FP32 pass gives them.
        device: where each block runs (moved there after loading, back before release); default: the model's.
        progress: ``progress(done, total, message)`` after the capture pass, each block and the tail pass (and
            each block of the SQNR walk).
        cancel: checked before each batch of each pass; when set, :class:`CalibrationCancelled` is raised.
        residency: loads and releases each block's weights (default: :class:`AllResident`, all in memory); the
            modules outside the blocks are loaded for the whole run.
        budget_bytes: activations kept in memory between blocks; beyond, they are saved to a temporary folder
            (under ``spill_dir``, default the system's) that is removed at the end.
        report_sqnr: also measure the model output's SQNR, quantized vs float, over all the batches: the float
            outputs are kept from the tail pass, the quantized ones come from one more walk over the blocks with
            every quantizer on (the whole-model run pools the same sums).
        blocks: the blocks to walk (default: :func:`find_blocks`).
        context: a distributed job's; each rank walks the blocks on its share of the batches (see sequential_ranks).

    Returns:
        A :class:`CalibrationResult`.

    Raises:
        ValueError: bad arguments, no quantizers, or no batches.
        SequentialUnsupported: the blocks cannot be walked one at a time (see the module's assumptions).
        CalibrationCancelled, CalibrationError (:class:`BlockCalibrationError` naming the block), AmaxError,
        NonFiniteCalibrationError, NothingReachedError: as ``calibrate``; the model is unchanged.
    """
    blocks = blocks if blocks is not None else find_blocks(model)
    if blocks is None:
        reason = no_blocks_reason(model)
        logger.warning("Sequential calibration: %s; calibrating the whole model at once.", reason)
        result = calibrate(model, batches, num_batches=num_batches, method=method, percentile=percentile,
                           device=device, progress=progress, cancel=cancel, block_method=block_method,
                           report_sqnr=report_sqnr, context=context)
        result.warnings.insert(0, f"sequential calibration: {reason}; the whole model was calibrated at once.")
        return result
    method, percentile, quantizers = checked_arguments(model, method, percentile, num_batches)
    run = _SequentialRun(model, blocks, quantizers, residency or AllResident(), device, progress, cancel,
                         SpillFolder(budget_bytes, spill_dir), report_sqnr, RankShare(context))
    snapshot = ModelSnapshot(model, calibrators=True)
    started = time.perf_counter()
    sqnr: tuple[float | None, int] = (None, 0)
    try:
        model.eval()
        calibrating = start_collecting(quantizers)
        amaxes = run.calibrate(batches, num_batches, calibrating, method, percentile, block_method)
        collected = time.perf_counter()
        check_histograms(calibrating, amaxes.results)
        if report_sqnr:  # on the quantizers as the run leaves them: their flags back, the unreached unchanged
            snapshot.restore_flags()
            for name in amaxes.unused:
                snapshot.restore(quantizers[name])
            sqnr = run.output_sqnr()
    except BaseException:
        snapshot.restore()
        raise
    finally:
        run.close()
    return _commit(snapshot, quantizers, amaxes, run, method, percentile, (started, collected), sqnr)


def _commit(snapshot: ModelSnapshot, quantizers: dict[str, TensorQuantizer], amaxes: Amaxes, run: _SequentialRun,
            method: str, percentile: float, timings: tuple[float, float],
            sqnr: tuple[float | None, int]) -> CalibrationResult:
    """Flags back, unreached quantizers as they were, and the result with the whole-model run's warnings."""
    results = amaxes.results
    snapshot.restore_flags()
    for name in amaxes.unused:
        snapshot.restore(quantizers[name])
        logger.warning("Quantizer %s saw no data during calibration; left unchanged.", name)
    snapshot.restore_modes()
    done = run.total
    started, collected = timings
    result = CalibrationResult(quantizers=results, method=method, percentile=percentile, num_batches=done,
                               wall_time_s=time.perf_counter() - started, device=str(run.device),
                               unused=amaxes.unused, output_sqnr_db=sqnr[0], sqnr_batches=sqnr[1],
                               warnings=nonfinite_warnings(results, run.mostly_nonfinite, done)
                               + zero_warnings(results) + amaxes.thin + suspicious(results, quantizers)
                               + [str(w) for item in results.values() for w in item.warnings],
                               collect_time_s=collected - started - run.amax_time_s - run.auto_time_s,
                               amax_time_s=run.amax_time_s, auto_time_s=run.auto_time_s)
    for warning in result.warnings:
        logger.warning(warning)
    logger.info("%s (sequential: %s, %d activation files spilled)", result.summary(), run.blocks.describe(),
                run.spill.spilled_files)
    return result


class _SequentialRun(BlockWalk):
    """One sequential calibration: the walk (:class:`BlockWalk`), the float outputs kept for the SQNR, the times."""

    def __init__(self, model: nn.Module, blocks: Blocks, quantizers: dict[str, TensorQuantizer],
                 residency: BlockResidency, device: torch.device | str | None, progress: ProgressCallback | None,
                 cancel: CancelToken | None, spill: SpillFolder, report_sqnr: bool, share: RankShare) -> None:
        # a distributed job's share (this rank's batches, the merges); only rank 0 reports progress
        super().__init__(model, blocks, residency, device, share.context.main_only(progress), cancel, spill,
                         steps=len(blocks.items) + 2 + (len(blocks.items) + 1 if report_sqnr else 0))
        self.quantizers, self.share = quantizers, share
        self.total = 0  # batches run by all ranks (self.done: by this one)
        self.require_batches_at_capture = not share.distributed  # a rank may have none: the ranks' total counts
        self.amax_time_s = 0.0
        self.auto_time_s = 0.0  # measuring "auto"'s candidates
        # the float model's outputs of the tail pass, for the output SQNR
        self.reference = ActivationStore(spill) if report_sqnr else None

    def batch_index(self, local: int) -> int:
        return self.share.index(local)

    def close(self) -> None:
        if self.reference is not None:
            self.reference.close()
        super().close()

    def calibrate(self, batches: Iterable, num_batches: int | None, calibrating: dict[str, TensorQuantizer],
                  method: str, percentile: float, block_method: str) -> Amaxes:
        """The three passes; returns every reached quantizer's amax (the model's calibrators hold the statistics)."""
        amaxes = Amaxes(results={}, candidates={}, unused=[], thin=[])
        blind: list[str] = []
        auto = method == AmaxMethod.AUTO.value
        inside = {name for name in calibrating if any(name.startswith(block + ".") for block, _ in self.blocks.items)}
        outside = {name: q for name, q in calibrating.items() if name not in inside}
        with self.outside_loaded():
            head = self.capture(*self.share.deal(batches, num_batches), outside.values())
            self.total, self.mostly_nonfinite = self.share.joined(self.done, self.mostly_nonfinite, calibrating,
                                                                  method, percentile)
            for step, (block_name, block) in enumerate(self.blocks.items, start=1):
                mine = {name: q for name, q in calibrating.items() if name.startswith(block_name + ".")}
                last = step == len(self.blocks.items)
                with self.block_in_memory(block_name, block):
                    inputs = self.run_block(block_name, block, last, keep=AUTO_BATCHES if auto else 0)
                    try:
                        candidates = self._amax(mine, block, block_name, method, percentile, block_method, amaxes,
                                                blind)
                        if candidates:
                            started = time.perf_counter()
                            self._pick_in_block(block_name, block, mine, candidates, amaxes, inputs)
                            self.auto_time_s += time.perf_counter() - started
                    finally:
                        inputs.close()
                self.report(step + 1, f"calibrated block {block_name} ({step} of {len(self.blocks.items)})")
            self._tail(head)
            tail = dict(outside)
            candidates = {}
            for module_name, module in self.blocks.outside:
                mine = {name: tail.pop(name) for name in list(tail) if name.startswith(module_name + ".")}
                candidates |= self._amax(mine, module, module_name, method, percentile, block_method, amaxes, blind)
            candidates |= self._amax(tail, None, "", method, percentile, block_method, amaxes, blind)
            if candidates:
                started = time.perf_counter()
                kept = [(at, self.contexts.get(i)[0]) for i, at in self.share.first(AUTO_BATCHES, self.done)]
                with self.replaying():
                    pick_auto_methods(self.model, outside, candidates, amaxes.results, kept, self.device,
                                      self.share.context, self.cancel)
                self.auto_time_s += time.perf_counter() - started
        self.report(len(self.blocks.items) + 2, "calibrated the modules after the blocks")
        if blind:
            raise NonFiniteCalibrationError(blind)
        if calibrating and not amaxes.results:
            raise NothingReachedError(list(calibrating), self.total)
        return amaxes

    def output_sqnr(self) -> tuple[float | None, int]:
        """The model output's SQNR in dB, quantized (every quantizer as the model has it now) vs the float outputs
        of the tail pass, with signal and noise summed over the batches; and how many batches that was.

        The float reference is the collecting pass's output: equal to the whole-model run's (every quantizer off)
        but where a quantized attention takes its decomposed path while collecting and the fused one when off
        (the two differ by float rounding: ~1e-6 dB on the tests' LLaMA)."""
        signal = noise = 0.0
        counted = 0
        step = len(self.blocks.items) + 2
        with self.outside_loaded(), torch.no_grad():
            self.capture_again()
            for number, (name, block) in enumerate(self.blocks.items, start=1):
                with self.block_in_memory(name, block):
                    self.run_block(name, block, number == len(self.blocks.items), keep=0).close()
                self.report(step + number, f"output SQNR: quantized block {name} ({number} of "
                                            f"{len(self.blocks.items)})")
            with self.replaying():
                for index in range(self.done):
                    self.check_cancel(f"while measuring the output SQNR, before batch {index}")
                    quantized = run_model(self.model, self.contexts.get(index)[0], self.device)
                    powers = sqnr_powers(self.reference.get(index), quantized)
                    if powers is not None:
                        signal += powers[0]
                        noise += powers[1]
                        counted += 1
        signal, noise, counted = self.share.summed(signal, noise, counted)
        self.report(self.steps, f"measured the output SQNR on {counted} batches")
        if counted == 0:
            return None, 0
        if noise == 0:
            return math.inf, counted
        if signal == 0:
            return -math.inf, counted
        return 10 * math.log10(signal / noise), counted

    def _pick_in_block(self, block_name: str, block: nn.Module, mine: dict[str, TensorQuantizer],
                       candidates: dict[str, dict[str, float]], amaxes: Amaxes, inputs: ActivationStore) -> None:
        """"auto" for a block's quantizers: each candidate measured on the block's own inputs of the first
        :data:`AUTO_BATCHES` batches (what the whole-model run's FP32 pass gives the block)."""
        kept = []
        for index, place in self.share.first(AUTO_BATCHES, self.done):
            _, rest, positional = self.contexts.get(index)
            kept.append((place, as_keywords(block_name, block, inputs.get(index), rest, positional)))
        pick_auto_methods(block, mine, candidates, amaxes.results, kept, self.device, self.share.context, self.cancel)
        for name in candidates:  # the owners were found under the block: name them in the model
            choice = amaxes.results[name].choice
            if choice is not None and choice.owner:
                choice.owner = f"{block_name}.{choice.owner}"

    # ----- residency ----------------------------------------------------------------------------------

    def _tail(self, head: set[int]) -> None:
        """The model once more per batch, each block replaying the last block's output: the modules after the
        blocks collect; the quantizers that collected in the capture pass are bypassed."""
        bypassed = [q for q in self.quantizers.values() if id(q) in head]
        after = [False]

        def twice(quantizer: nn.Module, args: tuple) -> None:
            if after[0]:
                name = next(n for n, q in self.quantizers.items() if q is quantizer)
                raise SequentialUnsupported(f"{name} runs both before and after {self.blocks.name}: sequential "
                                            "calibration cannot give it its inputs in the whole-model order; "
                                            "calibrate without sequential.")

        for q in bypassed:
            q.disable_calib()
        handles = [q.register_forward_pre_hook(twice) for q in bypassed]
        try:
            with torch.no_grad(), self.replaying() as replayed:
                after = replayed
                for index in range(self.done):
                    self.check_cancel(f"in the modules after {self.blocks.name} before batch {index}")
                    batch = self.contexts.get(index)[0]
                    try:
                        output = run_model(self.model, batch, self.device)
                    except SequentialUnsupported:
                        raise
                    except Exception as error:
                        raise CalibrationError(self.batch_index(index), error) from error
                    if self.reference is not None:
                        self.reference.put(index, output)
        finally:
            for handle in handles:
                handle.remove()
            for q in bypassed:
                q.enable_calib()

    def _amax(self, mine: dict[str, TensorQuantizer], module: nn.Module | None, module_name: str, method: str,
              percentile: float, block_method: str, amaxes: Amaxes, blind: list[str]) -> dict[str, dict[str, float]]:
        """The amax of ``mine`` (the quantizers of ``module``, resident now), added to ``amaxes``; the names of
        those that saw only NaN/Inf go to ``blind`` (raised at the end, as the whole-model run does).

        Returns:
            "auto"'s candidates for these quantizers (each loaded with its max until measured).
        """
        candidates: dict[str, dict[str, float]] = {}
        if not mine:
            return candidates
        started = time.perf_counter()
        self.share.merge(mine, module)  # a distributed job's ranks: each rank's statistics are every rank's now
        reached = {name: q for name, q in mine.items() if q.calibrator.batches_seen > 0}
        amaxes.unused += [name for name in mine if name not in reached]
        if reached:
            try:
                part = compute_amax(reached, method, percentile, self.device, self.total)
            except NonFiniteCalibrationError as error:
                blind += error.names
            else:
                amaxes.results.update(part.results)
                amaxes.thin += part.thin
                candidates = part.candidates
                if module is not None:
                    prefix = module_name + "."
                    for name, amax in refine_block_amax(module, block_method).items():
                        if prefix + name in amaxes.results:
                            amaxes.results[prefix + name].amax = amax.cpu().clone()
                            amaxes.results[prefix + name].method = f"block {block_method}"
        self.amax_time_s += time.perf_counter() - started
        return candidates
