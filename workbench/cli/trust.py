"""The CLI's trust commands: ``trust`` and ``untrust``, and what ``show`` prints for a project whose code is
not trusted (what it would run and why, running none of it).

Trust itself is remembered by :mod:`workbench.sources.trust`; the session applies it when it opens a
project. Listed in :data:`COMMANDS` for :func:`workbench.cli.build_parser`.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from workbench.cli.common import EXIT_OK, Command, emit, shown_name

__all__ = ["COMMANDS", "untrusted_summary"]


def untrusted_summary(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``workbench show`` on a project whose code is not trusted: what it would run and why, running none of it."""
    from workbench.project import load_project
    from workbench.session import Session
    from workbench.session.exports import suspicious_exports

    project = load_project(args.project)
    references = Session.code_references(args.project)
    status = "changed" if Session.trust_status(args.project) == "changed" else "untrusted"
    data = {"name": project.name, "path": str(Path(args.project).resolve()), "trusted": False, "trust": status,
            "model": project.model.label, "data": {role: spec.label for role, spec in project.data.items()},
            "layers": len(project.layers), "calibrations": len(project.calibrations),
            "code": [reference.to_dict() for reference in references]}
    why = ("its code changed since it was trusted" if status == "changed"
           else "it runs code that is not trusted on this machine yet")
    lines = [f"{shown_name(project.name)} ({data['path']})", f"  model: {project.model.label} (not loaded: {why})",
             "  data: " + ", ".join(f"{k} {v}" for k, v in data["data"].items()),
             f"  layers: {len(project.layers)}, calibration runs: {len(project.calibrations)}",
             "  code it would run (each needs your trust):"]
    for reference in references:
        files = ", ".join(reference.files) or "no file found next to the project"
        lines.append(f"    {reference.role}: {reference.spec}: {reference.why} ({files})")
        lines += [f"      not covered: {note}" for note in reference.not_covered]
    data["suspicious_exports"] = suspicious_exports(project, Path(args.project), Path(args.project).parent)
    lines += [f"  warning: suspicious export history: {note} (an export never overwrites it without --force)"
              for note in data["suspicious_exports"]]
    lines.append(f"  read that code; to trust it: workbench trust {args.project} (remembered until the code changes)")
    return data, "\n".join(lines)


def _cmd_trust(args: argparse.Namespace) -> int:
    from workbench.session import Session
    from workbench.sources.trust import remember_trust

    references = Session.code_references(args.project)  # reads the file, runs nothing
    if not references:
        emit(args, {"trusted": True, "code": []}, f"{args.project} runs no code of its own: nothing to trust.")
        return EXIT_OK
    store = remember_trust(args.project, references)
    lines = [f"trusted {args.project}: later commands and the GUI run its code without --trust-code, until it "
             f"changes (recorded in {store}):"]
    for r in references:
        lines.append(f"  {r.role}: {r.spec} ({', '.join(r.files) or 'no file found'})")
        lines += [f"    not covered (a change there is not noticed): {note}" for note in r.not_covered]
    lines.append("  (installed packages are not covered: only the files listed)")
    emit(args, {"trusted": True, "store": str(store), "code": [r.to_dict() for r in references]}, "\n".join(lines))
    return EXIT_OK


def _cmd_untrust(args: argparse.Namespace) -> int:
    from workbench.sources.trust import forget_trust

    forgotten = forget_trust(args.project)
    emit(args, {"forgotten": forgotten}, f"{args.project}: trust forgotten; its code runs again only with "
                                          "--trust-code or 'workbench trust'" if forgotten
          else f"{args.project}: no trust was recorded for it")
    return EXIT_OK


def _trust_options(trust: argparse.ArgumentParser) -> None:
    trust.add_argument("project", help="the project file (.qwb)")
    trust.add_argument("--json", action="store_true", help="print the result as JSON")
    trust.set_defaults(func=_cmd_trust)


def _untrust_options(untrust: argparse.ArgumentParser) -> None:
    untrust.add_argument("project", help="the project file (.qwb)")
    untrust.add_argument("--json", action="store_true", help="print the result as JSON")
    untrust.set_defaults(func=_cmd_untrust)


COMMANDS: tuple[Command, ...] = (
    Command("trust", "trust a project's code (model, data, metric, loss) from now on, until it changes; "
                     "'workbench show' lists it first", _trust_options, on_project=False),
    Command("untrust", "forget the trust given to a project's code", _untrust_options, on_project=False),
)
