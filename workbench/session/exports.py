"""Where a project's exports go, and which existing files an export may replace.

Export paths are stored relative to the project's folder (absolute where they lie outside it), so an
``export`` from any working directory writes the same file. A path typed by the user is taken from
where it was typed. An existing file is only replaced when the project's export history says that
this project wrote it and it is unchanged since (same path, same sha256); anything else needs
``force``: an export must not silently overwrite another project's ONNX or a file the user edited.

The export job itself is a function of a :class:`~workbench.session.Session` (its methods call it),
like :mod:`workbench.session.tensorrt`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from workbench.project import ExportRecord
from workbench.project.model import now_iso
from workbench.project.settings import jsonable
from workbench.session.errors import SessionError
from workbench.session.events import SessionEvent
from workbench.session.state import state_digest
from workbench.sources.model_source import sha256_of
from workbench.sources.paths import absolute_path, relative_path

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["resolve_export_path", "stored_export_path", "check_overwrite", "export_digest", "export",
           "overwrite_refusal", "default_export_path"]


def resolve_export_path(typed: str | Path | None, configured: str | None, project_dir: Path, default_name: str) -> Path:
    """The absolute target: ``typed`` (from the working directory), else the project's setting (from the
    project's folder), else ``default_name`` next to the project."""
    if typed is not None:
        return Path(typed).expanduser().resolve()
    if configured:
        return Path(absolute_path(configured, project_dir) or configured).resolve()
    return (project_dir / default_name).resolve()


def stored_export_path(target: Path, project_dir: Path) -> str:
    """``target`` as the project stores it: relative to the project's folder where it lies under it."""
    return relative_path(str(target), project_dir) or str(target)


def export_digest(target: Path) -> str:
    """The sha256 the export history keeps of a written file."""
    return sha256_of(target).sha256


def check_overwrite(target: Path, history: list[ExportRecord], project_dir: Path, force: bool) -> None:
    """Refuse to replace ``target`` unless this project wrote it and it is unchanged since (or ``force``).

    Raises:
        SessionError: ``target`` exists and the history does not show it as this project's, unchanged.
    """
    if force or not target.exists():
        return
    ours = [record for record in history
            if Path(absolute_path(record.path, project_dir) or record.path).resolve() == target]
    if not ours:
        raise SessionError(f"{target} exists and this project did not write it; nothing was exported. Choose another "
                           "path, or overwrite it with --force.")
    recorded = (ours[-1].settings or {}).get("sha256")
    if recorded is not None and recorded != export_digest(target):
        raise SessionError(f"{target} changed since this project exported it (its sha256 differs); nothing was "
                           "exported. Choose another path, or overwrite it with --force.")


def default_export_path(session: Session) -> Path:
    """The project's export setting (from the project's folder), else ``<project>.qdq.onnx`` next to it."""
    stem = session.path.stem if session.path is not None else (session.project.name or "model")
    return resolve_export_path(None, session.settings.export.path, session._project_dir(),
                               f"{stem}.qdq.onnx")


def overwrite_refusal(session: Session, path: str | Path | None = None) -> str | None:
    """Why an export to ``path`` (default: the project's) would refuse without ``force``; None if it would not."""
    target = Path(path).expanduser().resolve() if path is not None else session.default_export_path()
    try:
        check_overwrite(target, session.project.exports, session._project_dir(), force=False)
    except SessionError as error:
        return str(error)
    return None


def export(session: Session, path: str | Path | None = None, *, opset: int | None = None,
           dynamic_batch: bool | None = None, amax_json: bool | None = None, calibration_cache: bool | None = None,
           remember: bool = True, force: bool = False, fp8_ops: str | None = None):
    """Write validated QDQ ONNX; with ``remember`` the export settings and history are updated.

    Raises:
        SessionError: the target may not be replaced (see :func:`check_overwrite`), the model is not
            calibrated, or a file cannot be written (nothing is left half-written).
    """
    from workbench.export import export_qdq_onnx

    settings = session.settings.export
    opset = opset or settings.opset
    dynamic_batch = settings.dynamic_batch if dynamic_batch is None else dynamic_batch
    amax_json = settings.amax_json if amax_json is None else amax_json
    calibration_cache = settings.calibration_cache if calibration_cache is None else calibration_cache
    fp8_ops = fp8_ops or settings.fp8_ops
    target = Path(path).expanduser().resolve() if path is not None else session.default_export_path()
    project_dir = session._project_dir()
    if remember:  # a preview writes where the app chose (a folder of its own), not over the user's files
        check_overwrite(target, session.project.exports, project_dir, force)
    model = session._require_calibrated()
    try:
        report = export_qdq_onnx(model, session.sample_inputs(batch=1), target, opset=opset,
                                 dynamic_batch=dynamic_batch, output=session.settings.output,
                                 amax_json_path=target.with_suffix(".amax.json") if amax_json else None,
                                 calibration_cache_path=target.with_suffix(".calib.cache") if calibration_cache
                                 else None, fp8_ops=fp8_ops)
    except OSError as error:  # a full disk, a read-only folder: name the file, not "internal error"
        where = error.filename or target
        raise SessionError(f"{where}: cannot be written ({error.strerror or error}); nothing was exported "
                           f"to {target}.") from error
    if not remember:
        return report
    report.int8_vs_fp32, problem = _int8_vs_fp32(session)
    if problem:
        report.warnings.append(problem)
    stored = stored_export_path(target, project_dir)
    session.project.settings["export"] = replace(settings, path=stored, opset=opset, dynamic_batch=dynamic_batch,
                                                 amax_json=amax_json, calibration_cache=calibration_cache,
                                                 fp8_ops=fp8_ops).to_stored()
    # the graph's node names in order: an engine report names a Myelin region by its first and last node only
    nodes = [node.name for node in onnx.load(str(target), load_external_data=False).graph.node]
    session.project.exports.append(ExportRecord(session.project.next_id(session.project.exports), now_iso(), stored,
                                                {"opset": opset, "dynamic_batch": dynamic_batch,
                                                 "sha256": export_digest(target), "nodes": nodes,
                                                 "state_digest": state_digest(session.project)},
                                                jsonable(report.to_dict())))
    session._changed(SessionEvent.EXPORT, path=str(target))
    return report


# The INT8-vs-FP32 headline of an export is measured on at most this many evaluation batches.
HEADLINE_BATCHES = 8


def _int8_vs_fp32(session: Session) -> tuple[dict[str, Any] | None, str]:
    """The project's metric and output SQNR, FP32 vs the exported (fake-quant) model, on the evaluation data;
    (None, why) when it cannot be measured: the file is written and valid either way."""
    from workbench.session.analysis import evaluate

    try:
        evaluation = evaluate(session, num_batches=HEADLINE_BATCHES)
    except Exception as error:  # noqa: BLE001 - a user's metric or data: the export stands, the gap is not known
        return None, f"INT8 vs FP32 not measured: {type(error).__name__}: {error}"
    role = "evaluation" if "evaluation" in session.project.data else "calibration"
    return {**jsonable(evaluation.to_dict()), "data": role}, ""
