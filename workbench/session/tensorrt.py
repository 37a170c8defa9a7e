"""Closing the loop with TensorRT: fusion lint before building, the engine's report after, as session jobs.

Functions of the project and the values they need (an export to lint, the float model, the precisions
asked), returning what the :class:`~workbench.session.Session` keeps; its methods call them, apply what they
return and tell the front ends.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from workbench.project import ExportRecord, Project
from workbench.project.model import EngineReportRecord, LayerDecision, LintRecord, now_iso
from workbench.project.settings import RULES, ProjectSettings
from workbench.quant.nn import QuantAdd, QuantConcat, QuantMatMul
from workbench.session.errors import EngineNotThisModel, SessionError
from workbench.session.exports import export_digest
from workbench.session.state import state_digest

# the lint and the engine report read ONNX files: imported by the functions that use them, so that opening a
# project (the Session imports this module) does not load onnx
if TYPE_CHECKING:
    from workbench.engine import EngineReport
    from workbench.export.lint import LintFix, LintWarning

__all__ = ["lint", "latest_lint", "FixPlan", "plan_fix", "import_engine", "latest_engine_report", "REUSED",
           "PREVIEW"]


# the project layer type of a functional operation, by the ONNX op it exports to
_FUNCTIONAL_LAYER_OF_OP = {"Add": QuantAdd.__name__, "Concat": QuantConcat.__name__, "MatMul": QuantMatMul.__name__}


def lint(project: Project, *, export_path: Callable[[ExportRecord], str],
         preview: Callable[[Path], object]) -> tuple[list[LintWarning], bool]:
    """Fusion hazards of the project as it would export now, and whether a new lint was stored in the project
    (:attr:`Project.lints`; the caller tells the front ends).

    The same state is never exported twice for it: while the project is as it was at the last lint, that lint's
    warnings come back; an export of this very state (the file unchanged since; ``export_path`` says where an
    export of the history lies) is read instead of a new ``preview`` export (which writes the project as it is
    now to the path it is given, changing nothing). The project's layers, settings and calibration are
    unchanged either way.
    """
    from workbench.export.lint import LintWarning

    digest = state_digest(project)
    last = project.lints[-1] if project.lints else None
    if last is not None and last.digest == digest:
        if last.source != REUSED:
            project.lints[-1] = replace(last, source=REUSED)
        return [LintWarning.from_dict(item) for item in last.warnings], False
    exported = _export_of_state(project, digest, export_path)
    if exported is not None:
        warnings, source = _lint_file(exported), exported.name
    else:
        with tempfile.TemporaryDirectory(prefix="workbench-lint-") as folder:
            path = Path(folder) / "lint.onnx"
            preview(path)
            warnings, source = _lint_file(path), PREVIEW
    warnings = [_with_layer_targets(project.layers, warning) for warning in warnings]
    project.lints = [LintRecord(project.next_id(project.lints), now_iso(), digest,
                                [warning.to_dict() for warning in warnings], source)]
    return warnings, True


REUSED = "the last lint (the project is unchanged since)"
PREVIEW = "a preview export"


def _lint_file(path: Path) -> list[LintWarning]:
    import onnx

    from workbench.export.lint import lint_qdq_graph

    # the graph and its small tensors (scales): a big model's weights stay in their external data file
    return lint_qdq_graph(onnx.load(str(path), load_external_data=False))


def _export_of_state(project: Project, digest: str, export_path: Callable[[ExportRecord], str]) -> Path | None:
    """The project's latest export when it was written from the state ``digest`` and is still the file written."""
    if not project.exports:
        return None
    record = project.exports[-1]
    settings = record.settings or {}
    if settings.get("state_digest") != digest:
        return None
    path = Path(export_path(record))
    try:
        return path if path.is_file() and export_digest(path) == settings.get("sha256") else None
    except OSError:
        return None


def latest_lint(project: Project) -> tuple[list[LintWarning], bool, str] | None:
    """The project's last lint: (warnings, whether the project changed since, what was linted); None: never linted."""
    from workbench.export.lint import LintWarning

    if not project.lints:
        return None
    last = project.lints[-1]
    return ([LintWarning.from_dict(item) for item in last.warnings], last.digest != state_digest(project),
            last.source)


def _with_layer_targets(layers: Mapping[str, LayerDecision], warning: LintWarning) -> LintWarning:
    """``warning`` with its fix aimed at the project's layers.

    A functional operation the project leaves in float exports as a plain op of the module whose forward
    calls it (``block/Add``), so the graph names the module (``block``); the layer to quantize is that
    module's one functional layer of the op's kind (``block.add``).
    """
    fix = warning.fix
    if fix is None or fix.action not in ("quantize", "leave_float"):
        return warning
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


