"""The project's tables: the schema, and a :class:`Project` written to rows and read back from them.

Tensors (amax, histograms, fine-tuned weights) are stored as raw little-endian bytes with their dtype and
shape, never pickled. Reading checks every row; an error names the file, the table, the row and (where
there is one) the layer or quantizer, so a damaged project says where it is damaged.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from workbench import bounded_json
from workbench.project.errors import ProjectError
from workbench.project.model import (
    CalibrationRecord,
    EngineReportRecord,
    ExportRecord,
    FallbackRecord,
    FinetuneRecord,
    LayerDecision,
    LintRecord,
    Project,
    QuantizerRecord,
    SensitivityRecord,
    SmoothingRecord,
)
from workbench.project.settings import ProjectSettings
from workbench.quant.calib.methods import SINGLE_METHODS
from workbench.quant.tensor_quant import QuantDescriptor
from workbench.sources.data_source import DataSpec, InputSpec
from workbench.sources.errors import SourceError
from workbench.sources.model_source import FileDigest, ModelSpec

SCHEMA_VERSION = 5
ARRAY_DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8", "bool")


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
    shape = bounded_json.loads(shape_json)
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


def create_schema(db: sqlite_utils.Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["model_source"].create({"id": int, "spec": str, "digests": str, "input_spec": str}, pk="id",
                              if_not_exists=True)
    db["data_sources"].create({"role": str, "spec": str}, pk="role", if_not_exists=True)
    db["settings"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["layers"].create({"position": int, "name": str, "type": str, "quantize": int, "input_desc": str,
                         "weight_desc": str}, pk="position", if_not_exists=True)
    db["calibration_runs"].create({"id": int, "created": str, "method": str, "percentile": float,
                                   "num_batches": int, "wall_time_s": float, "device": str,
                                   "output_sqnr_db": float, "warnings": str, "unused": str, "folded": str,
                                   "sqnr_batches": int, "state_digest": str, "weights_digest": str},
                                  pk="id", if_not_exists=True)
    db["quantizer_stats"].create({"run_id": int, "name": str, "amax": bytes, "amax_dtype": str, "amax_shape": str,
                                  "method": str, "calibrator": str, "num_samples": int, "nonfinite_count": int,
                                  "max_value": float, "descriptor": str, "state": str, "findings": str},
                                 pk=("run_id", "name"), if_not_exists=True)
    db["arrays"].create({"owner": str, "key": str, "data": bytes, "dtype": str, "shape": str}, pk=("owner", "key"),
                        if_not_exists=True)
    db["sensitivity_runs"].create({"id": int, "created": str, "data": str}, pk="id", if_not_exists=True)
    db["fallback_runs"].create({"id": int, "created": str, "data": str, "applied": int}, pk="id",
                               if_not_exists=True)
    db["exports"].create({"id": int, "created": str, "path": str, "settings": str, "report": str}, pk="id",
                         if_not_exists=True)
    create_finetune_tables(db)
    create_engine_tables(db)
    create_lint_tables(db)
    create_smoothing_tables(db)


def create_smoothing_tables(db: sqlite_utils.Database) -> None:
    """Version 5: per-layer smoothing (SmoothQuant, AWQ): the scales as bytes and where 1/s went."""
    db["smoothing"].create({"layer": str, "method": str, "alpha": float, "scales": bytes, "scales_dtype": str,
                            "scales_shape": str, "folded_into": str, "error_before": float, "error_after": float},
                           pk="layer", if_not_exists=True)


def create_engine_tables(db: sqlite_utils.Database) -> None:
    """Version 3: TensorRT engine reports imported into the project (workbench.engine, as JSON)."""
    db["engine_reports"].create({"id": int, "created": str, "data": str}, pk="id", if_not_exists=True)


def create_lint_tables(db: sqlite_utils.Database) -> None:
    """Version 4: the last fusion lint and the project state it was run on (reused while that state lasts)."""
    db["lint_runs"].create({"id": int, "created": str, "digest": str, "source": str, "data": str}, pk="id",
                           if_not_exists=True)


def create_finetune_tables(db: sqlite_utils.Database) -> None:
    """Version 2: fine-tune runs (settings, history as JSON) and the active run's weights and learned amax."""
    db["finetune_runs"].create({"id": int, "created": str, "data": str, "calibration_id": int, "folded": str,
                                "active": int}, pk="id", if_not_exists=True)
    db["finetune_tensors"].create({"run_id": int, "kind": str, "name": str, "data": bytes, "dtype": str,
                                   "shape": str}, pk=("run_id", "kind", "name"), if_not_exists=True)


