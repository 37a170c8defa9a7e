"""Where a project's exports go, and which existing files an export may replace.

Export paths are stored relative to the project's folder (absolute where they lie outside it), so an
``export`` from any working directory writes the same file. A path typed by the user is taken from
where it was typed. An existing file is only replaced when the project's export history says that
this project wrote it and it is unchanged since (same path, same sha256) and the file carries the mark
Quant Workbench leaves in what it writes (a history can be edited; the file's content cannot be forged by
the project alone); anything else needs ``force``: an export must not silently overwrite another
project's ONNX or a file the user edited. The same holds for the side files (amax table, calibration
cache). A stored export path (not one the user typed) must lie in the project's folder, and no export,
forced or not, writes over the project file, its model, data or code.

The export job is planned (:func:`plan_export`), written (:func:`write_export`) and recorded
(:func:`export_record`) from the values it is given; the :class:`~workbench.session.Session`'s ``export``
runs the three and keeps the record.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.export.provenance import written_here
from workbench.project import ExportRecord, Project
from workbench.project.model import now_iso
from workbench.project.settings import ExportSettings, jsonable
from workbench.session import confirmed_targets
from workbench.session.errors import SessionError
from workbench.session.paths import project_code
from workbench.session.state import state_digest
from workbench.sources.demo import DIGITS_DATA
from workbench.sources.model_source import LoadedModel, sha256_of
from workbench.sources.paths import absolute_path, relative_path

__all__ = ["resolve_export_path", "stored_export_path", "check_overwrite", "export_digest",
           "overwrite_refusal", "default_export_path", "planned_files", "protected_files", "check_not_protected",
           "check_confined", "suspicious_exports", "SIDE_FILES", "ExportPlan", "plan_export", "write_export",
           "remember", "remembered_settings", "export_record", "headline", "HEADLINE_BATCHES", "HEADLINE_ROUNDING",
           "ParityOutputs"]


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


# the side files an export can write beside its .onnx: (setting, suffix, what provenance calls the kind)
SIDE_FILES = (("amax_json", ".amax.json"), ("calibration_cache", ".calib.cache"))
_KIND_WORDS = {"onnx": "an ONNX file", "amax_json": "an amax table", "calibration_cache": "a calibration cache"}


def planned_files(target: Path, amax_json: bool, calibration_cache: bool) -> dict[Path, str]:
    """Every file an export to ``target`` writes, with its kind ("onnx", "amax_json", "calibration_cache")."""
    files = {target: "onnx"}
    wanted = {"amax_json": amax_json, "calibration_cache": calibration_cache}
    for kind, suffix in SIDE_FILES:
        if wanted[kind]:
            files[target.with_suffix(suffix)] = kind
    return files


def _recorded_digest(path: Path, kind: str, history: list[ExportRecord], project_dir: Path) -> str | None:
    """The sha256 the newest export of ``history`` recorded for ``path`` (as its .onnx or a side file)."""
    for record in reversed(history):
        settings = record.settings or {}
        if kind == "onnx":
            if Path(absolute_path(record.path, project_dir) or record.path).resolve() == path:
                return settings.get("sha256")
            continue
        for stored, digest in (settings.get("side_files") or {}).items():
            if Path(absolute_path(stored, project_dir) or stored).resolve() == path:
                return digest
    return None


def check_overwrite(target: Path, history: list[ExportRecord], project_dir: Path, force: bool,
                    kind: str = "onnx") -> None:
    """Refuse to replace ``target`` unless this project wrote it and it is unchanged since (or ``force``).

    "This project wrote it" needs two things, because the history is part of the project file and anyone
    can edit that: the history records ``target`` with the sha256 it has now, *and* the file is one Quant
    Workbench writes, with the mark it leaves (:mod:`workbench.export.provenance`). A crafted history that
    lists someone else's file (with that file's sha256) is not enough.

    Raises:
        SessionError: ``target`` exists and is not this project's unchanged export (``kind`` says which
            of the export's files it is: "onnx", "amax_json", "calibration_cache").
    """
    if force or not target.exists():
        return
    what = "" if kind == "onnx" else f" ({_KIND_WORDS[kind]} beside the export)"
    advice = "Choose another path, or overwrite it with --force."
    recorded = _recorded_digest(target, kind, history, project_dir)
    if recorded is None:
        raise SessionError(f"{target}{what} exists and this project did not write it; nothing was exported. {advice}")
    if recorded != export_digest(target):
        raise SessionError(f"{target}{what} changed since this project exported it (its sha256 differs); nothing "
                           f"was exported. {advice}")
    if not written_here(target, kind):
        raise SessionError(f"{target}{what} is not {_KIND_WORDS[kind]} Quant Workbench wrote, although the "
                           "project's export history lists it (a history alone cannot vouch for a file: it may "
                           f"have been edited); nothing was exported. {advice}")


def protected_files(project: Project, project_path: Path | None, base_dir: Path) -> dict[Path, str]:
    """Files an export must never replace, ``--force`` or not: the project file (and SQLite's journal files
    beside it), the model's files and the data it reads, and the code it runs; {path: what it is}."""
    protected: dict[Path, str] = {}
    if project_path is not None:
        project_file = Path(project_path).expanduser().resolve()
        protected[project_file] = "the project file itself"
        for suffix in ("-journal", "-wal", "-shm"):
            protected[project_file.with_name(project_file.name + suffix)] = "the project file's SQLite journal"
    model = project.model
    files = [(model.weights, "the model's weights")]
    if model.kind in ("pickle", "hf"):  # a pickle file, or a local Hugging Face folder (its files are the model)
        files.append((model.target, "the model"))
    for value, what in files:
        if value:
            protected[Path(absolute_path(value, base_dir) or value).resolve()] = what
    for digest in project.model_digests:  # every file the model was read from (a demo's weights, a factory's)
        protected.setdefault(Path(absolute_path(digest.path, base_dir) or digest.path).resolve(),
                             "one of the model's files (the project keeps its digest)")
    for role, spec in project.data.items():
        if spec.kind == "demo":  # the built-in data lives beside the demo weights
            protected[DIGITS_DATA.resolve()] = f"the {role} data (the built-in digits)"
        elif spec.path and ":" not in spec.path:
            protected[Path(absolute_path(spec.path, base_dir) or spec.path).resolve()] = f"the {role} data"
    for reference in project_code(project, base_dir):
        for name in reference.files:
            protected[Path(name).resolve()] = f"code the project runs ({reference.role})"
    return protected


