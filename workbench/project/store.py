"""The project file: one SQLite database written with sqlite-utils, one transaction per save.

A save either lands whole or not at all: every table is rewritten inside ``db.atomic()``, so a
process killed half-way leaves SQLite's journal to roll the file back to the previous save. Tensors
(amax, histograms) are stored as raw little-endian bytes with their dtype and shape, never pickled:
opening a stranger's project runs no code. The file says what it is (``PRAGMA application_id``) and
which format it is in (``meta.schema_version``); older formats are migrated on a copy in memory,
newer ones are refused with a clear message.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from workbench import __version__
from workbench.project.model import (
    CalibrationRecord,
    ExportRecord,
    FallbackRecord,
    FinetuneRecord,
    LayerDecision,
    Project,
    QuantizerRecord,
    SensitivityRecord,
    now_iso,
)
from workbench.sources.data_source import DataSpec, InputSpec
from workbench.sources.errors import SourceError
from workbench.sources.model_source import FileDigest, ModelSpec

__all__ = ["ProjectError", "save_project", "load_project", "SCHEMA_VERSION", "APPLICATION_ID", "MIGRATIONS",
           "PROJECT_SUFFIX"]

SCHEMA_VERSION = 2
APPLICATION_ID = 0x51574231  # "QWB1"
PROJECT_SUFFIX = ".qwb"
SQLITE_MAGIC = b"SQLite format 3\x00"
# Calibration runs kept in a project (their histograms dominate its size).
MAX_CALIBRATION_RUNS = 5
ARRAY_DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8", "bool")

# schema version N -> function that upgrades a database from N to N + 1, in place (see the end of the file)
MIGRATIONS: dict[int, Callable[[sqlite_utils.Database], None]] = {}


class ProjectError(Exception):
    """A project file that cannot be read or written; the message names the file and the reason."""


# ----- tensors as bytes --------------------------------------------------------------------------


def encode_array(array: np.ndarray) -> tuple[bytes, str, str]:
    """(little-endian bytes, dtype name, JSON shape) of an array."""
    array = np.asarray(array)
    dtype = array.dtype.name
    if dtype not in ARRAY_DTYPES:
        array = array.astype(np.float32)
        dtype = "float32"
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return np.ascontiguousarray(little).tobytes(), dtype, json.dumps(list(array.shape))


def decode_array(data: bytes, dtype: str, shape_json: str, what: str) -> np.ndarray:
    """The array back, after checking that dtype, shape and byte count agree."""
    if dtype not in ARRAY_DTYPES:
        raise ProjectError(f"{what}: unknown array type {dtype!r}.")
    shape = json.loads(shape_json)
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ProjectError(f"{what}: invalid array shape {shape_json!r}.")
    expected = math.prod(shape) * np.dtype(dtype).itemsize
    if not isinstance(data, bytes) or len(data) != expected:
        raise ProjectError(f"{what}: {len(data) if isinstance(data, bytes) else 'no'} bytes stored, "
                           f"{expected} expected for {dtype}{tuple(shape)}.")
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape).copy()


def _split_arrays(value: Any, arrays: dict[str, np.ndarray], prefix: str) -> Any:
    """JSON-able copy of ``value`` with every ndarray replaced by a reference into ``arrays``."""
    if isinstance(value, np.ndarray):
        key = f"{prefix}{len(arrays)}"
        arrays[key] = value
        return {"$array": key}
    if isinstance(value, dict):
        return {str(k): _split_arrays(v, arrays, prefix) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split_arrays(v, arrays, prefix) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _join_arrays(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$array"}:
            key = value["$array"]
            if key not in arrays:
                raise ProjectError(f"array {key!r} is referenced but not stored.")
            return arrays[key]
        return {k: _join_arrays(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_join_arrays(v, arrays) for v in value]
    return value


# ----- schema ------------------------------------------------------------------------------------


def _create_schema(db: sqlite_utils.Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["model_source"].create({"id": int, "spec": str, "digests": str, "input_spec": str}, pk="id",
                              if_not_exists=True)
    db["data_sources"].create({"role": str, "spec": str}, pk="role", if_not_exists=True)
    db["settings"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["layers"].create({"position": int, "name": str, "type": str, "quantize": int, "input_desc": str,
                         "weight_desc": str}, pk="position", if_not_exists=True)
    db["calibration_runs"].create({"id": int, "created": str, "method": str, "percentile": float,
                                   "num_batches": int, "wall_time_s": float, "device": str,
                                   "output_sqnr_db": float, "warnings": str, "unused": str, "folded": str},
                                  pk="id", if_not_exists=True)
    db["quantizer_stats"].create({"run_id": int, "name": str, "amax": bytes, "amax_dtype": str, "amax_shape": str,
                                  "method": str, "calibrator": str, "num_samples": int, "nonfinite_count": int,
                                  "max_value": float, "descriptor": str, "state": str},
                                 pk=("run_id", "name"), if_not_exists=True)
    db["arrays"].create({"owner": str, "key": str, "data": bytes, "dtype": str, "shape": str}, pk=("owner", "key"),
                        if_not_exists=True)
    db["sensitivity_runs"].create({"id": int, "created": str, "data": str}, pk="id", if_not_exists=True)
    db["fallback_runs"].create({"id": int, "created": str, "data": str, "applied": int}, pk="id",
                               if_not_exists=True)
    db["exports"].create({"id": int, "created": str, "path": str, "settings": str, "report": str}, pk="id",
                         if_not_exists=True)
    _create_finetune_tables(db)


def _create_finetune_tables(db: sqlite_utils.Database) -> None:
    """Version 2: fine-tune runs (settings, history as JSON) and the active run's weights and learned amax."""
    db["finetune_runs"].create({"id": int, "created": str, "data": str, "calibration_id": int, "folded": str,
                                "active": int}, pk="id", if_not_exists=True)
    db["finetune_tensors"].create({"run_id": int, "kind": str, "name": str, "data": bytes, "dtype": str,
                                   "shape": str}, pk=("run_id", "kind", "name"), if_not_exists=True)


