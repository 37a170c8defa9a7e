"""Which of a model's weights are in memory: the contract between a lazily opened checkpoint and the jobs that
walk a model block by block.

A model opened from a large checkpoint keeps its parameters on the meta device until a job needs them
(``workbench.sources``); a job that walks the model one block at a time (sequential calibration, streamed export)
asks for a block's weights before running it and lets them go afterwards. A model built in memory is
:class:`AllResident`: both calls do nothing, so the same job runs unchanged on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

__all__ = ["AllResident", "BlockResidency", "DerivedWeight", "WithDerivedWeights"]


class BlockResidency(Protocol):
    """Loads and releases the weights of one submodule, named by its path in the model (``model.layers.3``)."""

    def load(self, name: str, module: nn.Module) -> None:
        """Put the real weights of ``module`` (and its children) in memory, in the model's dtype."""
        ...

    def release(self, name: str, module: nn.Module) -> None:
        """Drop the weights of ``module`` again (back to the meta device); quantizers' amax and calibrators stay."""
        ...


class AllResident:
    """Every weight is already in memory: nothing to load or release."""

    def load(self, name: str, module: nn.Module) -> None:
        return None

    def release(self, name: str, module: nn.Module) -> None:
        return None


@dataclass(eq=False)
class DerivedWeight:
    """A parameter of a quantized model computed from another one (a float model's weight): ``source`` times each
    of ``factors`` in turn (broadcast; in float32, rounded to the source's dtype after each), as smoothing folds
    its scales into weights. One definition for both times it is computed: when the quantized model is built from
    weights in memory, and each time a lazily opened model's block is loaded (the target is on meta in between)."""

    target: nn.Parameter
    source: nn.Parameter
    factors: tuple[torch.Tensor, ...]

    @staticmethod
    def compute(source: torch.Tensor, factors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``source`` times ``factors`` in turn, in float32, back in ``source``'s dtype after each."""
        value = source.detach()
        for factor in factors:
            value = (value.float() * factor.to(value.device, torch.float32)).to(source.dtype)
        return value

    def then(self, target: nn.Parameter, factor: torch.Tensor) -> DerivedWeight:
        """The weight derived from this one's target by one more factor, as derived from this one's source."""
        return DerivedWeight(target, self.source, self.factors + (factor,))


class WithDerivedWeights:
    """A residency that also computes the :class:`DerivedWeight` targets of the modules it loads (their sources read
    through ``inner`` for as long as it takes, when they are not in memory) and sends them back to meta on release.

    Args:
        inner: the residency of the float model's weights (a lazily opened checkpoint's, or :class:`AllResident`).
        derived: the derived weights of the model walked.
    """

    def __init__(self, inner: BlockResidency, derived: list[DerivedWeight]) -> None:
        self.inner = inner
        self.derived = derived

    def _under(self, module: nn.Module) -> list[DerivedWeight]:
        held = {id(p) for p in module.parameters()}
        return [item for item in self.derived if id(item.target) in held]

    def load(self, name: str, module: nn.Module) -> None:
        self.inner.load(name, module)
        with torch.no_grad(), torch._C.DisableTorchFunction():
            for item in self._under(module):
                if not item.target.is_meta:
                    continue
                holder = nn.Module()  # the source alone, so that only it is read
                holder.register_parameter("source", item.source)
                borrowed = item.source.is_meta
                if borrowed:
                    self.inner.load(name, holder)
                try:
                    value = DerivedWeight.compute(item.source, item.factors)
                finally:
                    if borrowed:
                        self.inner.release(name, holder)
                torch.utils.swap_tensors(item.target, nn.Parameter(value, requires_grad=item.target.requires_grad))

    def release(self, name: str, module: nn.Module) -> None:
        self.inner.release(name, module)
        if isinstance(self.inner, AllResident):
            return  # every weight stays in memory
        with torch._C.DisableTorchFunction():
            for item in self._under(module):
                if item.target.is_meta:
                    continue
                empty = torch.empty(item.target.shape, dtype=item.target.dtype, device="meta")
                try:
                    torch.utils.swap_tensors(item.target, nn.Parameter(empty, requires_grad=item.target.requires_grad))
                except RuntimeError:  # weakly referenced (a calibrator remembering its last weight): stays loaded
                    pass

    def pending(self) -> bool:
        """Whether a derived weight is on meta now."""
        return any(item.target.is_meta for item in self.derived)
