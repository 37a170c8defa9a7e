"""Closing the loop with TensorRT: fusion lint before building, the engine's report after, as session jobs.

Functions of a :class:`~workbench.session.Session` (its methods call them), so that the session's core
stays about the project's own jobs.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from workbench.engine import EngineReport, EngineReportError
from workbench.engine.report import EngineMismatchError, import_engine_report
from workbench.export.lint import FIX_ACTIONS, LintFix, LintWarning, lint_qdq_graph
from workbench.project.model import EngineReportRecord, LintRecord, now_iso
from workbench.project.settings import RULES
from workbench.quant.nn import QuantAdd, QuantConcat, QuantMatMul
from workbench.session.errors import EngineNotThisModel, SessionError
from workbench.session.events import SessionEvent
from workbench.session.exports import export_digest
from workbench.session.state import state_digest

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["lint", "latest_lint", "apply_fix", "import_engine", "latest_engine_report", "REUSED", "PREVIEW"]


# the project layer type of a functional operation, by the ONNX op it exports to
_FUNCTIONAL_LAYER_OF_OP = {"Add": QuantAdd.__name__, "Concat": QuantConcat.__name__, "MatMul": QuantMatMul.__name__}


def lint(session: Session) -> list[LintWarning]:
    """Fusion hazards of the project as it would export now; kept in the project (:attr:`Project.lints`).

    The same state is never exported twice for it: while the project is as it was at the last lint, that lint's
    warnings come back; an export of this very state (the file unchanged since) is read instead of a new preview
    export. The project's layers, settings and calibration are unchanged either way.
    """
    project = session.project
    digest = state_digest(project)
    last = project.lints[-1] if project.lints else None
    if last is not None and last.digest == digest:
        if last.source != REUSED:
            project.lints[-1] = replace(last, source=REUSED)
        return [LintWarning.from_dict(item) for item in last.warnings]
    exported = _export_of_state(session, digest)
    if exported is not None:
        warnings, source = _lint_file(exported), exported.name
    else:
        with tempfile.TemporaryDirectory(prefix="workbench-lint-") as folder:
            path = Path(folder) / "lint.onnx"
            session.export(path, remember=False)
            warnings, source = _lint_file(path), PREVIEW
    warnings = [_with_layer_targets(session, warning) for warning in warnings]
    project.lints = [LintRecord(project.next_id(project.lints), now_iso(), digest,
                                [warning.to_dict() for warning in warnings], source)]
    session._changed(SessionEvent.LINT)  # a result the project keeps, like a sensitivity run
    return warnings


REUSED = "the last lint (the project is unchanged since)"
PREVIEW = "a preview export"


def _lint_file(path: Path) -> list[LintWarning]:
    # the graph and its small tensors (scales): a big model's weights stay in their external data file
    return lint_qdq_graph(onnx.load(str(path), load_external_data=False))


def _export_of_state(session: Session, digest: str) -> Path | None:
    """The project's latest export when it was written from the state ``digest`` and is still the file written."""
    if not session.project.exports:
        return None
    record = session.project.exports[-1]
    settings = record.settings or {}
    if settings.get("state_digest") != digest:
        return None
    path = Path(session.export_path(record))
    try:
        return path if path.is_file() and export_digest(path) == settings.get("sha256") else None
    except OSError:
        return None


def latest_lint(session: Session) -> tuple[list[LintWarning], bool, str] | None:
    """The project's last lint: (warnings, whether the project changed since, what was linted); None: never linted."""
    if not session.project.lints:
        return None
    last = session.project.lints[-1]
    return ([LintWarning.from_dict(item) for item in last.warnings], last.digest != state_digest(session.project),
            last.source)


