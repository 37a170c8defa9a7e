"""What changed between two projects: settings, layer decisions, amax, sensitivity, exports, engine reports.

Two attempts at the same model differ in a few decisions and many numbers; :func:`diff_projects` lists
the decisions and the numbers that moved, so a user sees why the second export is better or worse.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench.project.model import Project
from workbench.project.store import load_project

__all__ = ["ProjectDiff", "Change", "AmaxChange", "RankChange", "diff_projects", "AMAX_TOLERANCE", "Comparison",
           "compare_with_file", "show_value"]

AMAX_TOLERANCE = 1e-6   # relative amax changes below this are float noise, not a change
_MISSING = "<absent>"
# the export report's figures worth comparing between two attempts
_EXPORT_FIELDS = ("path", "opset", "exporter", "quantize_nodes", "dequantize_nodes", "quantizers", "max_abs_diff",
                  "cosine", "file_size")


@dataclass
class Change:
    """One value that differs: ``where`` is a settings key, ``layer.field``, or a report's field."""

    where: str
    a: Any
    b: Any


@dataclass
class AmaxChange:
    quantizer: str
    a: float | None         # the largest amax (per-channel: over channels); None: not calibrated in that project
    b: float | None
    relative: float | None  # largest |b - a| / |a| over channels; None when one side is missing


@dataclass
class RankChange:
    unit: str
    a: int | None
    b: int | None


@dataclass
class ProjectDiff:
    a: str
    b: str
    settings: list[Change] = field(default_factory=list)
    layers_added: list[str] = field(default_factory=list)
    layers_removed: list[str] = field(default_factory=list)
    layers: list[Change] = field(default_factory=list)
    calibration: list[Change] = field(default_factory=list)
    amax: list[AmaxChange] = field(default_factory=list)
    sensitivity: list[RankChange] = field(default_factory=list)
    export: list[Change] = field(default_factory=list)
    engine: list[Change] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any((self.settings, self.layers_added, self.layers_removed, self.layers, self.calibration,
                        self.amax, self.sensitivity, self.export, self.engine))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"{self.a} -> {self.b}"]
        if self.empty:
            return lines[0] + ": no differences."

        def section(title: str, changes: list[Change]) -> None:
            if changes:
                lines.append(f"{title}:")
                lines.extend(f"  {c.where}: {show_value(c.a)} -> {show_value(c.b)}" for c in changes)

        section("settings", self.settings)
        if self.layers_added or self.layers_removed:
            lines.append("layers:")
            lines.extend(f"  + {name}" for name in self.layers_added)
            lines.extend(f"  - {name}" for name in self.layers_removed)
        section("layer decisions", self.layers)
        section("calibration", self.calibration)
        if self.amax:
            lines.append(f"amax ({len(self.amax)} changed, largest first):")
            for change in self.amax[:20]:
                rel = f"{change.relative:+.1%}" if change.relative is not None else "new" if change.a is None \
                    else "gone"
                lines.append(f"  {change.quantizer}: {show_value(change.a)} -> {show_value(change.b)} ({rel})")
            if len(self.amax) > 20:
                lines.append(f"  ... {len(self.amax) - 20} more (--json lists all)")
        if self.sensitivity:
            lines.append("sensitivity ranks:")
            lines.extend(f"  {r.unit}: {show_value(r.a)} -> {show_value(r.b)}" for r in self.sensitivity)
        section("latest export", self.export)
        section("latest engine report", self.engine)
        return "\n".join(lines)


