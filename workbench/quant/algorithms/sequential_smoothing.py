"""SmoothQuant and AWQ computed one block at a time, with one block's weights resident (issue 37 point 3).

:func:`plan_smoothing_sequential` gives the records :func:`~workbench.quant.algorithms.smoothing.plan_smoothing`
gives, walking the float model as sequential calibration does (:class:`~workbench.quant.algorithms.block_walk.
BlockWalk`: a capture pass up to the first block, each block on every batch's inputs with its weights loaded,
a tail pass with the blocks replaying the last one's outputs for the modules after them):

- each block's layers collect their per-channel input statistics while the block runs
  (:class:`~workbench.quant.algorithms.smoothing.InputStatistics` hooked on the block), and the block's groups
  are planned while its weights are in memory (SmoothQuant reads the weights' column max; AWQ searches its exponent
  on the kept input rows and the weights), then the block is released with the rows it kept;
- the layers outside the blocks (``lm_head`` after the final norm) collect in the tail pass.

Every block sees the very inputs it sees in the whole-model forward, in the same batch order, so the statistics,
and the scales computed from them, are bit-identical to the whole-model plan's (tests/quant/
test_sequential_smoothing.py checks ``torch.equal``). One difference, on purpose: the trial fold that decides
whether ``1/s`` may go into the producer compares the *block's* output with and without the fold (the whole-model
plan compares the model's); an exact fold passes both, a wrong one (the producer's output read elsewhere in the
block) fails both, and only a fold whose rounding error sits between the two tolerances could be decided
differently.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.activation_store import ACTIVATION_BUDGET, SpillFolder
from workbench.quant.algorithms.batches import run_model
from workbench.quant.algorithms.block_walk import Blocks, BlockWalk, find_blocks, no_blocks_reason
from workbench.quant.algorithms.calibration_results import CalibrationError, CancelToken, ProgressCallback
from workbench.quant.algorithms.precision import DEFAULT_BLOCK_SIZE
from workbench.quant.algorithms.residency import AllResident, BlockResidency
from workbench.quant.algorithms.smoothing import (
    AWQ_ROWS,
    InputStatistics,
    LayerSmoothing,
    checked_method,
    fold_keeps_output,
    int4_blockwise_fake_quant,
    linear_layers,
    plan_groups,
    plan_smoothing,
)

logger = logging.getLogger(__name__)

__all__ = ["plan_smoothing_sequential"]


def plan_smoothing_sequential(model: nn.Module, layers: Sequence[str], batches: Iterable, *,
                              method: str = "smoothquant", alpha: float = 0.5,
                              device: torch.device | str | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                              weight_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
                              num_batches: int | None = None, residency: BlockResidency | None = None,
                              budget_bytes: int = ACTIVATION_BUDGET, spill_dir: str | None = None,
                              progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                              blocks: Blocks | None = None) -> list[LayerSmoothing]:
    """:func:`~workbench.quant.algorithms.smoothing.plan_smoothing`'s records for the Linear ``layers`` of the float
    ``model``, computed one block at a time (see the module's docstring); the model is not changed.

    Args:
        model, layers, batches, method, alpha, block_size, weight_quant: as ``plan_smoothing`` takes them.
        device: where each block runs (default: the model's).
        num_batches: the first batches only (None: all).
        residency: loads and releases each block's weights (default: all in memory); the modules outside the
            blocks are loaded for the whole walk.
        budget_bytes, spill_dir: activations kept in memory between blocks, and where the rest go.
        progress, cancel: ``progress(done, total, message)`` per block; a set ``cancel`` stops the walk
            (:class:`~workbench.quant.algorithms.calibration_results.CalibrationCancelled`).
        blocks: the blocks to walk (default: :func:`~workbench.quant.algorithms.block_walk.find_blocks`); a model
            without them is planned whole (every weight loaded), with a warning.

    Raises:
        SmoothingError: as ``plan_smoothing``.
        CalibrationError (BlockCalibrationError naming the block), CalibrationCancelled, SequentialUnsupported:
            as sequential calibration raises them.
    """
    checked_method(method, alpha)
    found = linear_layers(model, layers)
    if not found:
        return []
    residency = residency or AllResident()
    blocks = blocks if blocks is not None else find_blocks(model)
    if blocks is None:
        logger.warning("Smoothing one block at a time: %s; every weight is loaded and the model planned whole.",
                       no_blocks_reason(model))
        residency.load("", model)
        try:
            chosen = list(batches)[:num_batches] if num_batches is not None else batches
            return plan_smoothing(model, layers, chosen, method=method, alpha=alpha,
                                  device=device if device is not None else "cpu", block_size=block_size,
                                  weight_quant=weight_quant)
        finally:
            residency.release("", model)
    quantize = weight_quant or (lambda w: int4_blockwise_fake_quant(w, block_size))
    keep_rows = AWQ_ROWS if method == "awq" else 0
    walk = BlockWalk(model, blocks, residency, device, progress, cancel, SpillFolder(budget_bytes, spill_dir),
                     steps=len(blocks.items) + 2)
    planned: list[LayerSmoothing] = []
    inside: set[str] = set()
    try:
        model.eval()
        with walk.outside_loaded():
            walk.capture(batches, num_batches)
            walk.report(1, f"captured the inputs of {blocks.items[0][0]} for {walk.done} batches")
            for step, (name, block) in enumerate(blocks.items, start=1):
                mine = {layer: module for layer, module in found.items() if layer.startswith(name + ".")}
                inside.update(mine)
                with walk.block_in_memory(name, block):
                    planned += _plan_block(walk, name, block, step == len(blocks.items), mine, method, alpha,
                                           quantize, keep_rows)
                walk.report(step + 1, f"smoothing: planned block {name} ({step} of {len(blocks.items)})")
            rest = {layer: module for layer, module in found.items() if layer not in inside}
            if rest:
                planned += _plan_tail(walk, rest, method, alpha, quantize, keep_rows)
        walk.report(walk.steps, "smoothing: planned the layers after the blocks")
    finally:
        walk.close()
    return planned


def _plan_block(walk: BlockWalk, name: str, block: nn.Module, last: bool, mine: dict[str, nn.Module], method: str,
                alpha: float, quantize: Callable[[torch.Tensor], torch.Tensor],
                keep_rows: int) -> list[LayerSmoothing]:
    """Run every batch through ``block`` (resident now) with its layers collecting, and plan their groups."""
    if not mine:
        walk.run_block(name, block, last, keep=0).close()
        return []
    collected = InputStatistics(mine, keep_rows)
    with collected.hooks(block, prefix=name + "."):
        inputs = walk.run_block(name, block, last, keep=1, after_batch=collected.batch_done)
    try:
        collected.check_reached()
        first = inputs.get(0)

        def run(module: nn.Module) -> Any:  # the block (or its trial copy) on the first batch's inputs
            return walk.call_block(module, 0, first)

        return plan_groups(block, collected, method, alpha, quantize,
                           lambda items: fold_keeps_output(block, items, run, prefix=name + "."),
                           prefix=name + ".")
    finally:
        inputs.close()


def _plan_tail(walk: BlockWalk, rest: dict[str, nn.Module], method: str, alpha: float,
               quantize: Callable[[torch.Tensor], torch.Tensor], keep_rows: int) -> list[LayerSmoothing]:
    """The layers outside the blocks: every batch through the model with the blocks replaying the last block's
    outputs (the modules before the blocks run again too, as in a forward, and are not counted twice: only the
    layers in ``rest`` collect, once per batch)."""
    model = walk.model
    collected = InputStatistics(rest, keep_rows)
    with collected.hooks(model), walk.replaying(), torch.no_grad():
        for index in range(walk.done):
            walk.check_cancel(f"in the modules after {walk.blocks.name} before batch {index}")
            try:
                run_model(model, walk.contexts.get(index)[0], walk.device)
            except Exception as error:
                raise CalibrationError(index, error) from error
            collected.batch_done()
    collected.check_reached()
    first = walk.contexts.get(0)[0]

    def run(module: nn.Module) -> Any:  # the model (or its trial copy) on the first batch, the blocks replaying
        with walk.replaying(module):
            return run_model(module, first, walk.device)

    return plan_groups(model, collected, method, alpha, quantize, lambda items: fold_keeps_output(model, items, run))
