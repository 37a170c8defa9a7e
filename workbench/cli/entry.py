"""The ``workbench`` command line: the headless twin of the GUI, over :mod:`workbench.session`.

Exit codes: 0 success, 2 bad input or usage (one clear line on stderr), 1 internal error, 3 a fallback
search that ran but did not reach its goal. Tracebacks
only with ``--debug``. ``--json`` prints machine-readable results on stdout.

This module is the entry point (:func:`main`), the parser's skeleton and the commands about the program
itself (version, demo, gui); the helpers every command shares are in :mod:`workbench.cli.common`, the
commands in modules by idea: :mod:`workbench.cli.project` (new, show, set), :mod:`workbench.cli.jobs`
(calibrate, evaluate, sensitivity, export, finetune), :mod:`workbench.cli.engine` (lint, engine-report, diff)
and :mod:`workbench.cli.trust` (trust, untrust). Each command's options are added only when it is chosen
(see :class:`_Commands`), and each handler imports what it runs: ``workbench --help`` loads neither torch
nor the session.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench import __version__
from workbench.cli import engine, jobs, project, trust
from workbench.cli.common import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Command,
    Progress,
    UsageError,
    emit,
)

logger = logging.getLogger("workbench")


# ----- commands ----------------------------------------------------------------------------------


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    from workbench.quant import backend_name

    print(f"Quant Workbench {__version__} (torch {torch.__version__}, CPU fake-quant kernel: {backend_name()})")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.demo_run import run_demo

    with Progress(args, "demo") as progress:
        report = run_demo(Path(args.out), calib_batches=args.calib_batches, method=args.method, progress=progress,
                          cancel=progress.cancel)
    emit(args, report, report["text"])
    return EXIT_OK


def _no_display_message(project: str | None) -> str | None:
    """Why a window cannot open here and how to get one; None when it can (or when that cannot be told)."""
    import os

    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    command = "workbench gui" + (f" {project}" if project else "")
    return (f"no display to open a window on (neither DISPLAY nor WAYLAND_DISPLAY is set). Run it on a desktop, "
            f"under a virtual display ('xvfb-run -a {command}'), or with QT_QPA_PLATFORM=offscreen for a window "
            "nobody sees (screenshots, tests); the same work runs headless with the other commands.")


def _cmd_gui(args: argparse.Namespace) -> int:
    no_display = _no_display_message(args.project)
    if no_display:  # checked first: Qt itself aborts the process (exit 134) with a text about plugins
        raise UsageError(no_display)
    try:
        from workbench.app.main import run_gui
    except ImportError as error:
        raise UsageError(f"the desktop app is not available: {error}. Install the GUI extras "
                         "(pip install 'quant-workbench[gui]').") from None
    return run_gui(project=args.project, demo=args.demo, trust_code=args.trust_code)


def _demo_options(demo: argparse.ArgumentParser) -> None:
    from workbench.quant.calib.methods import AMAX_METHODS  # the registry; drags torch in (quant's face)
    from workbench.sources.demo import DEMO_CALIB_BATCHES, DEMO_METHOD

    demo.add_argument("--out", default="workbench-demo", help="folder for the project and ONNX (default: "
                                                              "./workbench-demo)")
    demo.add_argument("--method", choices=AMAX_METHODS, default=DEMO_METHOD)
    demo.add_argument("--calib-batches", type=int, default=DEMO_CALIB_BATCHES)
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(func=_cmd_demo)


def _gui_options(gui: argparse.ArgumentParser) -> None:
    gui.add_argument("project", nargs="?", help="a project to open")
    gui.add_argument("--demo", action="store_true", help="open the demo project, ready to calibrate")
    gui.add_argument("--trust-code", action="store_true")
    gui.set_defaults(func=_cmd_gui)


def _version_options(version: argparse.ArgumentParser) -> None:
    version.set_defaults(func=_cmd_version)


# every command, in the order ``--help`` lists them
COMMANDS: tuple[Command, ...] = (
    Command("version", "print versions", _version_options, on_project=False),
    *project.COMMANDS,  # new, show, set
    *jobs.COMMANDS,  # calibrate ... finetune
    *engine.COMMANDS,  # lint, engine-report, diff
    *trust.COMMANDS,  # trust, untrust
    Command("demo", "the whole job on the built-in digits CNN, without a screen", _demo_options, on_project=False),
    Command("gui", "open the desktop app", _gui_options, on_project=False),
)


def _project_options(command: argparse.ArgumentParser) -> None:
    """What every command on a project file takes: the file, the trust options and ``--json``."""
    command.add_argument("project", help="the project file (.qwb)")
    command.add_argument("--trust-code", action="store_true",
                         help="allow running the project's model/data/metric code (entry points, pickles), "
                              "and remember it for this project until that code changes")
    command.add_argument("--no-trust", action="store_true",
                         help="ignore the trust remembered for this project (its code does not run)")
    command.add_argument("--json", action="store_true", help="print the result as JSON")


class _Commands(argparse._SubParsersAction):
    """The sub-commands, each parser left bare until argparse picks it: only then are its options added (and
    the registries their choices and help texts come from imported). ``workbench --help`` lists names and
    help texts only, so it loads none of them; ``workbench calibrate --help`` loads calibrate's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bare: dict[str, Command] = {}

    def add_command(self, command: Command) -> None:
        self.add_parser(command.name, help=command.help)
        self.bare[command.name] = command

    def complete(self, name: str) -> None:
        """Give command ``name`` its options, once."""
        command = self.bare.pop(name, None)
        if command is None:
            return
        parser = self.choices[name]
        if command.on_project:
            _project_options(parser)
        command.add_options(parser)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Sequence[str],
                 option_string: str | None = None) -> None:
        if values and values[0] in self.choices:
            self.complete(values[0])
        super().__call__(parser, namespace, values, option_string)