def check_not_protected(files: dict[Path, str], protected: dict[Path, str]) -> None:
    """Refuse an export whose files would replace one of ``protected`` (see :func:`protected_files`).

    Raises:
        SessionError: which file, and what it is to the project; ``--force`` does not change this.
    """
    folders = [(folder, what) for folder, what in protected.items() if folder.is_dir()]
    for path in files:
        inside = next((f"in {folder}, {what}" for folder, what in folders if path.is_relative_to(folder)), None)
        if path in protected or inside:
            raise SessionError(f"{path} is {protected.get(path) or inside}: an export never writes over it (not "
                               "even with --force); nothing was exported. Choose another output path.")


def check_confined(target: Path, project_dir: Path, stored: str | None, project_path: Path | None = None) -> None:
    """A path the project stores (not one the user typed) must lie in the project's folder, or be one the
    user named for this project file on this machine before (:mod:`workbench.session.confirmed_targets`): a
    project file received from someone else must not be able to send an export anywhere on this machine.

    Raises:
        SessionError: the stored export path lies outside the project's folder and was never confirmed.
    """
    if target.is_relative_to(project_dir.resolve()):
        return
    if project_path is not None and confirmed_targets.confirmed(project_path, target):
        return
    raise SessionError(f"The project's export path {stored} leads to {target}, outside the project's folder "
                       f"({project_dir}): a project file alone cannot send an export there; nothing was exported. "
                       f"Give the path yourself (-o {target}) to export there.")


def suspicious_exports(project: Project, project_path: Path | None, base_dir: Path) -> list[str]:
    """What in the export history no export of this project in this place would have written: paths outside
    the project's folder, over the project's own files, or at a file Quant Workbench did not write. For
    ``show``: a project received from someone else may carry a crafted history."""
    project_dir = base_dir.resolve()
    protected = protected_files(project, project_path, base_dir)
    notes: list[str] = []
    for record in project.exports:
        stored = [(record.path, "onnx")] + [(p, "side") for p in ((record.settings or {}).get("side_files") or {})]
        for value, kind in stored:
            path = Path(absolute_path(value, base_dir) or value).resolve()
            if path in protected:
                notes.append(f"export {record.id} names {path}, which is {protected[path]}")
            elif not path.is_relative_to(project_dir):
                notes.append(f"export {record.id} names {path}, outside the project's folder")
            elif kind == "onnx" and path.is_file() and not written_here(path, "onnx"):
                notes.append(f"export {record.id} names {path}, which is not an ONNX file Quant Workbench wrote")
    return notes


