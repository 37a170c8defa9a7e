"""What an analysis produced, as plain data: sortable, and serialisable to JSON-able dicts.

Non-finite numbers (an SQNR of +inf when a configuration reproduces FP32 exactly) are written as the
strings ``"inf"``, ``"-inf"`` and ``"nan"``, because JSON has no literal for them; every other number
is a plain JSON number. Each serialised result carries a ``format`` tag for future migrations.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.units import Unit
from workbench.plurals import count_text

__all__ = ["SCHEMES", "UnitResult", "SensitivityResult", "FallbackPoint", "FallbackResult", "rank_units",
           "encode_number", "decode_number"]

SCHEMES = ("one-off", "one-on")
SENSITIVITY_FORMAT = "workbench.sensitivity/1"
FALLBACK_FORMAT = "workbench.fallback/1"
SORT_KEYS = ("rank", "name", "value", "delta_vs_quantized", "delta_vs_fp32")


def encode_number(value: float | None) -> float | str | None:
    """A float as JSON can hold it (non-finite values as ``"inf"``, ``"-inf"``, ``"nan"``)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def decode_number(value: float | str | None) -> float | None:
    """The inverse of :func:`encode_number`."""
    return None if value is None else float(value)


def difference(a: float, b: float) -> float:
    """``a - b``, but 0 when they are equal (two infinities included)."""
    return 0.0 if a == b else a - b


def _check_format(data: Mapping[str, Any], expected: str) -> None:
    found = data.get("format")
    if found != expected:
        raise ValueError(f"Not a saved result of this kind: format {found!r}, expected {expected!r}.")


@dataclass
class UnitResult:
    """One unit's measurement.

    Attributes:
        name: the unit's name (a layer, or a group).
        quantizers: the quantizers it switched.
        value: the metric with the unit toggled (one-off: left in float; one-on: the only one quantized).
        delta_vs_quantized: ``value`` minus the all-quantized metric.
        delta_vs_fp32: ``value`` minus the FP32 metric.
        rank: 1 for the most sensitive unit.
    """

    name: str
    quantizers: list[str]
    value: float
    delta_vs_quantized: float
    delta_vs_fp32: float
    rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "quantizers": list(self.quantizers), "value": encode_number(self.value),
                "delta_vs_quantized": encode_number(self.delta_vs_quantized),
                "delta_vs_fp32": encode_number(self.delta_vs_fp32), "rank": self.rank}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnitResult:
        return cls(name=str(data["name"]), quantizers=[str(q) for q in data["quantizers"]],
                   value=decode_number(data["value"]), delta_vs_quantized=decode_number(data["delta_vs_quantized"]),
                   delta_vs_fp32=decode_number(data["delta_vs_fp32"]), rank=int(data["rank"]))


def rank_units(units: list[UnitResult], scheme: str, higher_is_better: bool) -> None:
    """Set ``rank`` on each unit: 1 is the most sensitive; ties keep model order.

    one-off: the most sensitive unit is the one whose return to float regains the most, i.e. the best
    value. one-on: the one that loses the most when it alone is quantized, i.e. the worst value.
    Ranking by value is ranking by either delta (they differ by a constant), and stays well defined
    when the FP32 metric is infinite (SQNR).
    """
    best_first = scheme == "one-off"
    sign = -1.0 if higher_is_better == best_first else 1.0

    def key(index: int) -> tuple[float, int]:
        value = units[index].value
        return (math.inf if math.isnan(value) else sign * value, index)

    for rank, index in enumerate(sorted(range(len(units)), key=key), start=1):
        units[index].rank = rank