TABLES = ("meta", "model_source", "data_sources", "settings", "layers", "calibration_runs", "quantizer_stats",
          "arrays", "sensitivity_runs", "fallback_runs", "exports", "finetune_runs", "finetune_tensors")


# ----- save --------------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def save_project(project: Project, path: str | os.PathLike) -> None:
    """Write ``project`` to ``path`` in one transaction (all or nothing).

    Raises:
        ProjectError: the file cannot be written, or is something other than a project.
    """
    path = Path(path)
    if path.exists():
        _check_header(path)
    project.modified = now_iso()
    project.app_version = __version__
    project.calibrations = project.calibrations[-MAX_CALIBRATION_RUNS:]
    try:
        db = sqlite_utils.Database(sqlite3.connect(str(path), isolation_level=None))
    except sqlite3.Error as error:
        raise ProjectError(f"{path}: cannot be opened for writing ({error}).") from error
    try:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        with db.atomic():
            _upgrade_existing(db)  # saving over an older file: its tables get the new columns first
            _create_schema(db)
            for table in TABLES:
                db.execute(f"DELETE FROM [{table}]")
            _write(db, project)
    except (sqlite3.Error, OSError) as error:
        raise ProjectError(f"{path}: saving failed ({error}); the previous save is unchanged.") from error
    finally:
        db.close()