def default_export_path(project: Project, settings: ExportSettings, project_path: Path | None,
                        project_dir: Path) -> Path:
    """The project's export setting (from the project's folder), else ``<project>.qdq.onnx`` next to it."""
    stem = project_path.stem if project_path is not None else (project.name or "model")
    return resolve_export_path(None, settings.path, project_dir, f"{stem}.qdq.onnx")


def overwrite_refusal(project: Project, settings: ExportSettings, target: Path, project_dir: Path) -> str | None:
    """Why an export to ``target`` with the project's export ``settings`` would refuse without ``force``; None
    if it would not."""
    try:
        for file, kind in planned_files(target, settings.amax_json, settings.calibration_cache).items():
            check_overwrite(file, project.exports, project_dir, force=False, kind=kind)
    except SessionError as error:
        return str(error)
    return None


@dataclass
class ExportPlan:
    """An export's target, the files it writes and its options, checked before anything is written.

    Attributes:
        target: the .onnx file; ``files``: every file it writes, with its kind (see :func:`planned_files`).
        typed: the user named the target (else it is the project's setting or the default).
        settings: the project's export settings the options not given came from.
    """

    target: Path
    files: dict[Path, str]
    typed: bool
    settings: ExportSettings
    opset: int
    dynamic_batch: bool
    amax_json: bool
    calibration_cache: bool
    fp8_ops: str
    outputs: tuple[str, ...] | None = None
    static_sequence: bool = False
    min_cosine: float = 0.999  # the parity threshold (export.min_cosine unless given)
    strict: bool = False  # refuse a file that fails parity (else it is written "not validated")
    parity_batches: int = 0  # calibration batches parity is checked on besides the sample


def plan_export(project: Project, settings: ExportSettings, target: Path, *, typed: bool, project_path: Path | None,
                base_dir: Path, project_dir: Path, remember: bool, force: bool, opset: int | None = None,
                dynamic_batch: bool | None = None, amax_json: bool | None = None,
                calibration_cache: bool | None = None, fp8_ops: str | None = None,
                outputs: tuple[str, ...] | None = None, static_sequence: bool | None = None,
                min_cosine: float | None = None, strict: bool = False) -> ExportPlan:
    """The export to ``target`` with the options given (the others from ``settings``), checked: it writes over
    none of the project's own files, and with ``remember`` over no file it may not replace.

    Raises:
        SessionError: the target may not be replaced (see :func:`check_overwrite`, :func:`check_not_protected`,
            :func:`check_confined`).
    """
    plan = ExportPlan(target, {}, typed, settings, opset or settings.opset,
                      settings.dynamic_batch if dynamic_batch is None else dynamic_batch,
                      settings.amax_json if amax_json is None else amax_json,
                      settings.calibration_cache if calibration_cache is None else calibration_cache,
                      fp8_ops or settings.fp8_ops, outputs or settings.outputs,
                      settings.static_sequence if static_sequence is None else static_sequence,
                      settings.min_cosine if min_cosine is None else min_cosine, strict,
                      settings.parity_batches)
    if not (isinstance(plan.min_cosine, (int, float)) and -1.0 <= plan.min_cosine <= 1.0):
        raise SessionError(f"min_cosine is a cosine similarity between -1 and 1, got {plan.min_cosine!r}.")
    plan.files = planned_files(target, plan.amax_json, plan.calibration_cache)
    check_not_protected(plan.files, protected_files(project, project_path, base_dir))
    if remember:  # a preview writes where the app chose (a folder of its own), not over the user's files
        if not typed and settings.path is not None and project_path is not None:
            # an unsaved project's settings were all made here; a saved one may have come from elsewhere
            check_confined(target, project_dir, settings.path, project_path)
        for file, kind in plan.files.items():
            check_overwrite(file, project.exports, project_dir, force, kind)
    return plan