@dataclass
class FixPlan:
    """What applying a lint fix changes, for the session to apply.

    Attributes:
        quantize: the layers' new quantize flag (``layers``), or None for a fix of the settings.
        layers: the layers to quantize or leave in float.
        settings: settings to change (``pins`` or ``rules``), empty when nothing changes.
        changed: what a settings fix changes, as the fix reports it (``a = b`` per pin, or rule names).
    """

    quantize: bool | None = None
    layers: list[str] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)


def plan_fix(fix: LintFix, settings: ProjectSettings) -> FixPlan:
    """What a lint warning's fix changes (layers, pins or rules), given the project's ``settings``.

    Raises:
        SessionError: an unknown action, a pin of fewer than two names, or an unknown placement rule.
    """
    from workbench.export.lint import FIX_ACTIONS

    if fix.action not in FIX_ACTIONS:
        raise SessionError(f"Unknown fix {fix.action!r}; the fixes are: {', '.join(FIX_ACTIONS)}.")
    targets = list(fix.targets)
    if fix.action in ("quantize", "leave_float"):
        return FixPlan(quantize=fix.action == "quantize", layers=targets)
    if fix.action == "pin":
        if len(targets) < 2:
            raise SessionError(f"A pin shares one quantizer between at least two names, got {targets}.")
        pins = [list(pair) for pair in settings.pins]
        added = [[targets[0], other] for other in targets[1:] if [targets[0], other] not in pins]
        return FixPlan(settings={"pins": pins + added} if added else {}, changed=[f"{a} = {b}" for a, b in added])
    rules = settings.rules
    unknown = [name for name in targets if name not in RULES]
    if unknown:
        raise SessionError(f"No placement rule named {', '.join(unknown)}; the rules are: {', '.join(RULES)}.")
    changed = [name for name in targets if not getattr(rules, name)]
    stored = {**rules.to_stored(), **{name: True for name in changed}}
    return FixPlan(settings={"rules": stored} if changed else {}, changed=changed)


def import_engine(project: Project, layer_info: str | Path, profile: str | Path | None = None, *,
                  float_model: nn.Module, precisions: Mapping[str, object], onnx_file: str | Path | None = None,
                  force: bool = False) -> tuple[EngineReport, EngineReportRecord]:
    """Read trtexec's layer information (and profile) against the project's layers; the report and the record
    the project keeps of it. ``float_model``: the project's float model (its module types); ``precisions``: the
    precision each layer asks for (None for custom descriptors).

    ``onnx_file``: the ONNX file the engine was built from, to look node names up in (an engine of an ONNX
    file the workbench did not write). ``force``: report an engine in which fewer than half of the project's
    quantized layers are found (refused otherwise: it looks like another model's).

    Raises:
        SessionError: a file is not the trtexec report it should be, or the engine is not this model's
            (the message names the file and how to map it); nothing is stored then.
    """
    from workbench.engine import EngineReportError
    from workbench.engine.formats import format_hazards
    from workbench.engine.report import EngineMismatchError, import_engine_report

    layers = {name: decision.quantize for name, decision in project.layers.items()}
    try:
        report = import_engine_report(str(layer_info), str(profile) if profile is not None else None, layers,
                                      _exported_node_orders(project),
                                      module_types=_module_types(project, float_model),
                                      onnx=str(onnx_file) if onnx_file is not None else None, force=force)
    except EngineMismatchError as error:
        raise EngineNotThisModel(str(error)) from error
    except EngineReportError as error:
        raise SessionError(str(error)) from error
    asked = {name: (p.value if p is not None else "custom") for name, p in precisions.items()}
    report.hazards += format_hazards(report, asked)  # FP8 asked, another precision built: what FP8 needs
    return report, EngineReportRecord(project.next_id(project.engine_reports), now_iso(), report.to_dict())


def _module_types(project: Project, float_model: nn.Module) -> dict[str, str]:
    """Every module of the float model and every layer of the project (functional ones such as ``block.add``
    included) -> its type, so engine names map only onto what this model has."""
    types = {name: type(module).__name__ for name, module in float_model.named_modules() if name}
    types.update({name: decision.type for name, decision in project.layers.items()})
    return types


def _exported_node_orders(project: Project) -> list[list[str]]:
    """The node names of the project's exports, newest first, as each export recorded them: the engine was
    built from one of them, and a Myelin region names only its first and last node."""
    return [list(record.settings.get("nodes") or []) for record in reversed(project.exports)]


def latest_engine_report(project: Project) -> EngineReport | None:
    """The project's last engine report (None if there was none)."""
    from workbench.engine import EngineReport

    records = project.engine_reports
    return EngineReport.from_dict(records[-1].data) if records else None
