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

import inspect
import logging
import math
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.activation_store import ACTIVATION_BUDGET, ActivationStore, SpillFolder
from workbench.quant.algorithms.batches import run_model, sqnr_powers
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
from workbench.quant.algorithms.calibration_collect import (
    MOSTLY_NONFINITE,
    forget_collected_weights,
    nonfinite_share,
    nonfinite_warnings,
    start_collecting,
)
from workbench.quant.algorithms.calibration_results import (
    CalibrationCancelled,
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

# A list of identical blocks is "the model's blocks" when it holds at least this share of the parameters.
MIN_BLOCK_SHARE = 0.5


@dataclass
class Blocks:
    """A model's repeated blocks: the list's qualified name, its items by qualified name, and the modules
    outside it (embeddings, final norm, head) by qualified name."""

    name: str
    items: list[tuple[str, nn.Module]]
    outside: list[tuple[str, nn.Module]]
    share: float  # of the model's parameters in the blocks

    def describe(self) -> str:
        kind = type(self.items[0][1]).__name__
        return f"{len(self.items)} {kind} blocks in {self.name} ({self.share:.0%} of the parameters)"


class BlockCalibrationError(CalibrationError):
    """A block failed on a batch's inputs during sequential calibration; the model is as it was.

    Attributes:
        block: the block's qualified name (``model.layers.3``).
    """

    def __init__(self, block: str, batch_index: int, original: BaseException) -> None:
        super().__init__(batch_index, original)
        self.block = block
        self.args = (f"Block {block} failed on calibration batch {batch_index} (sequential calibration): "
                     f"{type(original).__name__}: {original}",)


class SequentialUnsupported(ValueError):
    """The model's blocks cannot be walked one at a time (see the module's assumptions); the model is unchanged."""


class _Reached(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the first block's pre-hook to stop the capture pass there (a BaseException, so that a model's
    own ``except Exception`` around its layers does not swallow it)."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.inputs = (args, kwargs)


def _parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # meta parameters count too


def find_blocks(model: nn.Module) -> Blocks | None:
    """The ``nn.ModuleList`` of at least two modules of one class holding the most parameters, if that is at least
    :data:`MIN_BLOCK_SHARE` of the model's; None when the model has no such list."""
    total = _parameter_count(model)
    if total == 0:
        return None
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(item) for item in module}) != 1:
            continue
        count = _parameter_count(module)
        if best is None or count > best[0]:
            best = (count, name, module)
    if best is None or best[0] < MIN_BLOCK_SHARE * total:
        return None
    count, name, blocks = best
    items = [(f"{name}.{key}", item) for key, item in blocks.named_children()]
    return Blocks(name=name, items=items, outside=_outside(model, name), share=count / total)


def no_blocks_reason(model: nn.Module) -> str:
    """Why :func:`find_blocks` found nothing, for the fallback's warning."""
    return (f"{type(model).__name__} has no nn.ModuleList of identical blocks holding at least "
            f"{MIN_BLOCK_SHARE:.0%} of its parameters (a decoder's model.layers, GPT-2's transformer.h, BERT's "
            "encoder.layer)")


def _outside(model: nn.Module, list_name: str) -> list[tuple[str, nn.Module]]:
    """The modules beside the path from the root to the block list: everything that is not a block."""
    outside: list[tuple[str, nn.Module]] = []
    parts = list_name.split(".")
    parent, prefix = model, ""
    for part in parts:
        for child_name, child in parent.named_children():
            if child_name != part:
                outside.append((prefix + child_name, child))
        parent = getattr(parent, part)
        prefix += part + "."
    return outside


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