def _with_layer_targets(session: Session, warning: LintWarning) -> LintWarning:
    """``warning`` with its fix aimed at the project's layers.

    A functional operation the project leaves in float exports as a plain op of the module whose forward
    calls it (``block/Add``), so the graph names the module (``block``); the layer to quantize is that
    module's one functional layer of the op's kind (``block.add``).
    """
    fix = warning.fix
    if fix is None or fix.action not in ("quantize", "leave_float"):
        return warning
    layers = session.project.layers
    ops = {_FUNCTIONAL_LAYER_OF_OP.get(node.rsplit("/", 1)[-1].split("_")[0]) for node in warning.nodes}
    targets = []
    for target in fix.targets:
        candidates = [name for name, decision in layers.items()
                      if name.rpartition(".")[0] == target and decision.type in ops]
        targets.append(candidates[0] if target not in layers and len(candidates) == 1 else target)
    if targets == list(fix.targets):
        return warning
    description = fix.description
    for old, new in zip(fix.targets, targets):
        description = description.replace(f"({old})", f"({new})")
    return replace(warning, fix=replace(fix, targets=tuple(targets), description=description))


def apply_fix(session: Session, fix: LintFix) -> list[str]:
    """Apply a lint warning's fix through the session; returns what changed (layers, pins or rules).

    Raises:
        SessionError: an unknown action, or targets the project does not have.
    """
    if fix.action not in FIX_ACTIONS:
        raise SessionError(f"Unknown fix {fix.action!r}; the fixes are: {', '.join(FIX_ACTIONS)}.")
    targets = list(fix.targets)
    if fix.action == "quantize":
        return session.set_quantize(targets, True)
    if fix.action == "leave_float":
        return session.set_quantize(targets, False)
    if fix.action == "pin":
        if len(targets) < 2:
            raise SessionError(f"A pin shares one quantizer between at least two names, got {targets}.")
        pins = [list(pair) for pair in session.settings.pins]
        added = [[targets[0], other] for other in targets[1:] if [targets[0], other] not in pins]
        if added:
            session.set_setting("pins", pins + added)
        return [f"{a} = {b}" for a, b in added]
    rules = session.settings.rules
    unknown = [name for name in targets if name not in RULES]
    if unknown:
        raise SessionError(f"No placement rule named {', '.join(unknown)}; the rules are: {', '.join(RULES)}.")
    changed = [name for name in targets if not getattr(rules, name)]
    if changed:
        session.update_setting("rules", **{name: True for name in changed})
    return changed


def import_engine(session: Session, layer_info: str | Path, profile: str | Path | None = None, *,
                  remember: bool = True, onnx_file: str | Path | None = None, force: bool = False) -> EngineReport:
    """Read trtexec's layer information (and profile) against the project's layers; kept in the project.

    ``onnx_file``: the ONNX file the engine was built from, to look node names up in (an engine of an ONNX
    file the workbench did not write). ``force``: report an engine in which fewer than half of the project's
    quantized layers are found (refused otherwise: it looks like another model's).

    Raises:
        SessionError: a file is not the trtexec report it should be, or the engine is not this model's
            (the message names the file and how to map it); nothing is stored then.
    """
    layers = {name: decision.quantize for name, decision in session.project.layers.items()}
    try:
        report = import_engine_report(str(layer_info), str(profile) if profile is not None else None, layers,
                                      _exported_node_orders(session), module_types=_module_types(session),
                                      onnx=str(onnx_file) if onnx_file is not None else None, force=force)
    except EngineMismatchError as error:
        raise EngineNotThisModel(str(error)) from error
    except EngineReportError as error:
        raise SessionError(str(error)) from error
    if remember:
        records = session.project.engine_reports
        records.append(EngineReportRecord(session.project.next_id(records), now_iso(), report.to_dict()))
        session.dirty = True
    return report


def _module_types(session: Session) -> dict[str, str]:
    """Every module of the float model and every layer of the project (functional ones such as ``block.add``
    included) -> its type, so engine names map only onto what this model has."""
    types = {name: type(module).__name__ for name, module in session.float_model.named_modules() if name}
    types.update({name: decision.type for name, decision in session.project.layers.items()})
    return types


def _exported_node_orders(session: Session) -> list[list[str]]:
    """The node names of the project's exports, newest first, as each export recorded them: the engine was
    built from one of them, and a Myelin region names only its first and last node."""
    return [list(record.settings.get("nodes") or []) for record in reversed(session.project.exports)]


def latest_engine_report(session: Session) -> EngineReport | None:
    records = session.project.engine_reports
    return EngineReport.from_dict(records[-1].data) if records else None
