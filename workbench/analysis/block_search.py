"""The fallback and ladder searches one block at a time (issue 37 point 3): per-unit costs measured block by block
on the :class:`~workbench.quant.algorithms.block_walk.BlockWalk`, one block's weights resident, then one global
choice (Model Optimizer's AutoQuantize: per-layer scores, one budget), checked end to end.

1. **Costing walk.** Each block runs on the float inputs the walk keeps (its output in float is the reference);
   then, for each unit of the block and each rung it can take (each precision of a ladder; for the fallback, the
   unit as configured), once more with that unit alone on that rung and the rest of the block in float. The unit's
   cost on that rung is the noise-to-signal power ratio it adds at its block's output, ``N/S`` summed over the
   batches; in float it costs nothing. Units after the blocks (``lm_head``) are costed at the model's output in the
   tail pass. The same walk carries a second stream, every unit on its first rung, from block to block: the start
   (every unit on its first rung) is measured end to end, as the model output's SQNR against the float model's.
2. **One global choice.** The model-level goal is the output SQNR the whole-model searches measure (``--target`` in
   dB, or ``--tolerance`` dB above the start): a noise budget ``N/S <= 10**(-target/10)`` at the model's output.
   Noises added by different units are taken to add in power (independent errors along the residual stream), so a
   mix's predicted ``N/S`` is the sum of its units' costs, scaled by ``k`` = the start's measured ``N/S`` over its
   predicted one (what the rest of the network does to a block's noise on average). Read per block, the goal is a
   share of that one budget: with equal shares each of N blocks must reach ``target + 10*log10(N)`` dB at its own
   output; the global choice lets blocks trade shares (a block whose units are dear to promote keeps more noise).
   The choice is a multiple-choice knapsack solved greedily, as AutoQuantize's is: promotions in order of noise
   removed per weight byte added (the fallback: per unit put in float, so the costliest units go first), until the
   predicted output SQNR reaches the target, or while the weights fit a byte budget.
3. **Checking walk.** The chosen mix runs end to end, block by block against the float stream: its output SQNR is
   measured, not predicted, and decides "reached". When it misses the target (the noises did not add as
   independent ones), the budget is tightened by the miss and the choice made again: at most
   :data:`CHECK_WALKS` checking walks.

Why not a greedy per block with a fixed share each: one global decision spends the budget where it is cheapest
(the whole-model ladder's order: the unit that buys most first), a byte budget is a global constraint a per-block
greedy cannot share out without knowing the other blocks, and the walks stay fixed (one costing walk, one to three
checking walks) whatever the number of units, where a measured greedy needs a walk per promotion.

The result types are the whole-model searches' (:class:`~workbench.analysis.results.FallbackResult`,
:class:`~workbench.analysis.ladder.LadderResult`) with ``walk`` set: their summary says "measured block by block".
The curve's first and last points are measured end to end; the points between are predicted (the notes say so).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from workbench.analysis.errors import AnalysisCancelled
from workbench.analysis.units import Unit
from workbench.plurals import count_text
from workbench.quant.algorithms.activation_store import ACTIVATION_BUDGET, ActivationStore, SpillFolder
from workbench.quant.algorithms.batches import run_model, select_output, sqnr_powers
from workbench.quant.algorithms.block_walk import (
    BlockCalibrationError,
    Blocks,
    BlockWalk,
    find_blocks,
    hidden_of,
    no_blocks_reason,
)
from workbench.quant.algorithms.calibration_results import (
    CalibrationCancelled,
    CalibrationError,
    CancelToken,
    ProgressCallback,
)
from workbench.quant.algorithms.residency import AllResident, BlockResidency
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["CHECK_WALKS", "Levels", "Costs", "Choice", "blocks_or_refuse", "cost_walk", "check_walk", "choose",
           "ratio_db", "db_ratio", "WalkOptions", "choose_and_check"]

CHECK_WALKS = 3  # checking walks at most: the first choice, then up to two with the budget tightened by the miss


class Levels(Protocol):
    """The rungs each unit can take and how to put it on one (a ladder's precisions; the fallback's on/float)."""

    def rungs(self, unit: Unit) -> list[int]:
        """The levels ``unit`` can take, cheapest first (its first is where the search starts it)."""
        ...

    def set(self, unit: Unit, level: int) -> None:
        """Run ``unit`` on ``level`` (its quantizers swapped in and enabled, or off for float)."""
        ...

    def is_float(self, level: int) -> bool:
        """Whether ``level`` leaves the unit in float (it costs nothing)."""
        ...

    def label(self, level: int) -> str:
        """The level's name for people (``"fp8"``, ``"float"``)."""
        ...