def _write(db: sqlite_utils.Database, project: Project) -> None:
    db["meta"].insert_all([
        {"key": "schema_version", "value": str(SCHEMA_VERSION)},
        {"key": "app_version", "value": project.app_version},
        {"key": "name", "value": project.name},
        {"key": "created", "value": project.created},
        {"key": "modified", "value": project.modified},
    ])
    if project.model is not None:
        db["model_source"].insert({
            "id": 1, "spec": _dumps(project.model.to_dict()),
            "digests": _dumps([d.__dict__ for d in project.model_digests]),
            "input_spec": _dumps(None if project.input_spec is None else project.input_spec.to_dict())})
    db["data_sources"].insert_all([{"role": role, "spec": _dumps(spec.to_dict())}
                                   for role, spec in project.data.items()])
    db["settings"].insert_all([{"key": k, "value": _dumps(v)} for k, v in project.settings.items()])
    db["layers"].insert_all([
        {"position": i, "name": layer.name, "type": layer.type, "quantize": int(layer.quantize),
         "input_desc": _dumps(layer.input_desc), "weight_desc": _dumps(layer.weight_desc)}
        for i, layer in enumerate(project.layers.values())])
    arrays_rows = []
    for run in project.calibrations:
        db["calibration_runs"].insert({
            "id": run.id, "created": run.created, "method": run.method, "percentile": run.percentile,
            "num_batches": run.num_batches, "wall_time_s": run.wall_time_s, "device": run.device,
            "output_sqnr_db": run.output_sqnr_db, "warnings": _dumps(run.warnings), "unused": _dumps(run.unused),
            "folded": _dumps(run.folded)})
        rows = []
        for record in run.quantizers.values():
            owner = f"calibration:{run.id}:{record.name}"
            arrays: dict[str, np.ndarray] = {}
            state = _split_arrays(record.calibrator_state, arrays, "state")
            for key, array in arrays.items():
                data, dtype, shape = encode_array(array)
                arrays_rows.append({"owner": owner, "key": key, "data": data, "dtype": dtype, "shape": shape})
            amax, amax_dtype, amax_shape = encode_array(np.asarray(record.amax, dtype=np.float32))
            rows.append({"run_id": run.id, "name": record.name, "amax": amax, "amax_dtype": amax_dtype,
                         "amax_shape": amax_shape, "method": record.method, "calibrator": record.calibrator,
                         "num_samples": record.num_samples, "nonfinite_count": record.nonfinite_count,
                         "max_value": record.max_value, "descriptor": _dumps(record.descriptor),
                         "state": _dumps(state)})
        db["quantizer_stats"].insert_all(rows, batch_size=500)
    db["arrays"].insert_all(arrays_rows, batch_size=200)
    db["sensitivity_runs"].insert_all([{"id": r.id, "created": r.created, "data": _dumps(r.data)}
                                       for r in project.sensitivity])
    db["fallback_runs"].insert_all([{"id": r.id, "created": r.created, "data": _dumps(r.data),
                                     "applied": int(r.applied)} for r in project.fallbacks])
    db["exports"].insert_all([{"id": r.id, "created": r.created, "path": r.path, "settings": _dumps(r.settings),
                               "report": _dumps(r.report)} for r in project.exports])
    tensor_rows = []
    for run in project.finetunes:
        db["finetune_runs"].insert({"id": run.id, "created": run.created, "data": _dumps(run.data),
                                    "calibration_id": run.calibration_id, "folded": _dumps(run.folded),
                                    "active": int(run.active)})
        for kind, arrays in (("weight", run.weights), ("amax", run.amax)):
            for name, array in arrays.items():
                data, dtype, shape = encode_array(array)
                tensor_rows.append({"run_id": run.id, "kind": kind, "name": name, "data": data, "dtype": dtype,
                                    "shape": shape})
    db["finetune_tensors"].insert_all(tensor_rows, batch_size=100)


# ----- load --------------------------------------------------------------------------------------


def _check_header(path: Path) -> None:
    try:
        with open(path, "rb") as handle:
            header = handle.read(100)
    except OSError as error:
        raise ProjectError(f"{path}: cannot be read ({error.strerror or error}).") from error
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise ProjectError(f"{path}: not a Quant Workbench project (not an SQLite database"
                           f"{', or truncated' if header.startswith(SQLITE_MAGIC[:4]) or not header else ''}).")
    application_id = int.from_bytes(header[68:72], "big")
    if application_id != APPLICATION_ID:
        raise ProjectError(f"{path}: an SQLite database, but not a Quant Workbench project.")


def load_project(path: str | os.PathLike) -> Project:
    """Read a project file. Nothing in it is executed.

    Raises:
        ProjectError: the file is missing, not a project, truncated or corrupt, or from a newer version.
    """
    path = Path(path)
    if not path.is_file():
        raise ProjectError(f"{path}: no such project file.")
    _check_header(path)
    try:
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        memory = sqlite3.connect(":memory:")
        try:
            source.backup(memory)  # work on a copy: migrations never touch the user's file
        finally:
            source.close()
        db = sqlite_utils.Database(memory)
        check = db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise ProjectError(f"{path}: the file is damaged ({check[0] if check else 'no check result'}).")
        version = _schema_version(db, path)
        while version < SCHEMA_VERSION:
            if version not in MIGRATIONS:
                raise ProjectError(f"{path}: project format {version} cannot be upgraded by this version.")
            MIGRATIONS[version](db)
            version += 1
        return _read(db, path)
    except ProjectError:
        raise
    except (sqlite3.Error, ValueError, KeyError, TypeError, IndexError, AttributeError, SourceError,
            json.JSONDecodeError, OverflowError, MemoryError) as error:
        raise ProjectError(f"{path}: not a valid Quant Workbench project ({type(error).__name__}: {error}).") from error