def build_parser(complete: bool = True) -> argparse.ArgumentParser:
    """The ``workbench`` parser, its commands in the order ``--help`` lists them. ``complete=False`` leaves
    each command's options to be added when the command is parsed (what :func:`main` does: a fast start);
    the default adds them all now, for code that inspects the parser."""
    parser = argparse.ArgumentParser(prog="workbench", description="Quant Workbench: INT8 quantization of "
                                     "PyTorch models for TensorRT.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", action=_Commands)
    sub.required = True
    for command in COMMANDS:
        sub.add_command(command)
    if complete:
        for command in COMMANDS:
            sub.complete(command.name)
    return parser


def _launch_workers(args: argparse.Namespace, argv: list[str]) -> int:
    """``--workers N``: the same command in N processes; rank 0 prints the result and writes the project."""
    from workbench.launcher import JobInterrupted, WorkerFailed, launch

    if args.workers < 1:
        print(f"workbench: error: --workers must be at least 1, got {args.workers}.", file=sys.stderr)
        return EXIT_USAGE
    from workbench.project.store import file_revision

    project = getattr(args, "project", None)
    before = file_revision(project) if project else None
    try:
        return launch(_worker_main, (argv,), nprocs=args.workers)
    except JobInterrupted as error:  # Ctrl-C: one line and 130, not the agent's traceback
        print(f"workbench: {error}; {_project_outcome(project, before)}", file=sys.stderr)
        return 128 + error.signum
    except WorkerFailed as error:
        print(f"workbench: error: {error} {_project_outcome(project, before).capitalize()}", file=sys.stderr)
        return EXIT_INTERNAL


def _project_outcome(project: str | None, before: int | None) -> str:
    """What a stopped job did to the project file: rank 0 may have saved its result before the stop (Ctrl-C
    after the save), and then saying "not changed" would be a lie."""
    from workbench.project.store import file_revision

    if project is None or file_revision(project) == before:
        return "the project was not changed."
    return (f"the job had finished: its result was saved to {project} (revision {file_revision(project)}) "
            "before the stop, and stands.")


