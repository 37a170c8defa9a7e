"""Which of a model's weights are in memory: the contract between a lazily opened checkpoint and the jobs that
walk a model block by block.

A model opened from a large checkpoint keeps its parameters on the meta device until a job needs them
(``workbench.sources``); a job that walks the model one block at a time (sequential calibration, streamed export)
asks for a block's weights before running it and lets them go afterwards. A model built in memory is
:class:`AllResident`: both calls do nothing, so the same job runs unchanged on it.
"""
from __future__ import annotations

from typing import Protocol

from torch import nn

__all__ = ["AllResident", "BlockResidency"]


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