def planned_new_files(plan: ExportPlan) -> list[Path]:
    """The files ``plan`` writes (ONNX external data included) that do not exist yet: those an export that does
    not finish (Ctrl-C during its validation, a failed save) removes, so that they block no later export."""
    candidates = [*plan.files, plan.target.with_name(plan.target.name + ".data")]
    return [file for file in dict.fromkeys(candidates) if not file.exists()]


def discard(files: list[Path]) -> None:
    """Remove the new files of an export the project did not record (see :func:`planned_new_files`)."""
    for file in files:
        file.unlink(missing_ok=True)


def write_export(plan: ExportPlan, model: nn.Module, sample: Any, parity_batches: list[Any] | None = None, *,
                 loaded: LoadedModel | None = None, parity_outputs: Callable[[int, Any], None] | None = None):
    """Write validated QDQ ONNX of the calibrated ``model`` (traced on ``sample``; parity also checked on
    ``parity_batches``) as ``plan`` says; the export's report (``validated`` False: written below the parity
    threshold, with the diagnosis). The graph returns every output of the model, or those ``plan.outputs``
    names (the project's output key picks what metrics compare, not what the file holds).

    A lazily opened model (``loaded.checkpoint``) is exported with its weights streamed from the checkpoint, or,
    where that route cannot write it, with every weight read first (:mod:`workbench.export.streamed_export`).
    ``parity_outputs`` is given each parity batch's output (a :class:`ParityOutputs` keeps them for the headline).

    Raises:
        SessionError: a file cannot be written (nothing is left half-written).
    """
    from workbench.export.streamed_export import export_lazily_opened

    sides = {kind: file for file, kind in plan.files.items()}
    checkpoint = loaded.checkpoint if loaded is not None else None
    try:
        return export_lazily_opened(model, checkpoint, loaded.model if loaded is not None else model, sample,
                                    plan.target, materialise=loaded.materialise if loaded is not None else _nothing,
                                    opset=plan.opset, dynamic_batch=plan.dynamic_batch,
                                    outputs=plan.outputs, static_sequence=plan.static_sequence,
                                    amax_json_path=sides.get("amax_json"),
                                    calibration_cache_path=sides.get("calibration_cache"), fp8_ops=plan.fp8_ops,
                                    min_cosine=plan.min_cosine, strict=plan.strict, parity_batches=parity_batches,
                                    parity_outputs=parity_outputs)
    except OSError as error:  # a full disk, a read-only folder: name the file, not "internal error"
        where = error.filename or plan.target
        raise SessionError(f"{where}: cannot be written ({error.strerror or error}); nothing was exported "
                           f"to {plan.target}.") from error


def _nothing() -> None:
    """Every weight is in memory already."""


def remember(plan: ExportPlan, project: Project, report: Any, evaluate: Callable[[], Any], *,
             project_path: Path | None, project_dir: Path) -> ExportRecord:
    """What ``project`` keeps of ``plan`` written with ``report``: a target the user named outside the project's
    folder is remembered for it (:mod:`workbench.session.confirmed_targets`), the report gets the INT8-vs-FP32
    headline (:func:`headline` of ``evaluate``), the export setting becomes ``plan``'s; returns the record for
    the export history (the project's state digest taken with that setting)."""
    if plan.typed and project_path is not None and not plan.target.is_relative_to(project_dir.resolve()):
        confirmed_targets.remember(project_path, plan.target)  # the user named it: later plain exports may go there
    report.int8_vs_fp32, problem = headline(evaluate, project)
    if problem:
        report.warnings.append(problem)
        report.entry_kinds[problem] = "int8_vs_fp32"  # a warning kind of workbench.export.notes
    project.settings["export"] = remembered_settings(plan, project_dir)
    return export_record(plan, project, report, project_dir)


def remembered_settings(plan: ExportPlan, project_dir: Path) -> dict[str, Any]:
    """The project's export setting after ``plan`` was written: its target (relative to the project's folder)
    and options, so that a plain ``export`` repeats it."""
    return replace(plan.settings, path=stored_export_path(plan.target, project_dir), opset=plan.opset,
                   dynamic_batch=plan.dynamic_batch, amax_json=plan.amax_json,
                   calibration_cache=plan.calibration_cache, fp8_ops=plan.fp8_ops,
                   outputs=plan.outputs, static_sequence=plan.static_sequence).to_stored()