def _worker_main(argv: list[str]) -> int:
    """One process of ``--workers N``: the command as usual, but a failure is raised, so that the launcher
    stops the other workers and reports this rank's error."""
    from workbench.launcher import WorkerError

    args = build_parser(complete=False).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s")
    code, message = _run(args)
    if code == EXIT_INTERRUPTED:  # the launcher reports the interrupt once, for the whole job
        raise SystemExit(code)
    if code != EXIT_OK:
        raise WorkerError((message or f"exit code {code}").removeprefix("error: "))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """The ``workbench`` command: its exit code (0 success, 1 internal error, 2 bad input, 3 a search that
    did not reach its goal, 130 interrupted by Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handling (while starting, say): one line
        print("workbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(complete=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed the usage line
        return EXIT_USAGE if exit_.code else EXIT_OK
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s")
    from workbench.quant.algorithms.distributed import launched_by_torchrun

    if launched_by_torchrun() and not getattr(args, "distributed", False):
        # every rank would run it and write the same files
        print(f"workbench: error: only calibrate and sensitivity run in several processes; run {args.command} "
              "without torchrun.", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "workers", None) not in (None, 1) and not launched_by_torchrun():
        return _launch_workers(args, [str(a) for a in argv])
    code, message = _run(args)
    if message:
        rank = f"rank {os.environ.get('RANK')}: " if launched_by_torchrun() else ""
        print(f"workbench: {rank}{message}", file=sys.stderr)
    return code


def _error_kinds() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """The errors that mean "cancelled" (exit 130) and those that are the user's (one line, exit 2).

    Asked once a command failed, and only of the parts already loaded: an error class whose package was never
    imported cannot be what was raised, and importing the exporter or the trainer here would undo the lazy
    start of the commands that do not use them."""
    loaded = sys.modules
    user_errors: list[type[BaseException]] = [UsageError, ValueError, TypeError, FileNotFoundError]
    cancelled: list[type[BaseException]] = []
    with contextlib.suppress(ImportError):  # pragma: no cover - a part that failed to load raised nothing
        if "workbench.project" in loaded:
            from workbench.project import ProjectError

            user_errors.append(ProjectError)
        if "workbench.session" in loaded:
            from workbench.session import SessionError

            user_errors.append(SessionError)
        if "workbench.sources" in loaded:
            from workbench.sources.errors import SourceError

            user_errors.append(SourceError)
        if "workbench.export" in loaded:
            from workbench.export import ExportError

            user_errors.append(ExportError)
        if "workbench.analysis" in loaded:
            from workbench.analysis import AnalysisCancelled, AnalysisError, MetricError

            user_errors += [AnalysisError, MetricError]
            cancelled.append(AnalysisCancelled)
        if "workbench.quant.algorithms.calibrate" in loaded:
            from workbench.quant.algorithms.calibrate import CalibrationCancelled, CalibrationError

            user_errors.append(CalibrationError)
            cancelled.append(CalibrationCancelled)
        # a rank that hung or died: the job's fault, not a bug here
        if "workbench.quant.algorithms.distributed" in loaded:
            from workbench.quant.algorithms.distributed import DistributedError

            user_errors.append(DistributedError)
        if "workbench.training" in loaded:
            from workbench.training import FinetuneError

            user_errors.append(FinetuneError)
    return tuple(cancelled), tuple(user_errors)


def _run(args: argparse.Namespace) -> tuple[int, str | None]:
    """Run the command; its exit code and, on failure, the one line to show (tracebacks only with --debug)."""
    try:
        if not getattr(args, "json", False):
            return args.func(args), None
        args.stdout = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):  # a print in the user's model must not corrupt the JSON
            return args.func(args), None
    except SystemExit as exit_:  # user code (a model class, a metric) that ended the program: not a success
        if args.debug:
            raise
        return EXIT_USAGE, (f"error: user code called sys.exit({exit_.code!r}) during '{args.command}'; nothing "
                            "was saved.")
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED, "interrupted"
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK, None
    except Exception as error:  # noqa: BLE001 - sorted below; the last resort is one line, not a traceback
        cancelled, user_errors = _error_kinds()
        if isinstance(error, cancelled):  # on the command line only Ctrl-C cancels
            return EXIT_INTERRUPTED, f"cancelled: {error}"
        if args.debug:
            raise
        if isinstance(error, user_errors):
            return EXIT_USAGE, f"error: {error}"
        return EXIT_INTERNAL, f"internal error: {type(error).__name__}: {error} (run with --debug for details)"


if __name__ == "__main__":
    sys.exit(main())