@dataclass
class WalkOptions:
    """What every walk of one search shares: the residency, the device, the activations' memory budget, the output
    entry compared, progress and cancel."""

    residency: BlockResidency = field(default_factory=AllResident)
    device: torch.device | str | None = None
    budget_bytes: int = ACTIVATION_BUDGET
    output: str | None = None
    progress: ProgressCallback | None = None
    cancel: CancelToken | None = None
    walks: int = 2  # how many walks the progress bar counts (each: the blocks, then the tail)
    walk_index: int = 0


@dataclass
class Costs:
    """What a costing walk measured: each unit's ``N/S`` on each level it can take (float: 0), the start's measured
    ``N/S`` at the model's output, and how many batches."""

    cost: dict[str, dict[int, float]]
    start_ratio: float
    num_batches: int

    def predicted(self, levels: Mapping[str, int]) -> float:
        """The sum of the units' costs on ``levels``."""
        return sum(self.cost[name][level] for name, level in levels.items())


@dataclass
class Choice:
    """A mix chosen from the costs: each unit's level, the promotions in the order chosen (unit, level, predicted
    ``N/S`` after it, size after it) and the predicted ``N/S`` of the mix."""

    levels: dict[str, int]
    moves: list[tuple[str, int, float, float]]
    predicted: float


def ratio_db(ratio: float) -> float:
    """``N/S`` -> SQNR in dB."""
    if ratio <= 0:
        return math.inf
    return -math.inf if math.isinf(ratio) else -10 * math.log10(ratio)


def db_ratio(db: float) -> float:
    """SQNR in dB -> ``N/S``."""
    return 0.0 if db == math.inf else math.inf if db == -math.inf else 10 ** (-db / 10)


def blocks_or_refuse(model: nn.Module, what: str) -> Blocks:
    """The model's blocks; a ValueError naming why and what to run instead when it has none."""
    blocks = find_blocks(model)
    if blocks is None:
        raise ValueError(f"{what} one block at a time: {no_blocks_reason(model)}; search the whole model "
                         "(without --sequential).")
    return blocks


@contextmanager
def _only(module: nn.Module, keep: Iterable[TensorQuantizer] = ()) -> Iterator[None]:
    """Every quantizer under ``module`` off but ``keep`` (as they are); their flags back afterwards."""
    kept = {id(q) for q in keep}
    flags = [(q, q.is_enabled) for q in module.modules() if isinstance(q, TensorQuantizer) and id(q) not in kept]
    for quantizer, _ in flags:
        quantizer.disable()
    try:
        yield
    finally:
        for quantizer, enabled in flags:
            quantizer.enable() if enabled else quantizer.disable()


def _on_each_level(unit: Unit, levels: Levels, stream: Mapping[str, int],
                   measure: Callable[[], float]) -> dict[int, float]:
    """``measure()`` (an ``N/S``) with ``unit`` on each of its levels, 0 on float; the unit back on its stream level
    after."""
    found: dict[int, float] = {}
    try:
        for level in levels.rungs(unit):
            if levels.is_float(level):
                found[level] = 0.0
                continue
            levels.set(unit, level)
            found[level] = measure()
    finally:
        levels.set(unit, stream[unit.name])
    return found


def _running(model: nn.Module, unit: Unit) -> list[TensorQuantizer]:
    """The quantizer objects that run ``unit``'s places now (a ladder swaps its rungs' into the model)."""
    return [model.get_submodule(name) for name in unit.quantizers]