def _schema_version(db: sqlite_utils.Database, path: Path) -> int:
    if "meta" not in db.table_names():
        raise ProjectError(f"{path}: not a Quant Workbench project (no meta table).")
    rows = {r["key"]: r["value"] for r in db["meta"].rows}
    try:
        version = int(rows["schema_version"])
    except (KeyError, ValueError) as error:
        raise ProjectError(f"{path}: the project format version is missing or invalid.") from error
    if version > SCHEMA_VERSION:
        raise ProjectError(f"{path}: saved by a newer Quant Workbench (project format {version}, app "
                           f"{rows.get('app_version', '?')}); this version ({__version__}) reads formats up to "
                           f"{SCHEMA_VERSION}. Update Quant Workbench to open it.")
    if version < 0:
        raise ProjectError(f"{path}: invalid project format version {version}.")
    return version


def _json(text: Any, what: str) -> Any:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ProjectError(f"{what}: expected JSON text.")
    return json.loads(text)


def _names(value: Any, what: str, optional: bool = False) -> list[str] | None:
    """A JSON list of names (layer names), checked."""
    if value is None and optional:
        return None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProjectError(f"{what}: expected a list of layer names.")
    return list(value)


def _read(db: sqlite_utils.Database, path: Path) -> Project:
    tables = set(db.table_names())
    missing = [t for t in TABLES if t not in tables]
    if missing:
        raise ProjectError(f"{path}: the project is missing tables {missing}.")
    meta = {r["key"]: r["value"] for r in db["meta"].rows}
    project = Project(name=str(meta.get("name", path.stem)), created=str(meta.get("created", "")),
                      modified=str(meta.get("modified", "")), app_version=str(meta.get("app_version", "")))
    for row in db["model_source"].rows:
        project.model = ModelSpec.from_dict(_json(row["spec"], "model source"))
        project.model_digests = [FileDigest(str(d["path"]), str(d["sha256"]), int(d["size"]))
                                 for d in _json(row["digests"], "model digests") or []]
        input_spec = _json(row["input_spec"], "input spec")
        if input_spec is not None:
            project.input_spec = InputSpec.from_dict(input_spec)
    for row in db["data_sources"].rows:
        project.data[str(row["role"])] = DataSpec.from_dict(_json(row["spec"], f"data source {row['role']}"))
    for row in db["settings"].rows:
        project.settings[str(row["key"])] = _json(row["value"], f"setting {row['key']}")
    for row in db["layers"].rows_where(order_by="position"):
        input_desc, weight_desc = _json(row["input_desc"], "descriptor"), _json(row["weight_desc"], "descriptor")
        for desc in (input_desc, weight_desc):
            if desc is not None and not isinstance(desc, dict):
                raise ProjectError(f"{path}: layer {row['name']} has an invalid descriptor.")
        project.layers[str(row["name"])] = LayerDecision(str(row["name"]), str(row["type"]), bool(row["quantize"]),
                                                         input_desc, weight_desc)
    arrays_by_owner: dict[str, dict[str, np.ndarray]] = {}
    for row in db["arrays"].rows:
        owner = str(row["owner"])
        arrays_by_owner.setdefault(owner, {})[str(row["key"])] = decode_array(
            row["data"], row["dtype"], row["shape"], f"{path}: {owner}")
    runs: dict[int, CalibrationRecord] = {}
    for row in db["calibration_runs"].rows_where(order_by="id"):
        runs[int(row["id"])] = CalibrationRecord(
            id=int(row["id"]), created=str(row["created"]), method=str(row["method"]),
            percentile=float(row["percentile"]), num_batches=int(row["num_batches"]),
            wall_time_s=float(row["wall_time_s"]), device=str(row["device"]),
            output_sqnr_db=None if row["output_sqnr_db"] is None else float(row["output_sqnr_db"]),
            warnings=list(_json(row["warnings"], "warnings") or []), unused=list(_json(row["unused"], "unused") or []),
            folded=_names(_json(row.get("folded"), "folded layers"), f"{path}: calibration run {row['id']}", True))
    for row in db["quantizer_stats"].rows_where(order_by="rowid"):
        run = runs.get(int(row["run_id"]))
        if run is None:
            raise ProjectError(f"{path}: quantizer {row['name']} belongs to a calibration run that is not stored.")
        name = str(row["name"])
        owner = f"calibration:{run.id}:{name}"
        state = _join_arrays(_json(row["state"], f"{name} state"), arrays_by_owner.get(owner, {}))
        run.quantizers[name] = QuantizerRecord(
            name=name, amax=decode_array(row["amax"], row["amax_dtype"], row["amax_shape"], f"{path}: {name} amax"),
            method=str(row["method"]), calibrator=str(row["calibrator"]), num_samples=int(row["num_samples"]),
            nonfinite_count=int(row["nonfinite_count"]),
            max_value=None if row["max_value"] is None else float(row["max_value"]),
            calibrator_state=state, descriptor=_json(row["descriptor"], f"{name} descriptor"))
    project.calibrations = list(runs.values())
    project.sensitivity = [SensitivityRecord(int(r["id"]), str(r["created"]), _json(r["data"], "sensitivity"))
                           for r in db["sensitivity_runs"].rows_where(order_by="id")]
    project.fallbacks = [FallbackRecord(int(r["id"]), str(r["created"]), _json(r["data"], "fallback"),
                                        bool(r["applied"])) for r in db["fallback_runs"].rows_where(order_by="id")]
    project.exports = [ExportRecord(int(r["id"]), str(r["created"]), str(r["path"]),
                                    _json(r["settings"], "export settings"), _json(r["report"], "export report"))
                       for r in db["exports"].rows_where(order_by="id")]
    finetunes: dict[int, FinetuneRecord] = {}
    for row in db["finetune_runs"].rows_where(order_by="id"):
        data = _json(row["data"], "fine-tune")
        if not isinstance(data, dict):
            raise ProjectError(f"{path}: fine-tune run {row['id']} has no valid history.")
        finetunes[int(row["id"])] = FinetuneRecord(
            id=int(row["id"]), created=str(row["created"]), data=data,
            calibration_id=None if row["calibration_id"] is None else int(row["calibration_id"]),
            folded=_names(_json(row["folded"], "fine-tune folded layers"), f"{path}: fine-tune run {row['id']}")
            or [], active=bool(row["active"]))
    for row in db["finetune_tensors"].rows_where(order_by="rowid"):
        run = finetunes.get(int(row["run_id"]))
        kind, name = str(row["kind"]), str(row["name"])
        if run is None or kind not in ("weight", "amax"):
            raise ProjectError(f"{path}: fine-tune tensor {name} belongs to no stored fine-tune run.")
        array = decode_array(row["data"], row["dtype"], row["shape"], f"{path}: fine-tuned {name}")
        (run.weights if kind == "weight" else run.amax)[name] = array
    project.finetunes = list(finetunes.values())
    return project