TABLES = ("meta", "model_source", "data_sources", "settings", "layers", "calibration_runs", "quantizer_stats",
          "arrays", "sensitivity_runs", "fallback_runs", "exports", "finetune_runs", "finetune_tensors",
          "engine_reports", "lint_runs", "smoothing")


def _findings(text: Any) -> dict[str, Any]:
    """A quantizer's stored auto choice and warnings (the ``findings`` column; absent in older files)."""
    if text is None:
        return {}
    value = bounded_json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"findings is not a mapping: {text!r}")
    choice, warnings = value.get("choice"), value.get("warnings") or []
    if choice is not None and not (isinstance(choice, dict) and choice.get("method") in SINGLE_METHODS):
        raise ValueError(f"the auto choice is not a mapping with one of {', '.join(SINGLE_METHODS)} as its method: "
                         f"{choice!r}")
    if not isinstance(warnings, list) or not all(isinstance(w, dict) and "message" in w for w in warnings):
        raise ValueError(f"the warnings are not a list of messages: {warnings!r}")
    return {"choice": choice, "warnings": warnings}


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def write_project(db: sqlite_utils.Database, project: Project, revision: int) -> None:
    db["meta"].insert_all([
        {"key": "schema_version", "value": str(SCHEMA_VERSION)},
        {"key": "revision", "value": str(revision)},
        {"key": "app_version", "value": project.app_version},
        {"key": "name", "value": project.name},
        {"key": "created", "value": project.created},
        {"key": "modified", "value": project.modified},
        {"key": "saved_in", "value": project.saved_in},
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
        if "sqnr_batches" not in db["calibration_runs"].columns_dict:  # a file from before it was counted
            db["calibration_runs"].add_column("sqnr_batches", int)
        if "weights_digest" not in db["calibration_runs"].columns_dict:  # a file from before it was kept
            db["calibration_runs"].add_column("weights_digest", str)
        db["calibration_runs"].insert({
            "id": run.id, "created": run.created, "method": run.method, "percentile": run.percentile,
            "num_batches": run.num_batches, "wall_time_s": run.wall_time_s, "device": run.device,
            "output_sqnr_db": run.output_sqnr_db, "warnings": _dumps(run.warnings), "unused": _dumps(run.unused),
            "folded": _dumps(run.folded), "sqnr_batches": run.sqnr_batches, "state_digest": run.state_digest,
            "weights_digest": run.weights_digest})
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
                         "state": _dumps(state),
                         "findings": _dumps({"choice": record.choice, "warnings": record.warnings})
                         if record.choice or record.warnings else None})
        if rows and "findings" not in db["quantizer_stats"].columns_dict:
            # a file written before "auto" existed: the column is added in place (older versions ignore it)
            db["quantizer_stats"].add_column("findings", str)
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
    db["engine_reports"].insert_all([{"id": r.id, "created": r.created, "data": _dumps(r.data)}
                                     for r in project.engine_reports])
    db["lint_runs"].insert_all([{"id": r.id, "created": r.created, "digest": r.digest, "source": r.source,
                                 "data": _dumps(r.warnings)} for r in project.lints])
    smoothing_rows = []
    for record in project.smoothing.values():
        data, dtype, shape = encode_array(np.asarray(record.scales, dtype=np.float32))
        smoothing_rows.append({"layer": record.layer, "method": record.method, "alpha": float(record.alpha),
                               "scales": data, "scales_dtype": dtype, "scales_shape": shape,
                               "folded_into": record.folded_into, "error_before": record.error_before,
                               "error_after": record.error_after})
    db["smoothing"].insert_all(smoothing_rows)


class _Damaged(Exception):
    """A bad value in the row being read (the reader adds file, table and row)."""


@contextlib.contextmanager
def _row(path: Path, table: str, what: str) -> Iterator[None]:
    """Errors while reading one row name the file, the table and the row (the layer, the quantizer)."""
    try:
        yield
    except _Damaged as error:
        raise ProjectError(f"{path}: table {table}, {what}: {error}") from error
    except KeyError as error:
        raise ProjectError(f"{path}: table {table}, {what}: a stored value lacks the field {error}.") from error
    except (ProjectError, SourceError, ValueError, TypeError, IndexError, AttributeError, OverflowError) as error:
        raise ProjectError(f"{path}: table {table}, {what}: invalid value ({error}).") from error


