"""Two writers, one project file: what each changed since a common revision, and their merge.

A project is seen as a set of parts, each with a digest: the name, the model, each data source, each
setting, each layer decision (and the layers' order), and each stored run (calibration, sensitivity,
fallback, export, fine-tune) by id. When a save finds that another process saved the file after this
one loaded it, the digests taken at load time (the base) tell which parts each side changed:

- a part only one side changed takes that side's value;
- a part both changed the same way is fine; both changed it differently is a conflict, and nothing
  is saved (:class:`ProjectChangedError`);
- runs this side appended are appended after the other side's runs, renumbered if their ids are taken
  (a fine-tune's reference to a renumbered calibration follows).

So two calibrations at once both land, and ``set --ignore fc`` during a calibration keeps fc ignored
and keeps the calibration.
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Any

import numpy as np

from workbench.project.model import Project

__all__ = ["digests", "merge", "describe", "RECORD_KINDS"]

# record kind -> Project attribute holding the list of records (each with an ``id``)
RECORD_KINDS = {"calibration": "calibrations", "sensitivity": "sensitivity", "fallback": "fallbacks",
                "export": "exports", "finetune": "finetunes", "engine": "engine_reports"}


def _feed(hasher: Any, value: Any) -> None:
    """Feed a canonical, type-tagged encoding of ``value`` into ``hasher`` (arrays by dtype, shape, bytes)."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        hasher.update(b"A" + array.dtype.str.encode() + repr(array.shape).encode())
        hasher.update(array.tobytes())
    elif isinstance(value, dict):
        hasher.update(b"D%d" % len(value))
        for key in sorted(value, key=str):
            _feed(hasher, str(key))
            _feed(hasher, value[key])
    elif isinstance(value, (list, tuple)):
        hasher.update(b"L%d" % len(value))
        for item in value:
            _feed(hasher, item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        hasher.update(b"C" + type(value).__name__.encode())
        for item in dataclasses.fields(value):
            if item.compare:
                _feed(hasher, item.name)
                _feed(hasher, getattr(value, item.name))
    elif isinstance(value, bool) or value is None:
        hasher.update(b"B" + repr(value).encode())
    elif isinstance(value, (float, np.floating)):
        hasher.update(b"F" + struct.pack("<d", float(value)))
    elif isinstance(value, (int, np.integer)):
        hasher.update(b"I" + str(int(value)).encode())
    elif isinstance(value, str):
        encoded = value.encode("utf-8", "surrogatepass")
        hasher.update(b"S%d:" % len(encoded) + encoded)
    else:
        hasher.update(b"R" + repr(value).encode())


def _digest(value: Any) -> str:
    hasher = hashlib.blake2b(digest_size=16)
    _feed(hasher, value)
    return hasher.hexdigest()


def _parts(project: Project) -> dict[str, Any]:
    """Every part of ``project`` that a writer can change on its own, by key."""
    parts: dict[str, Any] = {"name": project.name,
                             "model": (project.model, project.model_digests, project.input_spec),
                             "layer order": list(project.layers)}
    parts.update({f"data {role}": spec for role, spec in project.data.items()})
    parts.update({f"setting {key}": value for key, value in project.settings.items()})
    parts.update({f"layer {name}": layer for name, layer in project.layers.items()})
    parts.update({f"smoothing {name}": record for name, record in project.smoothing.items()})
    for kind, attribute in RECORD_KINDS.items():
        parts.update({f"{kind} {record.id}": record for record in getattr(project, attribute)})
    return parts


def digests(project: Project) -> dict[str, str]:
    """A digest of each part of ``project`` (what :class:`ProjectOrigin` keeps from load time)."""
    return {key: _digest(value) for key, value in _parts(project).items()}


def _record_key(key: str) -> tuple[str, int] | None:
    kind, _, number = key.partition(" ")
    if kind in RECORD_KINDS and number.isdigit():
        return kind, int(number)
    return None


def describe(key: str) -> str:
    """A part's key as a user reads it: ``"calibration 3"`` -> ``"calibration run 3"``."""
    record = _record_key(key)
    return f"{record[0]} run {record[1]}" if record else key


def merge(base: dict[str, str], mine: Project, theirs: Project) -> tuple[Project, list[str], list[str]]:
    """``theirs`` (the file's newer state) with ``mine``'s changes since ``base`` applied.

    Returns (merged project, conflicts, what the merge took from ``theirs``). When ``conflicts`` is not
    empty the merged project must not be saved. ``theirs`` is modified and returned as the merge.
    """
    mine_digests, their_digests = digests(mine), digests(theirs)
    mine_parts = _parts(mine)
    changed_mine = {key for key in base.keys() | mine_digests.keys() if base.get(key) != mine_digests.get(key)}
    changed_theirs = {key for key in base.keys() | their_digests.keys() if base.get(key) != their_digests.get(key)}
    appended = [key for key in mine_digests if key not in base and _record_key(key)]
    conflicts = sorted(describe(key) for key in changed_mine - set(appended)
                       if key in changed_theirs and mine_digests.get(key) != their_digests.get(key))
    taken = sorted(describe(key) for key in changed_theirs if key not in changed_mine or key in appended)
    if conflicts:
        return theirs, conflicts, taken
    for key in sorted(changed_mine - set(appended)):
        if mine_digests.get(key) == their_digests.get(key):
            continue
        _apply(theirs, key, mine_parts.get(key), removed=key not in mine_digests)
    _append(theirs, mine, appended)
    return theirs, [], taken


def _apply(target: Project, key: str, value: Any, removed: bool) -> None:
    """Set (or remove) one part of ``target`` to this writer's value."""
    record = _record_key(key)
    if record is not None:
        records = getattr(target, RECORD_KINDS[record[0]])
        index = next((i for i, item in enumerate(records) if item.id == record[1]), None)
        if removed:
            if index is not None:
                del records[index]
        elif index is None:
            records.append(value)
            records.sort(key=lambda item: item.id)
        else:
            records[index] = value
        return
    kind, _, name = key.partition(" ")
    if key == "name":
        target.name = value
    elif key == "model":
        target.model, target.model_digests, target.input_spec = value
    elif key == "layer order":
        order = [n for n in value if n in target.layers] + [n for n in target.layers if n not in value]
        target.layers = {n: target.layers[n] for n in order}
    else:
        table = {"data": target.data, "setting": target.settings, "layer": target.layers,
                 "smoothing": target.smoothing}[kind]
        if removed:
            table.pop(name, None)
        else:
            table[name] = value


def _append(target: Project, mine: Project, appended: list[str]) -> None:
    """Append this writer's new runs after the other writer's, renumbering ids that are taken."""
    calibration_ids: dict[int, int] = {}
    for kind, attribute in RECORD_KINDS.items():
        records = getattr(target, attribute)
        for record in getattr(mine, attribute):
            if f"{kind} {record.id}" not in appended:
                continue
            new_id = target.next_id(records) if any(r.id == record.id for r in records) else record.id
            new_id = max(new_id, target.next_id(records))  # appended runs stay last: "current" is the newest
            if kind == "calibration":
                calibration_ids[record.id] = new_id
            if kind == "finetune":
                if record.calibration_id in calibration_ids:
                    record.calibration_id = calibration_ids[record.calibration_id]
                if record.active:  # one active fine-tune per project: the newest
                    for other in records:
                        other.active, other.weights, other.amax = False, {}, {}
            record.id = new_id
            records.append(record)