# ----- migrations --------------------------------------------------------------------------------


def _migrate_1_to_2(db: sqlite_utils.Database) -> None:
    """Version 2 adds fine-tuning (``finetune_runs``, ``finetune_tensors``) and BatchNorm folding.

    A calibration run now records which layers had their BatchNorm folded (``calibration_runs.folded``).
    Version 1 projects were calibrated on unfolded weights, so they get ``fold_bn`` off: reopened,
    they rebuild and restore exactly as they were saved (the user can switch folding on and recalibrate).
    """
    tables = set(db.table_names())
    if "calibration_runs" in tables and "folded" not in db["calibration_runs"].columns_dict:
        db["calibration_runs"].add_column("folded", str)
    _create_finetune_tables(db)
    if "settings" in tables and not list(db["settings"].rows_where("key = ?", ["fold_bn"])):
        db["settings"].insert({"key": "fold_bn", "value": "false"})
    if "meta" in tables:
        db["meta"].upsert({"key": "schema_version", "value": "2"}, pk="key")


MIGRATIONS[1] = _migrate_1_to_2


def _upgrade_existing(db: sqlite_utils.Database) -> None:
    """Migrate a project file being overwritten, so that its tables take the current rows."""
    if "meta" not in db.table_names():
        return
    row = next(db["meta"].rows_where("key = ?", ["schema_version"]), None)
    try:
        version = int(row["value"]) if row is not None else SCHEMA_VERSION
    except (TypeError, ValueError):
        return
    while version < SCHEMA_VERSION and version in MIGRATIONS:
        MIGRATIONS[version](db)
        version += 1