def _json(row: dict[str, Any], column: str) -> Any:
    text = row.get(column)
    if text is None:
        return None
    if not isinstance(text, str):
        raise _Damaged(f"column {column} holds {type(text).__name__}, not JSON text.")
    try:
        return bounded_json.loads(text)
    except json.JSONDecodeError as error:
        raise _Damaged(f"column {column} is not valid JSON ({error.msg} at character {error.pos}).") from error


def _names(value: Any, column: str, optional: bool = False) -> list[str] | None:
    """A JSON list of names (layer names), checked."""
    if value is None and optional:
        return None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Damaged(f"column {column}: expected a list of layer names.")
    return list(value)


def _descriptor(value: Any, column: str) -> dict[str, Any] | None:
    """A layer's stored descriptor fields, checked as the quantizer will use them."""
    if value is None:
        return None
    try:
        QuantDescriptor.from_dict(value)
    except (TypeError, ValueError) as error:
        raise _Damaged(f"invalid {column.replace('_desc', '')} descriptor {value!r}: {error}") from error
    return value


def _amax(array: np.ndarray, column: str) -> np.ndarray:
    """A stored amax: a range, so finite and never negative (else the file was edited or is damaged)."""
    if array.size and not np.isfinite(array).all():
        raise _Damaged(f"the stored {column} holds NaN or Inf; an amax is a finite range.")
    if array.size and (array < 0).any():
        raise _Damaged(f"the stored {column} is negative ({float(array.min()):.6g}); an amax is a range and cannot be "
                       "negative (the file was changed outside Quant Workbench, or is damaged).")
    return array


def _array(row: dict[str, Any], column: str, dtype_column: str, shape_column: str) -> np.ndarray:
    try:
        return decode_array(row[column], row[dtype_column], row[shape_column], f"column {column}")
    except ProjectError as error:
        raise _Damaged(str(error)) from error