class _SequentialRun:
    """The state of one sequential calibration: the stores, the batches kept for the tail pass, the counts."""

    def __init__(self, model: nn.Module, blocks: Blocks, quantizers: dict[str, TensorQuantizer],
                 residency: BlockResidency, device: torch.device | str | None, progress: ProgressCallback | None,
                 cancel: CancelToken | None, spill: SpillFolder, report_sqnr: bool, share: RankShare) -> None:
        self.model, self.blocks, self.quantizers, self.residency = model, blocks, quantizers, residency
        self.home = _home_device(model)
        self.device = torch.device(device) if device is not None else self.home
        # a distributed job's share (this rank's batches, the merges); only rank 0 reports progress
        self.progress, self.cancel, self.spill, self.share = share.context.main_only(progress), cancel, spill, share
        self.done = self.total = 0  # batches run here, and by all ranks
        self.mostly_nonfinite: list[int] = []
        self.amax_time_s = 0.0
        self.auto_time_s = 0.0  # measuring "auto"'s candidates
        # per batch: (the batch, the first block's inputs but the hidden states, whether those were positional)
        self.contexts = ActivationStore(spill)
        self.hidden = ActivationStore(spill)  # the hidden states going into the current block
        # the float model's outputs of the tail pass, for the output SQNR
        self.reference = ActivationStore(spill) if report_sqnr else None
        self.steps = len(blocks.items) + 2 + (len(blocks.items) + 1 if report_sqnr else 0)

    def close(self) -> None:
        self.contexts.close()
        self.hidden.close()
        if self.reference is not None:
            self.reference.close()
        self.spill.close()

    def _check_cancel(self, where: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CalibrationCancelled(f"Calibration cancelled {where}.")

    def _report(self, step: int, message: str) -> None:
        if self.progress is not None:
            self.progress(step, self.steps, message)

    def calibrate(self, batches: Iterable, num_batches: int | None, calibrating: dict[str, TensorQuantizer],
                  method: str, percentile: float, block_method: str) -> Amaxes:
        """The three passes; returns every reached quantizer's amax (the model's calibrators hold the statistics)."""
        amaxes = Amaxes(results={}, candidates={}, unused=[], thin=[])
        blind: list[str] = []
        auto = method == AmaxMethod.AUTO.value
        inside = {name for name in calibrating if any(name.startswith(block + ".") for block, _ in self.blocks.items)}
        outside = {name: q for name, q in calibrating.items() if name not in inside}
        with self._outside_loaded():
            head = self._capture(*self.share.deal(batches, num_batches), outside)
            self.total, self.mostly_nonfinite = self.share.joined(self.done, self.mostly_nonfinite, calibrating,
                                                                  method, percentile)
            for step, (block_name, block) in enumerate(self.blocks.items, start=1):
                mine = {name: q for name, q in calibrating.items() if name.startswith(block_name + ".")}
                last = step == len(self.blocks.items)
                with self._block_in_memory(block_name, block):
                    inputs = self._run_block(block_name, block, last, keep=AUTO_BATCHES if auto else 0)
                    try:
                        candidates = self._amax(mine, block, block_name, method, percentile, block_method, amaxes,
                                                blind)
                        if candidates:
                            started = time.perf_counter()
                            self._pick_in_block(block_name, block, mine, candidates, amaxes, inputs)
                            self.auto_time_s += time.perf_counter() - started
                    finally:
                        inputs.close()
                self._report(step + 1, f"calibrated block {block_name} ({step} of {len(self.blocks.items)})")
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
                with self._replaying():
                    pick_auto_methods(self.model, outside, candidates, amaxes.results, kept, self.device,
                                      self.share.context, self.cancel)
                self.auto_time_s += time.perf_counter() - started
        self._report(len(self.blocks.items) + 2, "calibrated the modules after the blocks")
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
        first_name, first = self.blocks.items[0]

        def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
            raise _Reached(args, kwargs)

        signal = noise = 0.0
        counted = 0
        step = len(self.blocks.items) + 2
        with self._outside_loaded(), torch.no_grad():
            self.hidden.close()
            self.hidden = ActivationStore(self.spill)
            handle = first.register_forward_pre_hook(stop, with_kwargs=True)
            try:
                for index in range(self.done):
                    try:
                        run_model(self.model, self.contexts.get(index)[0], self.device)
                    except _Reached as reached:
                        self.hidden.put(index, _split_hidden(first_name, *reached.inputs)[0])
                    except Exception as error:
                        raise CalibrationError(index, error) from error
            finally:
                handle.remove()
            for number, (name, block) in enumerate(self.blocks.items, start=1):
                with self._block_in_memory(name, block):
                    self._run_block(name, block, number == len(self.blocks.items), keep=0).close()
                self._report(step + number, f"output SQNR: quantized block {name} ({number} of "
                                            f"{len(self.blocks.items)})")
            with self._replaying():
                for index in range(self.done):
                    self._check_cancel(f"while measuring the output SQNR, before batch {index}")
                    quantized = run_model(self.model, self.contexts.get(index)[0], self.device)
                    powers = sqnr_powers(self.reference.get(index), quantized)
                    if powers is not None:
                        signal += powers[0]
                        noise += powers[1]
                        counted += 1
        signal, noise, counted = self.share.summed(signal, noise, counted)
        self._report(self.steps, f"measured the output SQNR on {counted} batches")
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
            kept.append((place, _as_keywords(block_name, block, inputs.get(index), rest, positional)))
        pick_auto_methods(block, mine, candidates, amaxes.results, kept, self.device, self.share.context, self.cancel)
        for name in candidates:  # the owners were found under the block: name them in the model
            choice = amaxes.results[name].choice
            if choice is not None and choice.owner:
                choice.owner = f"{block_name}.{choice.owner}"

    # ----- residency ----------------------------------------------------------------------------------

    @contextmanager
    def _block_in_memory(self, name: str, module: nn.Module) -> Iterator[None]:
        self.residency.load(name, module)
        try:
            if self.device != self.home:
                module.to(self.device)
            yield
        finally:
            if self.device != self.home:
                module.to(self.home)
            forget_collected_weights(module)
            self.residency.release(name, module)

    @contextmanager
    def _outside_loaded(self) -> Iterator[None]:
        loaded: list[tuple[str, nn.Module]] = []
        try:
            for name, module in self.blocks.outside:
                self.residency.load(name, module)
                loaded.append((name, module))
                if self.device != self.home:
                    module.to(self.device)
            yield
        finally:
            for name, module in reversed(loaded):
                if self.device != self.home:
                    module.to(self.home)
                forget_collected_weights(module)
                self.residency.release(name, module)

    # ----- the passes -----------------------------------------------------------------------------------

    def _capture(self, batches: Iterable, num_batches: int | None,
                 outside: dict[str, TensorQuantizer]) -> set[int]:
        """Run each batch up to the first block (the modules before it collect); keep that block's inputs.

        Returns:
            The ids of the quantizers outside the blocks that collected here (to bypass in the tail pass).
        """
        first_name, first = self.blocks.items[0]
        reached: set[int] = set()

        def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
            raise _Reached(args, kwargs)

        def seen(quantizer: nn.Module, args: tuple) -> None:
            reached.add(id(quantizer))

        handles = [first.register_forward_pre_hook(stop, with_kwargs=True)]
        handles += [q.register_forward_pre_hook(seen) for q in outside.values()]
        try:
            with torch.no_grad():
                for index, batch in enumerate(batches):
                    if num_batches is not None and index >= num_batches:
                        break
                    self._check_cancel(f"after {self.done} batches (capturing the inputs of {first_name})")
                    try:
                        run_model(self.model, batch, self.device)
                    except _Reached as inputs:
                        args, kwargs = inputs.inputs
                    except Exception as error:  # the user's model: report which batch, keep the cause
                        raise CalibrationError(self.share.index(index), error) from error
                    else:
                        raise CalibrationError(self.share.index(index), ValueError(
                            f"the model returned without calling {first_name}: sequential calibration needs every "
                            f"batch to go through {self.blocks.name}; calibrate without sequential"))
                    hidden, rest, positional = _split_hidden(first_name, args, kwargs)
                    self.contexts.put(index, (batch, rest, positional))
                    self.hidden.put(index, hidden)
                    if nonfinite_share(batch) > MOSTLY_NONFINITE:
                        self.mostly_nonfinite.append(self.share.index(index))
                    self.done += 1
        finally:
            for handle in handles:
                handle.remove()
        self._report(1, f"captured the inputs of {first_name} for {self.done} batches")
        return reached

    def _run_block(self, name: str, block: nn.Module, last: bool, keep: int) -> ActivationStore:
        """Every batch through ``block`` (its quantizers collect); its outputs become the current hidden states.
        The last block keeps its whole output, which the tail pass replays.

        Returns:
            The block's inputs of the first ``keep`` batches (the others are dropped as they are used).
        """
        outputs = ActivationStore(self.spill)
        try:
            with torch.no_grad():
                for index in range(self.done):
                    self._check_cancel(f"in block {name} before batch {index}")
                    _, rest, positional = self.contexts.get(index)
                    hidden = self.hidden.get(index)
                    if index >= keep:
                        self.hidden.drop(index)
                    args, kwargs = rest
                    try:
                        output = block(hidden, *args, **kwargs) if positional else block(
                            *args, hidden_states=hidden, **kwargs)
                    except Exception as error:  # the user's block: say which, and on which batch
                        raise BlockCalibrationError(name, self.share.index(index), error) from error
                    outputs.put(index, output if last else _hidden_of(name, output))
        except BaseException:
            outputs.close()
            raise
        inputs, self.hidden = self.hidden, outputs
        return inputs

    @contextmanager
    def _replaying(self) -> Iterator[list[bool]]:
        """Every block returns the last block's kept output of the batch the model runs (counted by a pre-hook
        on the model: the batches run in order from 0). Yields a flag set once a block has replayed in the
        current batch."""
        current = [-1]
        after = [False]

        def replay(*args: Any, **kwargs: Any) -> Any:
            after[0] = True
            return self.hidden.get(current[0])

        def next_batch(module: nn.Module, args: tuple) -> None:
            current[0] += 1
            after[0] = False

        handle = self.model.register_forward_pre_hook(next_batch)
        for _, block in self.blocks.items:
            block.forward = replay  # an instance attribute: nn.Module.__call__ finds it before the class's
        try:
            yield after
        finally:
            for _, block in self.blocks.items:
                del block.forward
            handle.remove()

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
            with torch.no_grad(), self._replaying() as replayed:
                after = replayed
                for index in range(self.done):
                    self._check_cancel(f"in the modules after {self.blocks.name} before batch {index}")
                    batch = self.contexts.get(index)[0]
                    try:
                        output = run_model(self.model, batch, self.device)
                    except SequentialUnsupported:
                        raise
                    except Exception as error:
                        raise CalibrationError(index, error) from error
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


def _home_device(model: nn.Module) -> torch.device:
    """Where the model's weights live when loaded: its first tensor not on the meta device (a lazily opened model
    has everything there until a block is loaded: the CPU then)."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.device.type != "meta":
            return tensor.device
    return torch.device("cpu")


def _is_cache(value: Any) -> bool:
    """Whether ``value`` is a Hugging Face key/value cache (a model run with ``use_cache`` passes one to every
    block). Sequential runs drop it: kept per batch it would hold every block's keys and values of every batch at
    once, and a second walk would attend to the first walk's keys too. On a first forward the cache only echoes
    the block's own keys and values, so without it a block computes the same."""
    cache_utils = sys.modules.get("transformers.cache_utils")  # loaded whenever a transformers model runs
    cache = getattr(cache_utils, "Cache", None)
    return cache is not None and isinstance(value, cache)


def _split_hidden(block: str, args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple[tuple, dict], bool]:
    """The first block's hidden-state input, the rest of its inputs, and whether the hidden states came first
    among the positional arguments (else as ``hidden_states=``)."""
    args = tuple(None if _is_cache(value) else value for value in args)
    kwargs = {key: None if _is_cache(value) else value for key, value in kwargs.items()}
    if args and isinstance(args[0], torch.Tensor):
        return args[0], (tuple(args[1:]), kwargs), True
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        rest = {key: value for key, value in kwargs.items() if key != "hidden_states"}
        return kwargs["hidden_states"], (tuple(args), rest), False
    raise SequentialUnsupported(f"{block} is called without a tensor as its first argument or hidden_states=: "
                                "sequential calibration cannot tell which input flows from block to block; calibrate "
                                "without sequential.")


def _as_keywords(name: str, block: nn.Module, hidden: torch.Tensor, rest: tuple[tuple, dict],
                 positional: bool) -> dict[str, Any]:
    """A block's inputs as one mapping of keyword arguments (a batch :func:`run_model` can give the block)."""
    signature = inspect.signature(block.forward)
    args, kwargs = rest
    try:
        bound = (signature.bind_partial(hidden, *args, **kwargs) if positional
                 else signature.bind_partial(*args, hidden_states=hidden, **kwargs))
    except TypeError as error:
        raise SequentialUnsupported(f"{name}'s inputs do not fit its forward's signature ({error}): 'auto' cannot "
                                    "measure its candidates; pick a method.") from error
    keywords: dict[str, Any] = {}
    for key, value in bound.arguments.items():
        kind = signature.parameters[key].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise SequentialUnsupported(f"{name} takes *args: 'auto' cannot name its inputs; pick a method.")
        else:
            keywords[key] = value
    return keywords


def _hidden_of(block: str, output: Any) -> torch.Tensor:
    """A block's hidden-state output: the tensor it returns, or the first item of its tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise SequentialUnsupported(f"{block} returned {type(output).__name__}, not a tensor or a tuple starting with one: "
                     "sequential calibration cannot pass it to the next block; calibrate without sequential.")
