"""Per-batch values kept between the steps of a block-by-block job (the activations that go from one block to the
next): in memory while a shared byte budget allows, on disk (``torch.save``, one file per batch) beyond it.

A 7B decoder's hidden states for 16 batches of 2048 tokens are 16 x 2048 x 4096 x 2 bytes = 256 MiB per block
boundary in bf16, but calibration sets of hundreds of long sequences are GiBs: those go to a temporary folder
that :meth:`SpillFolder.close` removes, whatever happened.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workbench.quant.algorithms.batches import flat_tensors

__all__ = ["ACTIVATION_BUDGET", "ActivationStore", "SpillFolder", "value_bytes"]

# Activations kept in memory between blocks, all stores of a job together; beyond, they go to disk.
ACTIVATION_BUDGET = 2 << 30


def value_bytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (a tensor, or tuples, lists and dicts of them)."""
    return sum(t.numel() * t.element_size() for t in flat_tensors(value))


class SpillFolder:
    """The budget shared by a job's stores and the temporary folder they spill to (made on the first spill).

    Args:
        budget_bytes: the bytes all stores together keep in memory.
        parent: where the temporary folder goes (None: the system's temporary folder).
    """

    def __init__(self, budget_bytes: int = ACTIVATION_BUDGET, parent: str | Path | None = None) -> None:
        if budget_bytes < 0:
            raise ValueError(f"The activation budget must be >= 0 bytes, got {budget_bytes}.")
        self.budget_bytes = budget_bytes
        self.parent = None if parent is None else Path(parent)
        self.in_memory = 0  # bytes held by the stores now
        self.spilled_files = 0  # files written over the job (a measure for reports and tests)
        self._folder: Path | None = None
        self._next = 0

    def new_file(self) -> Path:
        """A fresh file name in the temporary folder (made now if needed)."""
        if self._folder is None:
            if self.parent is not None:
                self.parent.mkdir(parents=True, exist_ok=True)
            self._folder = Path(tempfile.mkdtemp(prefix="workbench-activations-", dir=self.parent))
        self._next += 1
        self.spilled_files += 1
        return self._folder / f"{self._next}.pt"

    @property
    def folder(self) -> Path | None:
        """The temporary folder, once something spilled (None before, and after :meth:`close`)."""
        return self._folder

    def close(self) -> None:
        """Remove the temporary folder and everything in it."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class ActivationStore:
    """One value per batch index: in memory within ``spill``'s budget, else in a file of its folder."""

    def __init__(self, spill: SpillFolder) -> None:
        self._spill = spill
        self._memory: dict[int, tuple[Any, int]] = {}
        self._files: dict[int, Path] = {}

    def put(self, index: int, value: Any) -> None:
        """Keep ``value`` for batch ``index`` (replacing what was there)."""
        self.drop(index)
        size = value_bytes(value)
        if self._spill.in_memory + size <= self._spill.budget_bytes:
            self._memory[index] = (value, size)
            self._spill.in_memory += size
            return
        path = self._spill.new_file()
        torch.save(value, path)
        self._files[index] = path

    def get(self, index: int) -> Any:
        """The value of batch ``index`` (read back from its file when it was spilled)."""
        if index in self._memory:
            return self._memory[index][0]
        if index in self._files:
            # our own file, written by put() in a folder only this job uses: not untrusted data
            return torch.load(self._files[index], weights_only=False)
        raise KeyError(f"no activation kept for batch {index}")

    def drop(self, index: int) -> None:
        """Forget batch ``index`` (its memory back to the budget, its file removed)."""
        held = self._memory.pop(index, None)
        if held is not None:
            self._spill.in_memory -= held[1]
        path = self._files.pop(index, None)
        if path is not None:
            path.unlink(missing_ok=True)

    @property
    def spilled(self) -> int:
        """How many batches of this store are on disk."""
        return len(self._files)

    def close(self) -> None:
        """Forget every batch."""
        for index in list(self._memory) + list(self._files):
            self.drop(index)