def read_project(db: sqlite_utils.Database, path: Path) -> Project:
    """The project in ``db`` (already migrated to the current schema), every row checked."""
    tables = set(db.table_names())
    missing = [t for t in TABLES if t not in tables]
    if missing:
        raise ProjectError(f"{path}: the project is missing tables {missing}.")
    with _row(path, "meta", "its rows"):
        meta = {r["key"]: r["value"] for r in db["meta"].rows}
    project = Project(name=str(meta.get("name", path.stem)), created=str(meta.get("created", "")),
                      modified=str(meta.get("modified", "")), app_version=str(meta.get("app_version", "")),
                      saved_in=str(meta.get("saved_in", "")))
    model_rows = list(db["model_source"].rows)
    if len(model_rows) > 1:  # the workbench writes one (or none, for a project not given its model yet)
        raise ProjectError(f"{path}: table model_source holds {len(model_rows)} models, one expected: the file was "
                           "changed outside Quant Workbench. It was not opened; use a backup or the last good copy.")
    for row in model_rows:
        with _row(path, "model_source", "the model"):
            project.model = ModelSpec.from_dict(_json(row, "spec"))
            project.model_digests = [FileDigest(str(d["path"]), str(d["sha256"]), int(d["size"]))
                                     for d in _json(row, "digests") or []]
            input_spec = _json(row, "input_spec")
            if input_spec is not None:
                project.input_spec = InputSpec.from_dict(input_spec)
    for row in db["data_sources"].rows:
        with _row(path, "data_sources", f"{row.get('role')} data"):
            project.data[str(row["role"])] = DataSpec.from_dict(_json(row, "spec"))
    for row in db["settings"].rows:
        with _row(path, "settings", f"setting {row.get('key')!r}"):
            key, value = str(row["key"]), _json(row, "value")
            ProjectSettings.from_stored({key: value})  # checked once, here: a bad value is this file's error
            project.settings[key] = value
    for row in db["layers"].rows_where(order_by="position"):
        with _row(path, "layers", f"row {row.get('position')} (layer {row.get('name')!r})"):
            input_desc = _descriptor(_json(row, "input_desc"), "input_desc")
            weight_desc = _descriptor(_json(row, "weight_desc"), "weight_desc")
            project.layers[str(row["name"])] = LayerDecision(str(row["name"]), str(row["type"]),
                                                             bool(row["quantize"]), input_desc, weight_desc)
    arrays_by_owner: dict[str, dict[str, np.ndarray]] = {}
    for row in db["arrays"].rows:
        with _row(path, "arrays", f"array {row.get('key')!r} of {row.get('owner')!r}"):
            arrays_by_owner.setdefault(str(row["owner"]), {})[str(row["key"])] = _array(row, "data", "dtype", "shape")
    runs: dict[int, CalibrationRecord] = {}
    for row in db["calibration_runs"].rows_where(order_by="id"):
        with _row(path, "calibration_runs", f"calibration run {row.get('id')}"):
            runs[int(row["id"])] = CalibrationRecord(
                id=int(row["id"]), created=str(row["created"]), method=str(row["method"]),
                percentile=float(row["percentile"]), num_batches=int(row["num_batches"]),
                wall_time_s=float(row["wall_time_s"]), device=str(row["device"]),
                output_sqnr_db=None if row["output_sqnr_db"] is None else float(row["output_sqnr_db"]),
                warnings=list(_json(row, "warnings") or []), unused=list(_json(row, "unused") or []),
                folded=_names(_json(row, "folded"), "folded", True), sqnr_batches=int(row.get("sqnr_batches") or 0),
                state_digest=None if row.get("state_digest") is None else str(row["state_digest"]),
                weights_digest=None if row.get("weights_digest") is None else str(row["weights_digest"]))
    for row in db["quantizer_stats"].rows_where(order_by="rowid"):
        with _row(path, "quantizer_stats", f"calibration run {row.get('run_id')}, quantizer {row.get('name')!r}"):
            run = runs.get(int(row["run_id"]))
            if run is None:
                raise _Damaged("it belongs to a calibration run that is not stored.")
            name = str(row["name"])
            state = _join_arrays(_json(row, "state"), arrays_by_owner.get(f"calibration:{run.id}:{name}", {}))
            run.quantizers[name] = QuantizerRecord(
                name=name, amax=_amax(_array(row, "amax", "amax_dtype", "amax_shape"), "amax"),
                method=str(row["method"]), calibrator=str(row["calibrator"]), num_samples=int(row["num_samples"]),
                nonfinite_count=int(row["nonfinite_count"]),
                max_value=None if row["max_value"] is None else float(row["max_value"]),
                calibrator_state=state, descriptor=_json(row, "descriptor"),
                **_findings(row.get("findings")))
    project.calibrations = list(runs.values())
    for kind, table in (("sensitivity", "sensitivity_runs"), ("fallback", "fallback_runs"), ("export", "exports")):
        for row in db[table].rows_where(order_by="id"):
            with _row(path, table, f"{kind} run {row.get('id')}"):
                if kind == "sensitivity":
                    project.sensitivity.append(SensitivityRecord(int(row["id"]), str(row["created"]),
                                                                 _json(row, "data")))
                elif kind == "fallback":
                    project.fallbacks.append(FallbackRecord(int(row["id"]), str(row["created"]), _json(row, "data"),
                                                            bool(row["applied"])))
                else:
                    project.exports.append(ExportRecord(int(row["id"]), str(row["created"]), str(row["path"]),
                                                        _json(row, "settings"), _json(row, "report")))
    finetunes: dict[int, FinetuneRecord] = {}
    for row in db["finetune_runs"].rows_where(order_by="id"):
        with _row(path, "finetune_runs", f"fine-tune run {row.get('id')}"):
            data = _json(row, "data")
            if not isinstance(data, dict):
                raise _Damaged("it has no valid history.")
            finetunes[int(row["id"])] = FinetuneRecord(
                id=int(row["id"]), created=str(row["created"]), data=data,
                calibration_id=None if row["calibration_id"] is None else int(row["calibration_id"]),
                folded=_names(_json(row, "folded"), "folded") or [], active=bool(row["active"]))
    for row in db["finetune_tensors"].rows_where(order_by="rowid"):
        with _row(path, "finetune_tensors", f"fine-tune run {row.get('run_id')}, tensor {row.get('name')!r}"):
            run = finetunes.get(int(row["run_id"]))
            kind, name = str(row["kind"]), str(row["name"])
            if run is None or kind not in ("weight", "amax"):
                raise _Damaged("it belongs to no stored fine-tune run.")
            array = _array(row, "data", "dtype", "shape")
            if kind == "weight":
                run.weights[name] = array
            else:
                run.amax[name] = _amax(array, "learned amax")
    project.finetunes = list(finetunes.values())
    for row in db["engine_reports"].rows_where(order_by="id"):
        with _row(path, "engine_reports", f"engine report {row.get('id')}"):
            data = _json(row, "data")
            if not isinstance(data, dict):
                raise _Damaged("it holds no engine report.")
            project.engine_reports.append(EngineReportRecord(int(row["id"]), str(row["created"]), data))
    for row in db["lint_runs"].rows_where(order_by="id"):
        with _row(path, "lint_runs", f"lint {row.get('id')}"):
            warnings = _json(row, "data")
            if not isinstance(warnings, list) or not all(isinstance(w, dict) for w in warnings):
                raise _Damaged("it holds no lint warnings.")
            project.lints.append(LintRecord(int(row["id"]), str(row["created"]), str(row["digest"]), warnings,
                                            str(row["source"] or "")))
    for row in db["smoothing"].rows_where(order_by="layer"):
        with _row(path, "smoothing", f"the smoothing of layer {row.get('layer')!r}"):
            scales = _array(row, "scales", "scales_dtype", "scales_shape")
            if scales.ndim != 1 or not np.isfinite(scales).all() or (scales <= 0).any():
                raise _Damaged("its scales are not a list of positive finite numbers.")
            method = str(row["method"])
            if method not in ("smoothquant", "awq"):
                raise _Damaged(f"its method {method!r} is neither smoothquant nor awq.")
            layer = str(row["layer"])
            project.smoothing[layer] = SmoothingRecord(
                layer=layer, method=method, alpha=float(row["alpha"]), scales=scales.astype(np.float32),
                folded_into=None if row["folded_into"] is None else str(row["folded_into"]),
                error_before=None if row["error_before"] is None else float(row["error_before"]),
                error_after=None if row["error_after"] is None else float(row["error_after"]))
    return project