def _placed(blocks: Blocks, units: Sequence[Unit]) -> tuple[dict[str, list[Unit]], list[Unit]]:
    """Each block's units (all their quantizers under it) and the units left for the tail pass."""
    mine: dict[str, list[Unit]] = {name: [] for name, _ in blocks.items}
    tail = []
    for unit in units:
        home = next((name for name, _ in blocks.items if all(q.startswith(name + ".") for q in unit.quantizers)),
                    None)
        (mine[home] if home is not None else tail).append(unit)
    return mine, tail


class _Pooled:
    """Signal and noise powers summed over batches."""

    def __init__(self) -> None:
        self.signal = self.noise = 0.0

    def add(self, reference: Any, output: Any) -> None:
        powers = sqnr_powers(reference, output)
        if powers is not None:
            self.signal += powers[0]
            self.noise += powers[1]

    @property
    def ratio(self) -> float:
        if self.noise == 0:
            return 0.0
        return math.inf if self.signal == 0 else self.noise / self.signal


class _Walk(BlockWalk):
    """One walk of a search: the float stream (the walk's own hidden states) and a quantized stream beside it, the
    units' levels set by ``levels`` as ``stream`` says; with ``costing``, each unit's cost on each rung too."""

    def __init__(self, model: nn.Module, blocks: Blocks, options: WalkOptions) -> None:
        steps = options.walks * (len(blocks.items) + 2)
        super().__init__(model, blocks, options.residency, options.device, options.progress, options.cancel,
                         SpillFolder(options.budget_bytes), steps)
        self.options = options
        self.done_steps = options.walk_index * (len(blocks.items) + 2)

    def check_cancel(self, where: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise AnalysisCancelled(f"Search cancelled {where}.")

    def report(self, step: int, message: str) -> None:
        # this walk's steps come after the earlier walks' on one bar
        super().report(self.done_steps + step, message)

    def run(self, batches: Iterable, num_batches: int | None, units: Sequence[Unit], levels: Levels,
            stream: Mapping[str, int], costing: bool, what: str) -> tuple[dict[str, dict[int, float]], float]:
        """The walk; returns the costs (empty without ``costing``) and the quantized stream's ``N/S`` at the
        model's output."""
        mine, tail = _placed(self.blocks, units)
        costs: dict[str, dict[int, float]] = {}
        quantized: ActivationStore | None = None  # the quantized stream's hidden states into the current block
        try:
            for unit in units:
                levels.set(unit, stream[unit.name])
            with self.outside_loaded():
                with _only(self.model):
                    self.capture(batches, num_batches)
                self.report(1, f"{what}: captured the inputs of {self.blocks.items[0][0]}")
                for step, (name, block) in enumerate(self.blocks.items, start=1):
                    last = step == len(self.blocks.items)
                    with self.block_in_memory(name, block):
                        with _only(block):
                            inputs = self.run_block(name, block, last, keep=self.done)
                        try:
                            quantized = self._quantized_block(name, block, last, quantized, inputs)
                            if costing:
                                for unit in mine[name]:
                                    costs[unit.name] = self._unit_costs(name, block, unit, levels, stream, inputs)
                        finally:
                            inputs.close()
                    self.report(1 + step, f"{what}: block {name} ({step} of "
                                                            f"{len(self.blocks.items)})")
                ratio = self._tail(tail, levels, stream, costs if costing else None, quantized)
        finally:
            if quantized is not None:
                quantized.close()
        self.report(len(self.blocks.items) + 2, f"{what}: the modules after the blocks")
        return costs, ratio

    def _quantized_block(self, name: str, block: nn.Module, last: bool, previous: ActivationStore | None,
                         floats: ActivationStore) -> ActivationStore:
        """Every batch through ``block`` as configured, from the quantized stream's inputs (the float ones into the
        first block); the outputs are the stream's next inputs."""
        outputs = ActivationStore(self.spill)
        try:
            with torch.no_grad():
                for index in range(self.done):
                    self.check_cancel(f"in block {name} before batch {index}")
                    hidden = (previous if previous is not None else floats).get(index)
                    try:
                        output = self.call_block(block, index, hidden)
                    except Exception as error:  # the user's block: say which, and on which batch
                        raise BlockCalibrationError(name, index, error) from error
                    outputs.put(index, output if last else hidden_of(name, output))
        except BaseException:
            outputs.close()
            raise
        if previous is not None:
            previous.close()
        return outputs

    def _unit_costs(self, name: str, block: nn.Module, unit: Unit, levels: Levels, stream: Mapping[str, int],
                    inputs: ActivationStore) -> dict[int, float]:
        """``unit``'s ``N/S`` at the block's output on each of its levels, alone quantized in the block."""
        def measure() -> float:
            pooled = _Pooled()
            with _only(block, _running(self.model, unit)), torch.no_grad():
                for index in range(self.done):
                    self.check_cancel(f"in block {name} before batch {index}")
                    output = self.call_block(block, index, inputs.get(index))
                    pooled.add(hidden_of(name, self.hidden.get(index)), hidden_of(name, output))
            return pooled.ratio

        return _on_each_level(unit, levels, stream, measure)

    def _tail(self, tail: Sequence[Unit], levels: Levels, stream: Mapping[str, int],
              costs: dict[str, dict[int, float]] | None, quantized: ActivationStore | None) -> float:
        """The model's outputs, the blocks replaying: in float (the reference), from the quantized stream (its
        ``N/S``, returned), and with each tail unit alone on each level (its cost, when costing)."""
        references = ActivationStore(self.spill)
        try:
            with _only(self.model), self.replaying(), torch.no_grad():
                for index in range(self.done):
                    references.put(index, self._output(index))
            pooled = _Pooled()
            floats, self.hidden = self.hidden, quantized if quantized is not None else self.hidden
            try:
                with self.replaying(), torch.no_grad():
                    for index in range(self.done):
                        pooled.add(references.get(index), self._output(index))
            finally:
                self.hidden = floats
            for unit in tail if costs is not None else ():
                def measure(unit: Unit = unit) -> float:
                    alone = _Pooled()
                    with _only(self.model, _running(self.model, unit)), self.replaying(), torch.no_grad():
                        for index in range(self.done):
                            alone.add(references.get(index), self._output(index))
                    return alone.ratio

                costs[unit.name] = _on_each_level(unit, levels, stream, measure)
        finally:
            references.close()
        return pooled.ratio

    def _output(self, index: int) -> Any:
        self.check_cancel(f"in the modules after {self.blocks.name} before batch {index}")
        try:
            return select_output(run_model(self.model, self.contexts.get(index)[0], self.device), self.options.output)
        except AnalysisCancelled:
            raise
        except Exception as error:
            raise CalibrationError(index, error) from error


def _walk(model: nn.Module, blocks: Blocks, batches: list, units: Sequence[Unit], levels: Levels,
          stream: Mapping[str, int], costing: bool, options: WalkOptions, what: str
          ) -> tuple[dict[str, dict[int, float]], float, int]:
    options.walks = max(options.walks, options.walk_index + 1)
    walk = _Walk(model, blocks, options)
    try:
        model.eval()
        costs, ratio = walk.run(batches, None, units, levels, stream, costing, what)
        return costs, ratio, walk.done
    except CalibrationCancelled as cancelled:  # a cancel seen by the walk's own passes
        raise AnalysisCancelled(str(cancelled)) from None
    finally:
        walk.close()
        options.walk_index += 1


def cost_walk(model: nn.Module, blocks: Blocks, batches: list, units: Sequence[Unit], levels: Levels,
              start: Mapping[str, int], options: WalkOptions) -> Costs:
    """The costing walk (see the module's docstring): every unit's cost on every level, and the start's measured
    ``N/S`` (every unit on ``start``)."""
    costs, ratio, done = _walk(model, blocks, batches, units, levels, start, True, options, "costing the units")
    return Costs(costs, ratio, done)


def check_walk(model: nn.Module, blocks: Blocks, batches: list, units: Sequence[Unit], levels: Levels,
               mix: Mapping[str, int], options: WalkOptions) -> float:
    """The checking walk: the model output's ``N/S`` with every unit on its level in ``mix``, measured end to end
    block by block."""
    return _walk(model, blocks, batches, units, levels, mix, False, options, "measuring the chosen mix")[1]


def choose(costs: Costs, levels: Levels, units: Sequence[Unit], start: Mapping[str, int], *, scale: float,
           budget_ratio: float | None, size: Callable[[Unit, int], float], budget_size: float | None = None,
           limit: int | None = None) -> Choice:
    """The greedy multiple-choice knapsack over the measured costs: from ``start``, the promotion removing the most
    predicted noise (``scale`` times the costs) per unit of ``size`` added goes first, and only one that removes
    noise; until the predicted ``N/S`` is within ``budget_ratio`` (None: no noise goal), or no promotion fits
    ``budget_size`` (sizes summed over the units' levels), or ``limit`` promotions were made."""
    state = dict(start)
    total = scale * costs.predicted(state)
    used = sum(size(u, state[u.name]) for u in units)
    moves: list[tuple[str, int, float, float]] = []
    while (budget_ratio is None or total > budget_ratio) and (limit is None or len(moves) < limit):
        best: tuple[float, float, Unit, int] | None = None
        for unit in units:
            now = state[unit.name]
            for level in levels.rungs(unit):
                if level <= now:
                    continue
                gain = scale * (costs.cost[unit.name][now] - costs.cost[unit.name][level])
                extra = size(unit, level) - size(unit, now)
                if not gain > 0 or (budget_size is not None and used + extra > budget_size):
                    continue
                worth = gain / extra if extra > 0 else math.inf
                if best is None or (worth, gain) > (best[0], best[1]):
                    best = (worth, gain, unit, level)
        if best is None:
            break
        _, gain, unit, level = best
        used += size(unit, level) - size(unit, state[unit.name])
        state[unit.name] = level
        total = scale * costs.predicted(state)
        moves.append((unit.name, level, total, used))
    return Choice(state, moves, total)


def choose_and_check(model: nn.Module, blocks: Blocks, batches: list, units: Sequence[Unit], levels: Levels,
                     start: Mapping[str, int], costs: Costs, options: WalkOptions, *, target_ratio: float | None,
                     size: Callable[[Unit, int], float], budget_size: float | None = None,
                     limit: int | None = None) -> tuple[Choice, float, list[str]]:
    """The global choice (:func:`choose`) and its checking walk, refined: each checking walk re-estimates the scale
    from the predicted to the measured ``N/S`` on the mix it measured (tightening the choice when it missed
    ``target_ratio``, relaxing it when it went past), and the choice is made again, until it repeats or
    :data:`CHECK_WALKS` walks. Returns the cheapest measured mix that reaches the target (else the one measured
    best), its measured ``N/S`` (the start's when it promotes nothing) and notes on the rounds."""
    raw_start = costs.predicted(start)
    # what the rest of the network does to the blocks' noise, on average: the start's measured over its predicted
    scale = costs.start_ratio / raw_start if raw_start > 0 and math.isfinite(costs.start_ratio) else 1.0
    notes: list[str] = []
    tried: list[tuple[Choice, float]] = []
    for _ in range(CHECK_WALKS):
        choice = choose(costs, levels, units, start, scale=scale, budget_ratio=target_ratio, size=size,
                        budget_size=budget_size, limit=limit)
        if any(choice.levels == old.levels for old, _ in tried):
            break
        if not choice.moves:
            tried.append((choice, costs.start_ratio))
            break
        measured = check_walk(model, blocks, batches, units, levels, choice.levels, options)
        tried.append((choice, measured))
        notes.append(f"checking walk {len(tried)}: {count_text(len(choice.moves), 'promotion')}, predicted "
                     f"{ratio_db(choice.predicted):.4g} dB, measured {ratio_db(measured):.4g} dB")
        raw = costs.predicted(choice.levels)
        if target_ratio is None or raw <= 0 or not 0 < measured < math.inf:
            break
        scale = measured / raw
    reaching = [(c, m) for c, m in tried if target_ratio is not None and m <= target_ratio]
    if reaching:
        chosen, measured = min(reaching, key=lambda item: (sum(size(u, item[0].levels[u.name]) for u in units),
                                                           len(item[0].moves)))
    else:
        chosen, measured = min(tried, key=lambda item: item[1])
    if len(tried) > 1:
        notes.append(f"kept the mix of checking walk {[c for c, _ in tried].index(chosen) + 1}: "
                     + ("the cheapest that reaches the target" if reaching else "the best measured"))
    return chosen, measured, notes