def export_record(plan: ExportPlan, project: Project, report: Any, project_dir: Path) -> ExportRecord:
    """The export history's record of ``plan`` written with ``report``: where, the written files' sha256 (so that
    a later export may replace them, and only them), the graph's node names and the project's state digest."""
    import onnx  # here, not at the top: opening a project (the Session imports this module) loads no onnx

    stored = stored_export_path(plan.target, project_dir)
    # the graph's node names in order: an engine report names a Myelin region by its first and last node only
    nodes = [node.name for node in onnx.load(str(plan.target), load_external_data=False).graph.node]
    return ExportRecord(project.next_id(project.exports), now_iso(), stored,
                        {"opset": plan.opset, "dynamic_batch": plan.dynamic_batch,
                         "sha256": export_digest(plan.target), "nodes": nodes,
                         "validated": bool(getattr(report, "validated", True)), "min_cosine": plan.min_cosine,
                         "state_digest": state_digest(project),
                         "side_files": {stored_export_path(file, project_dir): export_digest(file)
                                        for file, kind in plan.files.items() if kind != "onnx" and file.is_file()}},
                        jsonable(report.to_dict()))


# The INT8-vs-FP32 headline of an export is measured on at most this many evaluation batches.
HEADLINE_BATCHES = 8
# How the headline's quantized model rounds: as the exported graph computes (ONNX's QuantizeLinear), so that the
# parity check's forwards, which round so to match onnxruntime, are the headline's where the batches coincide
HEADLINE_ROUNDING = "onnx"


class ParityOutputs:
    """The quantized model's outputs on an export's parity batches (the entry the metrics compare, ``output``), as
    the parity check computed them (:data:`HEADLINE_ROUNDING`), so that the headline does not run those batches
    again: called by the export with each batch's index and output, it keeps those of the parity batches that are
    the same inputs as the headline's batch at the same position (``headline_batches``: the first evaluation
    batches, ``(inputs, targets)`` as the data gives them), and hands them to the headline (:meth:`known`).

    What it keeps is the compared entry of those batches only (an LLM's logits), as the headline's own quantized
    pass would have kept it; nothing when the headline measures other data."""

    def __init__(self, parity_batches: list[Any], output: str | None, headline_batches: list[Any]) -> None:
        self.output = output
        self.parity_batches = parity_batches
        self.wanted = {i for i, (parity, batch) in enumerate(zip(parity_batches, headline_batches))
                       if _same_inputs((parity,), batch)}
        self.outputs: dict[int, Any] = {}

    def __call__(self, index: int, output: Any) -> None:
        from workbench.quant.algorithms.batches import select_output

        if index not in self.wanted:
            return
        try:
            self.outputs[index] = _detached(select_output(output, self.output))
        except ValueError:  # an output key the model lacks: the headline's own pass says so
            self.outputs.pop(index, None)

    def known(self, batches: list[Any]) -> dict[int, Any]:
        """The kept outputs of ``batches`` (the headline's) by index, each where its inputs are still the parity
        batch's (data drawn afresh could come in another order); handed out once."""
        found = {i: self.outputs[i] for i, batch in enumerate(batches) if i in self.outputs
                 and _same_inputs((self.parity_batches[i],), batch)}
        self.outputs.clear()
        return found


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


def _same_inputs(a: Any, b: Any) -> bool:
    """Whether two batches call the model with the same inputs, bit for bit, wherever their tensors are (the parity
    batches are on the session's device, the data's as it gives them)."""
    from workbench.analysis.evaluator import same_output
    from workbench.quant.algorithms.batches import model_inputs, to_device

    cpu = torch.device("cpu")
    return same_output(to_device(model_inputs(a), cpu), to_device(model_inputs(b), cpu))


def headline(evaluate: Callable[[], Any], project: Project) -> tuple[dict[str, Any] | None, str]:
    """The INT8-vs-FP32 headline of an export: ``evaluate()`` (the project's metric and output SQNR, FP32 vs the
    exported fake-quant model, on :data:`HEADLINE_BATCHES` of the evaluation data) with the data it used; (None,
    why) when it cannot be measured: the file is written and valid either way."""
    try:
        evaluation = evaluate()
    except Exception as error:  # noqa: BLE001 - a user's metric or data: the export stands, the gap is not known
        return None, f"INT8 vs FP32 not measured: {type(error).__name__}: {error}"
    role = "evaluation" if "evaluation" in project.data else "calibration"
    return {**jsonable(evaluation.to_dict()), "data": role}, ""