# ----- checksum ----------------------------------------------------------------------------------


def content_checksums(db: sqlite_utils.Database) -> dict[str, str]:
    """A digest of each table's rows (of ``meta``, the name only), in primary-key order, from the stored values.

    Saved in ``meta.checksum``: SQLite has no checksums of its own, so a flipped byte inside a value
    (an amax, a layer decision) would otherwise load as a different, valid-looking project.
    """
    sums: dict[str, str] = {}
    for table in TABLES:
        if table == "meta" or table not in db.table_names():
            continue
        order = ", ".join(f"[{pk}]" for pk in db[table].pks)
        hasher = hashlib.blake2b(digest_size=16)
        for row in db.execute(f"SELECT * FROM [{table}] ORDER BY {order}"):
            for value in row:
                if value is None:
                    hasher.update(b"N")
                elif isinstance(value, bytes):
                    hasher.update(b"B%d:" % len(value) + value)
                elif isinstance(value, str):
                    encoded = value.encode("utf-8", "surrogatepass")
                    hasher.update(b"S%d:" % len(encoded) + encoded)
                else:
                    hasher.update(type(value).__name__.encode() + repr(value).encode() + b";")
            hasher.update(b"|")
        sums[table] = hasher.hexdigest()
    name = next(db["meta"].rows_where("key = ?", ["name"]), None) if "meta" in db.table_names() else None
    sums["meta.name"] = hashlib.blake2b(repr(None if name is None else name["value"]).encode(),
                                        digest_size=16).hexdigest()
    return sums


def check_content(db: sqlite_utils.Database, path: Path) -> None:
    """Compare the tables with the checksums saved with them (files without checksums pass).

    Raises:
        ProjectError: a table's rows differ from what was saved; the message names the tables.
    """
    row = next(db["meta"].rows_where("key = ?", ["checksum"]), None)
    if row is None:
        return
    try:
        saved = bounded_json.loads(row["value"])
        if not isinstance(saved, dict):
            raise ValueError("not a mapping")
    except (TypeError, ValueError) as error:
        raise ProjectError(f"{path}: table meta: the saved checksum is unreadable ({error}).") from error
    now = content_checksums(db)
    changed = sorted(table for table in now if saved.get(table) != now[table])
    if changed:
        raise ProjectError(f"{path}: the contents of table{'s' if len(changed) > 1 else ''} {', '.join(changed)} do "
                           "not match the checksum saved with them: the file was damaged or changed outside Quant "
                           "Workbench. It was not opened; use a backup or the last good copy.")