@dataclass
class SensitivityResult:
    """A sensitivity profile: the FP32 and all-quantized metric, and one :class:`UnitResult` per unit.

    Attributes:
        scheme: ``"one-off"`` (all quantized, one unit at a time left in float: the metric regained) or
            ``"one-on"`` (all in float, one unit at a time quantized: the metric lost).
        metric: the metric's description (:meth:`Metric.to_dict`), with its ``direction``.
        fp32: the metric with every quantizer off.
        quantized: the metric with every quantizer as configured.
        units: per unit, in model order (see :meth:`ranked` and :meth:`sorted_by`).
        num_batches: how many batches each pass ran.
        wall_time_s: how long the analysis took.
        cache: ``"fx"`` / ``"fx-coarse"`` when passes started from cached activations, else ``"off"``.
        cache_note: why (for example why the plain loop was used).
        complete: False for the partial result of a cancelled run.
    """

    scheme: str
    metric: dict[str, Any]
    fp32: float
    quantized: float
    units: list[UnitResult]
    num_batches: int
    wall_time_s: float
    cache: str = "off"
    cache_note: str = ""
    complete: bool = True

    @property
    def higher_is_better(self) -> bool:
        return self.metric.get("direction", "higher") == "higher"

    @property
    def metric_name(self) -> str:
        return str(self.metric.get("name", self.metric.get("kind", "metric")))

    def ranked(self) -> list[UnitResult]:
        """Units from the most sensitive to the least."""
        return self.sorted_by("rank")

    def sorted_by(self, key: str = "rank", descending: bool = False) -> list[UnitResult]:
        """Units sorted by ``"rank"``, ``"name"``, ``"value"``, ``"delta_vs_quantized"`` or ``"delta_vs_fp32"``."""
        if key not in SORT_KEYS:
            raise ValueError(f"key must be one of {SORT_KEYS}, got {key!r}.")
        return sorted(self.units, key=lambda u: getattr(u, key), reverse=descending)

    def most_sensitive(self, n: int) -> list[str]:
        """The names of the ``n`` most sensitive units (for "ignore the worst N")."""
        return [u.name for u in self.ranked()[:max(n, 0)]]

    def unit(self, name: str) -> UnitResult:
        """The result of the unit called ``name``.

        Raises:
            KeyError: no such unit.
        """
        for u in self.units:
            if u.name == name:
                return u
        raise KeyError(name)

    def summary(self) -> str:
        head = (f"{self.scheme} sensitivity of {count_text(len(self.units), 'unit')} by {self.metric_name}: "
                f"FP32 {self.fp32:.4g}, "
                f"all quantized {self.quantized:.4g}")
        if self.units:
            top = self.ranked()[0]
            head += f"; most sensitive {top.name} ({top.value:.4g})"
        return head + f"; {self.wall_time_s:.2f} s"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (see the module docstring for non-finite numbers)."""
        return {"format": SENSITIVITY_FORMAT, "scheme": self.scheme, "metric": dict(self.metric),
                "fp32": encode_number(self.fp32), "quantized": encode_number(self.quantized),
                "units": [u.to_dict() for u in self.units], "num_batches": self.num_batches,
                "wall_time_s": self.wall_time_s, "cache": self.cache, "cache_note": self.cache_note,
                "complete": self.complete}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityResult:
        """Read what :meth:`to_dict` wrote.

        Raises:
            ValueError: another format; KeyError: a field is missing.
        """
        _check_format(data, SENSITIVITY_FORMAT)
        return cls(scheme=str(data["scheme"]), metric=dict(data["metric"]), fp32=decode_number(data["fp32"]),
                   quantized=decode_number(data["quantized"]),
                   units=[UnitResult.from_dict(u) for u in data["units"]], num_batches=int(data["num_batches"]),
                   wall_time_s=float(data["wall_time_s"]), cache=str(data.get("cache", "off")),
                   cache_note=str(data.get("cache_note", "")), complete=bool(data.get("complete", True)))


@dataclass
class FallbackPoint:
    """One point of the fallback curve: the metric with the first ``num_float`` units left in float."""

    num_float: int
    unit: str | None  # the unit added to the float set at this point (None at 0)
    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"num_float": self.num_float, "unit": self.unit, "value": encode_number(self.value)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FallbackPoint:
        return cls(int(data["num_float"]), None if data["unit"] is None else str(data["unit"]),
                   decode_number(data["value"]))


@dataclass
class FallbackResult:
    """The outcome of :func:`~workbench.analysis.fallback_search`.

    Attributes:
        metric: the metric's description.
        fp32, quantized: the metric with every quantizer off, and as configured.
        tolerance: the allowed gap to FP32 (None when a target was given).
        target: the value to reach (None when a tolerance was given).
        chosen: the units to leave in float, in the order they were added.
        curve: the metric against the number of units left in float, from 0 (ready to plot).
        reached: whether the last point is within the tolerance (or reaches the target).
        ranking: the unit names in the order they were tried.
        sensitivity: the profile computed for the ranking, if the search computed one.
        applied: whether the chosen units were switched to float on the model.
        wall_time_s: how long the search took (ranking included).
        complete: False for the partial result of a cancelled search.
        walk: how the search measured when not by whole-model passes (``"blocks: 2 LlamaDecoderLayer blocks in
            model.layers"``: block by block, :mod:`workbench.analysis.block_search`); "" for whole-model passes.
    """

    metric: dict[str, Any]
    fp32: float
    quantized: float
    tolerance: float | None
    target: float | None
    chosen: list[Unit]
    curve: list[FallbackPoint]
    reached: bool
    ranking: list[str]
    sensitivity: SensitivityResult | None = None
    applied: bool = False
    wall_time_s: float = 0.0
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    walk: str = ""

    @property
    def chosen_names(self) -> list[str]:
        return [u.name for u in self.chosen]

    @property
    def final_value(self) -> float:
        return self.curve[-1].value if self.curve else self.quantized

    def plot_data(self) -> tuple[list[int], list[float]]:
        """x (units in float) and y (metric) of the curve."""
        return [p.num_float for p in self.curve], [p.value for p in self.curve]

    def summary(self) -> str:
        goal = f"within {self.tolerance:g} of FP32" if self.tolerance is not None else f"target {self.target:g}"
        state = "reached" if self.reached else "not reached"
        return (f"fallback search ({goal}) {state} with {count_text(len(self.chosen), 'unit')} in float "
                f"[{', '.join(self.chosen_names)}]: {self.final_value:.4g} (FP32 {self.fp32:.4g}, "
                f"all quantized {self.quantized:.4g})"
                + (f"; measured block by block ({self.walk})" if self.walk else ""))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data."""
        return {"format": FALLBACK_FORMAT, "metric": dict(self.metric), "fp32": encode_number(self.fp32),
                "quantized": encode_number(self.quantized), "tolerance": self.tolerance, "target": self.target,
                "chosen": [u.to_dict() for u in self.chosen], "curve": [p.to_dict() for p in self.curve],
                "reached": self.reached, "ranking": list(self.ranking),
                "sensitivity": None if self.sensitivity is None else self.sensitivity.to_dict(),
                "applied": self.applied, "wall_time_s": self.wall_time_s, "complete": self.complete,
                "notes": list(self.notes), **({"walk": self.walk} if self.walk else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FallbackResult:
        """Read what :meth:`to_dict` wrote.

        Raises:
            ValueError: another format; KeyError: a field is missing.
        """
        _check_format(data, FALLBACK_FORMAT)
        sensitivity = data.get("sensitivity")
        return cls(metric=dict(data["metric"]), fp32=decode_number(data["fp32"]),
                   quantized=decode_number(data["quantized"]), tolerance=data.get("tolerance"),
                   target=data.get("target"), chosen=[Unit.from_dict(u) for u in data["chosen"]],
                   curve=[FallbackPoint.from_dict(p) for p in data["curve"]], reached=bool(data["reached"]),
                   ranking=[str(n) for n in data["ranking"]],
                   sensitivity=None if sensitivity is None else SensitivityResult.from_dict(sensitivity),
                   applied=bool(data.get("applied", False)), wall_time_s=float(data.get("wall_time_s", 0.0)),
                   complete=bool(data.get("complete", True)), notes=[str(n) for n in data.get("notes", [])],
                   walk=str(data.get("walk") or ""))
