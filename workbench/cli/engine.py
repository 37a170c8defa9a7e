"""The CLI commands that close the loop with TensorRT: ``lint``, ``engine-report`` and ``diff``.

Listed in :data:`COMMANDS` for :func:`workbench.cli.build_parser`; they use the helpers of
:mod:`workbench.cli.common`, so errors, ``--json`` and exit codes behave as for every other command.
"""
from __future__ import annotations

import argparse

from workbench.cli.common import EXIT_OK, Command, UsageError, emit, open_project

__all__ = ["COMMANDS"]


def _cmd_lint(args: argparse.Namespace) -> int:
    from workbench.export.lint import LINT_KINDS, count_text

    session = open_project(args)
    warnings = session.lint()
    reused = session.latest_lint()
    applied: list[dict] = []
    if args.apply:
        wanted = range(1, len(warnings) + 1) if "all" in args.apply else _numbers(args.apply, len(warnings))
        for number in wanted:
            fix = warnings[number - 1].fix
            if fix is None:
                raise UsageError(f"warning {number} has no fix to apply.")
            applied.append({"warning": number, "fix": fix.to_dict(), "changed": session.apply_fix(fix)})
    if session.dirty:  # fixes applied, or a new lint the project keeps (the next lint of this state reuses it)
        session.save()
    lines = [count_text(warnings) if warnings else "No fusion warnings: the Q/DQ placement suits TensorRT."]
    for number, warning in enumerate(warnings, start=1):
        lines.append(f"  {number}. [{warning.severity}] {warning.kind} ({', '.join(warning.modules)}): "
                     f"{warning.message}")
        if warning.fix is not None:
            lines.append(f"     fix: {warning.fix.description} (--apply {number})")
    for entry in applied:
        changed = ", ".join(entry["changed"]) or "nothing (already so)"
        lines.append(f"applied {entry['warning']}: {entry['fix']['description']}; changed: {changed}")
    if applied:
        lines.append("Re-export (workbench export) for the fixes to reach the ONNX file.")
    if reused is not None and reused[2] and not applied:
        lines.append(f"(linted: {reused[2]})")
    data = {"warnings": [w.to_dict() for w in warnings], "kinds": LINT_KINDS, "applied": applied,
            "linted": reused[2] if reused is not None else ""}
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def _numbers(values: list[str], count: int) -> list[int]:
    numbers = []
    for value in values:
        try:
            number = int(value)
        except ValueError:
            raise UsageError(f"--apply takes warning numbers (1 to {count}) or 'all', got {value!r}.") from None
        if not 1 <= number <= count:
            raise UsageError(f"--apply {number}: there are {count} warnings" + (" (none to fix)." if not count else
                                                                                  f", numbered 1 to {count}."))
        numbers.append(number)
    return list(dict.fromkeys(numbers))


def _cmd_engine_report(args: argparse.Namespace) -> int:
    session = open_project(args)
    report = session.import_engine_report(args.layer_info, args.profile, remember=not args.no_save,
                                          onnx_file=args.onnx, force=args.force)
    if not args.no_save:
        session.save()
    emit(args, report.to_dict(), report.text())
    return EXIT_OK


def _cmd_diff(args: argparse.Namespace) -> int:
    from workbench.project import load_project
    from workbench.project.diff import diff_projects

    diff = diff_projects(load_project(args.a), load_project(args.b), name_a=args.a, name_b=args.b)
    emit(args, diff.to_dict(), diff.text())
    return EXIT_OK


def _lint_options(lint: argparse.ArgumentParser) -> None:
    lint.add_argument("--apply", action="append", metavar="N",
                      help="apply warning N's fix to the project (repeatable, or 'all')")
    lint.set_defaults(func=_cmd_lint)


def _engine_report_options(engine: argparse.ArgumentParser) -> None:
    engine.add_argument("layer_info", help="trtexec --exportLayerInfo=FILE output (best with "
                                           "--profilingVerbosity=detailed)")
    engine.add_argument("--profile", help="trtexec --exportProfile=FILE output: per-layer times")
    engine.add_argument("--onnx", metavar="FILE",
                        help="the ONNX file the engine was built from: its node names are looked up there (for an "
                             "ONNX file the workbench did not write, e.g. one with scope-less names such as Conv_9)")
    engine.add_argument("--force", action="store_true",
                        help="report an engine in which fewer than half of the project's quantized layers are found "
                             "(refused otherwise: it looks like another model's)")
    engine.add_argument("--no-save", action="store_true", help="show the report without keeping it in the project")
    engine.set_defaults(func=_cmd_engine_report)


def _diff_options(diff: argparse.ArgumentParser) -> None:
    diff.add_argument("a", help="the earlier project (.qwb)")
    diff.add_argument("b", help="the later project (.qwb)")
    diff.add_argument("--json", action="store_true", help="print the result as JSON")
    diff.set_defaults(func=_cmd_diff)


COMMANDS: tuple[Command, ...] = (
    Command("lint", "predict where TensorRT will not fuse the Q/DQ placement, with fixes", _lint_options),
    Command("engine-report", "map a TensorRT engine's layers and profile back to the model", _engine_report_options),
    Command("diff", "what changed between two projects", _diff_options, on_project=False),
)