def show_value(value: Any) -> str:
    """A compared value as the text report and the compare view write it: "-" for none, 6 digits for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _compare(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[Change]:
    changes = []
    for key in list(dict.fromkeys(list(a) + list(b))):
        value_a, value_b = a.get(key, _MISSING), b.get(key, _MISSING)
        if value_a != value_b:
            changes.append(Change(f"{prefix}{key}", value_a, value_b))
    return changes


def _amax_changes(a: Project, b: Project) -> list[AmaxChange]:
    run_a, run_b = a.current_calibration, b.current_calibration
    records_a = run_a.quantizers if run_a is not None else {}
    records_b = run_b.quantizers if run_b is not None else {}
    changes = []
    for name in list(dict.fromkeys(list(records_a) + list(records_b))):
        amax_a = np.asarray(records_a[name].amax, dtype=np.float64) if name in records_a else None
        amax_b = np.asarray(records_b[name].amax, dtype=np.float64) if name in records_b else None
        top_a = float(np.max(amax_a)) if amax_a is not None and amax_a.size else None
        top_b = float(np.max(amax_b)) if amax_b is not None and amax_b.size else None
        if amax_a is None or amax_b is None:
            changes.append(AmaxChange(name, top_a, top_b, None))
            continue
        if amax_a.shape != amax_b.shape:
            relative = float("inf")
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.abs(amax_b - amax_a) / np.abs(amax_a)
            ratio = np.where(np.abs(amax_a) == 0, np.where(amax_b == 0, 0.0, np.inf), ratio)
            relative = float(np.nanmax(ratio)) if ratio.size else 0.0
        if relative > AMAX_TOLERANCE:
            signed = relative if (top_b or 0.0) >= (top_a or 0.0) else -relative
            changes.append(AmaxChange(name, top_a, top_b, signed))
    # largest relative change first; quantizers only one project has come last
    changes.sort(key=lambda c: (c.relative is None, -abs(c.relative) if c.relative is not None else 0.0))
    return changes


def _ranks(project: Project) -> dict[str, int]:
    if not project.sensitivity:
        return {}
    ranks = {}
    for unit in project.sensitivity[-1].data.get("units") or []:
        if isinstance(unit, Mapping) and "rank" in unit and "name" in unit:
            ranks[str(unit["name"])] = int(unit["rank"])
    return ranks


def _rank_changes(a: Project, b: Project) -> list[RankChange]:
    ranks_a, ranks_b = _ranks(a), _ranks(b)
    changes = [RankChange(unit, ranks_a.get(unit), ranks_b.get(unit))
               for unit in dict.fromkeys(list(ranks_a) + list(ranks_b)) if ranks_a.get(unit) != ranks_b.get(unit)]
    changes.sort(key=lambda r: min(x for x in (r.a, r.b) if x is not None))
    return changes


def _export_changes(a: Project, b: Project) -> list[Change]:
    report_a = a.exports[-1].report if a.exports else {}
    report_b = b.exports[-1].report if b.exports else {}
    if not report_a and not report_b:
        return []
    pick = {key: report_a.get(key) for key in _EXPORT_FIELDS}, {key: report_b.get(key) for key in _EXPORT_FIELDS}
    return [c for c in _compare(*pick) if c.a != c.b]


def _engine_changes(a: Project, b: Project) -> list[Change]:
    data_a = a.engine_reports[-1].data if a.engine_reports else {}
    data_b = b.engine_reports[-1].data if b.engine_reports else {}
    if not data_a and not data_b:
        return []
    changes = _compare({"total_time_ms": data_a.get("total_time_ms"), "hazards": len(data_a.get("hazards") or [])},
                       {"total_time_ms": data_b.get("total_time_ms"), "hazards": len(data_b.get("hazards") or [])})
    precision_a = {e["module"]: e.get("engine_precision") for e in data_a.get("layers") or []
                   if e.get("quantized") is not None}
    precision_b = {e["module"]: e.get("engine_precision") for e in data_b.get("layers") or []
                   if e.get("quantized") is not None}
    changes += _compare(precision_a, precision_b, "precision of ")
    return changes


def diff_projects(a: Project, b: Project, *, name_a: str | None = None, name_b: str | None = None) -> ProjectDiff:
    """Everything that differs between projects ``a`` and ``b`` (``b`` is the newer attempt)."""
    diff = ProjectDiff(name_a or a.name, name_b or b.name)
    diff.settings = _compare(_flatten(a.settings), _flatten(b.settings))
    if a.model != b.model:  # ModelSpec is a dataclass: compared field by field
        diff.settings.insert(0, Change("model", a.model, b.model))
    diff.layers_added = [name for name in b.layers if name not in a.layers]
    diff.layers_removed = [name for name in a.layers if name not in b.layers]
    for name, decision_a in a.layers.items():
        decision_b = b.layers.get(name)
        if decision_b is None:
            continue
        if decision_a.quantize != decision_b.quantize:
            diff.layers.append(Change(f"{name}.quantize", decision_a.quantize, decision_b.quantize))
        for role in ("input_desc", "weight_desc"):
            desc_a, desc_b = getattr(decision_a, role) or {}, getattr(decision_b, role) or {}
            diff.layers += _compare(desc_a, desc_b, f"{name}.{role.removesuffix('_desc')}.")
    run_a, run_b = a.current_calibration, b.current_calibration
    if run_a is not None or run_b is not None:
        fields = ("method", "percentile", "num_batches", "output_sqnr_db")
        diff.calibration = _compare({f: getattr(run_a, f) for f in fields} if run_a else {},
                                    {f: getattr(run_b, f) for f in fields} if run_b else {})
    diff.amax = _amax_changes(a, b)
    diff.sensitivity = _rank_changes(a, b)
    diff.export = _export_changes(a, b)
    diff.engine = _engine_changes(a, b)
    return diff


@dataclass
class Comparison:
    """A diff with what the view needs besides it: every layer name of both projects (in model order)."""

    diff: ProjectDiff
    layers: list[str]
    path_a: str = ""


def compare_with_file(current: Project, path: str | Path, *, name_b: str = "this project") -> Comparison:
    """Diff the project file at ``path`` (A, the earlier attempt) against ``current`` (B, as it is now, unsaved
    changes included).

    Raises:
        ProjectError: ``path`` is not a project this version can read (the message names the file).
    """
    other = load_project(path)
    diff = diff_projects(other, current, name_a=Path(path).name, name_b=name_b)
    layers = list(dict.fromkeys(list(current.layers) + list(other.layers)))
    return Comparison(diff, layers, str(path))
