"""Walking a model one block at a time: the machinery sequential calibration and per-block smoothing share.

A model whose parameters are mostly in a list of identical blocks (``model.layers`` of a Hugging Face decoder,
GPT-2's ``transformer.h``, BERT's ``encoder.layer``; :func:`find_blocks`) is run as llm-compressor's "sequential
onloading" runs it: a *capture pass* runs every batch until the first block is called (a forward pre-hook stops it
there) and keeps that block's inputs; each block then runs on every batch's inputs with its weights loaded
(:class:`~workbench.quant.algorithms.residency.BlockResidency`) and its outputs become the next block's inputs;
a *tail pass* runs the model once more with every block replaying the last block's outputs, so that the modules
after the blocks run on what they get in a whole-model forward. Activations between blocks stay in memory within a
budget and go to a temporary folder beyond it (:mod:`workbench.quant.algorithms.activation_store`).

Every block sees the very inputs it sees in a whole-model forward, batch by batch in the same order, so whatever is
accumulated per module (calibrators, smoothing statistics) is bit-identical to the whole-model run's.

A Hugging Face key/value cache among the blocks' inputs is dropped (a first forward computes the same without it).
Assumptions, said where they could matter: every block gets the same extra inputs (mask, position embeddings) as
the first one, and its hidden-state input is its first positional argument (or ``hidden_states=``); a block
returns its hidden states, or a tuple whose first item they are.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.activation_store import ActivationStore, SpillFolder
from workbench.quant.algorithms.batches import run_model
from workbench.quant.algorithms.calibration_collect import MOSTLY_NONFINITE, forget_collected_weights, nonfinite_share
from workbench.quant.algorithms.calibration_results import (
    CalibrationCancelled,
    CalibrationError,
    CancelToken,
    ProgressCallback,
)
from workbench.quant.algorithms.residency import BlockResidency

__all__ = ["NO_BATCHES", "Blocks", "BlockWalk", "BlockCalibrationError", "SequentialUnsupported", "find_blocks",
           "no_blocks_reason", "MIN_BLOCK_SHARE", "as_keywords", "home_device"]

NO_BATCHES = "No calibration batches: the data source yielded nothing."

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


class BlockWalk:
    """The state of one walk over a model's blocks: the stores of the batches and of the hidden states between
    blocks, the residency that loads and releases each block, progress and cancel.

    Args:
        model, blocks: the model and its blocks (:func:`find_blocks`).
        residency: loads and releases each block's weights (and the modules outside the blocks).
        device: where each block runs (moved there after loading, back before release); default: the model's.
        progress, cancel: ``progress(done, steps, message)``; ``cancel.is_set()`` checked before each batch.
        spill: the activations' memory budget and temporary folder (closed by :meth:`close`).
        steps: the total ``progress`` counts to.
    """

    def __init__(self, model: nn.Module, blocks: Blocks, residency: BlockResidency, device: torch.device | str | None,
                 progress: ProgressCallback | None, cancel: CancelToken | None, spill: SpillFolder,
                 steps: int) -> None:
        self.model, self.blocks, self.residency = model, blocks, residency
        self.home = home_device(model)
        self.device = torch.device(device) if device is not None else self.home
        self.progress, self.cancel, self.spill = progress, cancel, spill
        self.steps = steps
        self.done = 0
        # refuse a walk over no batches (a distributed rank may have none of its own: its caller checks the total)
        self.require_batches_at_capture = True
        self.mostly_nonfinite: list[int] = []
        # per batch: (the batch, the first block's inputs but the hidden states, whether those were positional)
        self.contexts = ActivationStore(spill)
        self.hidden = ActivationStore(spill)  # the hidden states going into the current block

    def close(self) -> None:
        """Forget every kept batch and remove the temporary folder."""
        self.contexts.close()
        self.hidden.close()
        self.spill.close()

    def check_cancel(self, where: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CalibrationCancelled(f"Calibration cancelled {where}.")

    def report(self, step: int, message: str) -> None:
        if self.progress is not None:
            self.progress(step, self.steps, message)

    def batch_index(self, local: int) -> int:
        """The number a user knows batch ``local`` of this walk by (a distributed rank walks its share of the
        batches: errors and warnings name the batch's place among all of them)."""
        return local

    @contextmanager
    def block_in_memory(self, name: str, module: nn.Module) -> Iterator[None]:
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
    def outside_loaded(self) -> Iterator[None]:
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

    def capture(self, batches: Iterable, num_batches: int | None, watched: Iterable[nn.Module] = ()) -> set[int]:
        """Run each batch up to the first block (the modules before it collect); keep that block's inputs.

        Returns:
            The ids of the ``watched`` modules (quantizers outside the blocks) that ran in this pass (to bypass in
            the tail pass).
        """
        first_name, first = self.blocks.items[0]
        reached: set[int] = set()

        def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
            raise _Reached(args, kwargs)

        def seen(module: nn.Module, args: tuple) -> None:
            reached.add(id(module))

        handles = [first.register_forward_pre_hook(stop, with_kwargs=True)]
        handles += [module.register_forward_pre_hook(seen) for module in watched]
        try:
            with torch.no_grad():
                for index, batch in enumerate(batches):
                    if num_batches is not None and index >= num_batches:
                        break
                    self.check_cancel(f"after {self.done} batches (capturing the inputs of {first_name})")
                    try:
                        run_model(self.model, batch, self.device)
                    except _Reached as inputs:
                        args, kwargs = inputs.inputs
                    except Exception as error:  # the user's model: report which batch, keep the cause
                        raise CalibrationError(self.batch_index(index), error) from error
                    else:
                        raise CalibrationError(self.batch_index(index), ValueError(
                            f"the model returned without calling {first_name}: sequential calibration needs every "
                            f"batch to go through {self.blocks.name}; calibrate without sequential"))
                    hidden, rest, positional = split_hidden(first_name, args, kwargs)
                    self.contexts.put(index, (batch, rest, positional))
                    self.hidden.put(index, hidden)
                    if nonfinite_share(batch) > MOSTLY_NONFINITE:
                        self.mostly_nonfinite.append(self.batch_index(index))
                    self.done += 1
        finally:
            for handle in handles:
                handle.remove()
        if self.done == 0 and self.require_batches_at_capture:
            raise ValueError(NO_BATCHES)
        self.report(1, f"captured the inputs of {first_name} for {self.done} batches")
        return reached

    def run_block(self, name: str, block: nn.Module, last: bool, keep: int,
                  after_batch: Callable[[], None] | None = None) -> ActivationStore:
        """Every batch through ``block`` (its quantizers collect); its outputs become the current hidden states.
        The last block keeps its whole output, which the tail pass replays. ``after_batch()`` runs after each
        batch (a collector that reads the first batch's data flow).

        Returns:
            The block's inputs of the first ``keep`` batches (the others are dropped as they are used).
        """
        outputs = ActivationStore(self.spill)
        try:
            with torch.no_grad():
                for index in range(self.done):
                    self.check_cancel(f"in block {name} before batch {index}")
                    hidden = self.hidden.get(index)
                    if index >= keep:
                        self.hidden.drop(index)
                    try:
                        output = self.call_block(block, index, hidden)
                    except Exception as error:  # the user's block: say which, and on which batch
                        raise BlockCalibrationError(name, self.batch_index(index), error) from error
                    outputs.put(index, output if last else hidden_of(name, output))
                    if after_batch is not None:
                        after_batch()
        except BaseException:
            outputs.close()
            raise
        inputs, self.hidden = self.hidden, outputs
        return inputs

    def call_block(self, block: nn.Module, index: int, hidden: torch.Tensor) -> Any:
        """``block`` (a block, or a copy of one) on batch ``index``'s inputs with ``hidden`` as its hidden states."""
        _, (args, kwargs), positional = self.contexts.get(index)
        return block(hidden, *args, **kwargs) if positional else block(*args, hidden_states=hidden, **kwargs)

    @contextmanager
    def replaying(self, model: nn.Module | None = None) -> Iterator[list[bool]]:
        """Every block returns the last block's kept output of the batch the model runs (counted by a pre-hook
        on the model: the batches run in order from 0). Yields a flag set once a block has replayed in the
        current batch. ``model``: a structural copy of the walk's model to replay in instead (its blocks by the
        same names)."""
        model = model if model is not None else self.model
        blocks = [model.get_submodule(name) for name, _ in self.blocks.items]
        current = [-1]
        after = [False]

        def replay(*args: Any, **kwargs: Any) -> Any:
            after[0] = True
            return self.hidden.get(current[0])

        def next_batch(module: nn.Module, args: tuple) -> None:
            current[0] += 1
            after[0] = False

        handle = model.register_forward_pre_hook(next_batch)
        for block in blocks:
            block.forward = replay  # an instance attribute: nn.Module.__call__ finds it before the class's
        try:
            yield after
        finally:
            for block in blocks:
                del block.forward
            handle.remove()

    def capture_again(self) -> None:
        """The first block's inputs of every kept batch, computed again from the kept batches (the modules before
        the blocks as the model has them now), replacing the current hidden states."""
        first_name, first = self.blocks.items[0]

        def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
            raise _Reached(args, kwargs)

        self.hidden.close()
        self.hidden = ActivationStore(self.spill)
        handle = first.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            with torch.no_grad():
                for index in range(self.done):
                    try:
                        run_model(self.model, self.contexts.get(index)[0], self.device)
                    except _Reached as reached:
                        self.hidden.put(index, split_hidden(first_name, *reached.inputs)[0])
                    except Exception as error:
                        raise CalibrationError(index, error) from error
        finally:
            handle.remove()


def home_device(model: nn.Module) -> torch.device:
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


def split_hidden(block: str, args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple[tuple, dict], bool]:
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


def as_keywords(name: str, block: nn.Module, hidden: torch.Tensor, rest: tuple[tuple, dict],
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


def hidden_of(block: str, output: Any) -> torch.Tensor:
    """A block's hidden-state output: the tensor it returns, or the first item of its tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise SequentialUnsupported(f"{block} returned {type(output).__name__}, not a tensor or a tuple starting with one: "
                     "sequential calibration cannot pass it to the next block; calibrate without sequential.")
