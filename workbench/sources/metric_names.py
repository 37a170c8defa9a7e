"""The words a metric is named by: which way is better, and the metric a project starts with.

Here, below both, because the analysis layer (the metrics themselves, :mod:`workbench.analysis.metrics`)
and the project layer (the metric setting, :mod:`workbench.project.settings`) sit side by side and may not
import each other. The metrics' registry stays in the analysis layer; it checks that the default is one of it.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["Direction", "DIRECTIONS", "DEFAULT_METRIC"]


class Direction(str, Enum):
    """Which value of a metric is better. A ``str`` enum: it compares equal to, and is stored as, its text."""

    HIGHER = "higher"
    LOWER = "lower"

    def __str__(self) -> str:
        return self.value


DIRECTIONS: tuple[str, ...] = tuple(direction.value for direction in Direction)

# the built-in metric a new project ranks and evaluates by (a key of workbench.analysis.BUILTIN_METRICS)
DEFAULT_METRIC = "sqnr"
