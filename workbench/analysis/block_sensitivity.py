"""Sensitivity one block at a time (issue 37 point 3): each unit's cost measured as the SQNR of its *block's*
output with that unit alone quantized against the block in float, the blocks run one at a time from their cached
float inputs, one block's weights resident.

The whole-model "one-on" ranking runs the model once per unit; here each block runs once per unit of its own on
the float inputs the walk keeps (:class:`~workbench.quant.algorithms.block_walk.BlockWalk`), and the units outside
the blocks (``lm_head``) run in the replayed tail pass. The value is a local measure: a unit's SQNR at its block's
output, not at the model's, so units of different blocks compare by how much noise they add where they sit; on
clearly separated units the order agrees with the whole-model ranking (tests/analysis/test_block_sensitivity.py).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable

import torch
from torch import nn

from workbench.analysis.results import SensitivityResult, UnitResult, difference, rank_units
from workbench.analysis.units import UnitsSpec, resolve_units
from workbench.quant.algorithms.activation_store import ACTIVATION_BUDGET, SpillFolder
from workbench.quant.algorithms.batches import run_model, sqnr_powers
from workbench.quant.algorithms.block_walk import BlockWalk, find_blocks, hidden_of, no_blocks_reason
from workbench.quant.algorithms.calibration_results import CalibrationError, CancelToken, ProgressCallback
from workbench.quant.algorithms.residency import AllResident, BlockResidency
from workbench.quant.algorithms.snapshot import ModelSnapshot, quantizer_names

__all__ = ["BLOCK_SQNR", "block_sensitivity"]

BLOCK_SQNR = {"name": "block output SQNR", "kind": "block-sqnr", "direction": "higher"}


def _db(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


def block_sensitivity(model: nn.Module, batches: Iterable, *, units: UnitsSpec = None,
                      num_batches: int | None = None, residency: BlockResidency | None = None,
                      device: torch.device | str | None = None, budget_bytes: int = ACTIVATION_BUDGET,
                      progress: ProgressCallback | None = None,
                      cancel: CancelToken | None = None) -> SensitivityResult:
    """Rank the units of the calibrated quantized ``model`` by the SQNR of their block's output with the unit
    alone quantized (scheme "one-on", metric :data:`BLOCK_SQNR`); see the module's docstring.

    ``fp32`` is +inf (a block in float against itself); ``quantized`` is the lowest block SQNR with every unit of
    that block quantized together. The model is left as it came in (quantizer flags).

    Raises:
        ValueError: a model without repeated blocks (rank it whole), no units, no batches.
        CalibrationError, CalibrationCancelled: a block that fails (named), or a set ``cancel``.
    """
    blocks = find_blocks(model)
    if blocks is None:
        raise ValueError(f"Sensitivity one block at a time: {no_blocks_reason(model)}; rank the whole model "
                         "(without --sequential).")
    resolved = resolve_units(model, units)
    quantizers = quantizer_names(model)
    chosen = {name for unit in resolved for name in unit.quantizers}
    started = time.perf_counter()
    walk = BlockWalk(model, blocks, residency or AllResident(), device, progress, cancel, SpillFolder(budget_bytes),
                     steps=len(blocks.items) + 2)
    snapshot = ModelSnapshot(model)
    values: dict[str, float] = {}
    block_quantized: list[float] = []

    def only(names: Iterable[str]) -> None:
        wanted = set(names)
        for name, quantizer in quantizers.items():
            if name in chosen or name in wanted:
                (quantizer.enable if name in wanted else quantizer.disable)()

    try:
        model.eval()
        only(())
        with walk.outside_loaded():
            walk.capture(batches, num_batches)
            for step, (name, block) in enumerate(blocks.items, start=1):
                mine = [unit for unit in resolved if all(q.startswith(name + ".") for q in unit.quantizers)]
                with walk.block_in_memory(name, block):
                    inputs = walk.run_block(name, block, step == len(blocks.items), keep=walk.done)
                    try:
                        for unit in mine + ([None] if mine else []):  # None: all of the block's units at once
                            only(unit.quantizers if unit is not None else [q for u in mine for q in u.quantizers])
                            signal = noise = 0.0
                            with torch.no_grad():
                                for index in range(walk.done):
                                    walk.check_cancel(f"in block {name} before batch {index}")
                                    output = walk.call_block(block, index, inputs.get(index))
                                    powers = sqnr_powers(hidden_of(name, walk.hidden.get(index)),
                                                         hidden_of(name, output))
                                    signal, noise = signal + powers[0], noise + powers[1]
                            if unit is None:
                                block_quantized.append(_db(signal, noise))
                            else:
                                values[unit.name] = _db(signal, noise)
                    finally:
                        only(())
                        inputs.close()
                walk.report(step + 1, f"sensitivity: block {name} ({step} of {len(blocks.items)})")
            outside = [unit for unit in resolved if unit.name not in values]
            if outside:
                _tail(walk, outside, only, values)
        walk.report(walk.steps, "sensitivity: the units after the blocks")
    finally:
        walk.close()
        snapshot.restore_flags()
    result_units = [UnitResult(unit.name, list(unit.quantizers), values[unit.name],
                               difference(values[unit.name], min(block_quantized, default=math.inf)),
                               difference(values[unit.name], math.inf)) for unit in resolved]
    rank_units(result_units, "one-on", higher_is_better=True)
    return SensitivityResult(scheme="one-on", metric=dict(BLOCK_SQNR), fp32=math.inf,
                             quantized=min(block_quantized, default=math.inf), units=result_units,
                             num_batches=walk.done, wall_time_s=time.perf_counter() - started, cache="blocks",
                             cache_note=f"one block at a time: {blocks.describe()}")


def _tail(walk: BlockWalk, outside: list, only, values: dict[str, float]) -> None:
    """The units outside the blocks: the model's output with the unit alone quantized, the blocks replaying."""
    references = []
    with walk.replaying(), torch.no_grad():
        for index in range(walk.done):
            references.append(run_model(walk.model, walk.contexts.get(index)[0], walk.device))
    for unit in outside:
        only(unit.quantizers)
        signal = noise = 0.0
        with walk.replaying(), torch.no_grad():
            for index in range(walk.done):
                walk.check_cancel(f"in the modules after {walk.blocks.name} before batch {index}")
                try:
                    output = run_model(walk.model, walk.contexts.get(index)[0], walk.device)
                except Exception as error:
                    raise CalibrationError(index, error) from error
                powers = sqnr_powers(references[index], output)
                if powers is not None:
                    signal, noise = signal + powers[0], noise + powers[1]
        only(())
        values[unit.name] = _db(signal, noise)
