"""The ``workbench`` command line: the headless twin of the GUI, over :mod:`workbench.session`.

Exit codes: 0 success, 2 bad input or usage (one clear line on stderr), 1 internal error, 3 a fallback
search that ran but did not reach its goal. Tracebacks
only with ``--debug``. ``--json`` prints machine-readable results on stdout.

This module is the entry point (:func:`main`), the parser's skeleton and the helpers every command
shares; the commands live in modules by idea: :mod:`workbench.cli_project` (new, show, set),
:mod:`workbench.cli_jobs` (calibrate, evaluate, sensitivity, export, finetune),
:mod:`workbench.cli_engine` (lint, engine-report, diff) and :mod:`workbench.cli_trust` (trust, untrust).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench import __version__

logger = logging.getLogger("workbench")

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2
EXIT_NOT_REACHED = 3  # a search ran and was saved, but did not reach its goal (sensitivity --target/--tolerance)
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, as shells and CI expect


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


# ----- helpers -----------------------------------------------------------------------------------


class _Progress:
    """A tqdm bar for one job (silent with --json or when stderr is not a terminal) and Ctrl-C as cancel."""

    def __init__(self, args: argparse.Namespace, description: str, shown: bool = True) -> None:
        self.cancel = threading.Event()
        self.bar = None
        self.description = description
        self.enabled = shown and not args.json and sys.stderr.isatty()
        self._previous_handler = None

    def __enter__(self) -> _Progress:
        from workbench.launcher import in_launched_worker

        # in a --workers process Ctrl-C belongs to the launcher (it stops every worker and says so once)
        if threading.current_thread() is threading.main_thread() and not in_launched_worker():
            self._previous_handler = signal.signal(signal.SIGINT, self._interrupt)
        return self

    def _interrupt(self, signum, frame) -> None:
        if self.cancel.is_set():
            raise KeyboardInterrupt
        self.cancel.set()
        if sys.stderr.isatty():  # feedback while the step ends; the result is the one line a script reads
            print("\nworkbench: cancelling after the current step (Ctrl-C again to abort)", file=sys.stderr)

    def __call__(self, done: int, total: int, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total or None, desc=self.description, unit="step", leave=False)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(message[-40:])

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)


def _open(args: argparse.Namespace):
    from workbench.session import Session
    from workbench.sources.errors import TrustRequired

    try:
        return Session.open(args.project, trust_code=args.trust_code, remembered=not args.no_trust)
    except TrustRequired as error:
        raise TrustRequired(f"{error} To trust it once and for later commands: workbench trust {args.project} "
                            f"(or --trust-code); 'workbench show {args.project}' says what it runs.") from None


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    # with --json, stdout is the JSON alone: user code printed to stderr meanwhile (see main)
    out = getattr(args, "stdout", None) or sys.stdout
    if getattr(args, "json", False):
        from workbench.strict_json import dumps

        print(dumps(data, indent=2), file=out)  # strict: NaN/Inf as text, never a bare NaN
    else:
        print(text, file=out)


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.4g}{unit}"


def _data_spec(text: str, args: argparse.Namespace, batch_size: int):
    """The data spec ``--data``-like options describe (see :func:`workbench.cli_project._data_spec`)."""
    from workbench.cli_project import _data_spec as data_spec  # the project commands' own; imported late: no cycle

    return data_spec(text, args, batch_size)


# ----- commands ----------------------------------------------------------------------------------


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    from workbench.quant import backend_name

    print(f"Quant Workbench {__version__} (torch {torch.__version__}, CPU fake-quant kernel: {backend_name()})")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.demo_run import run_demo

    with _Progress(args, "demo") as progress:
        report = run_demo(Path(args.out), calib_batches=args.calib_batches, method=args.method, progress=progress,
                          cancel=progress.cancel)
    _emit(args, report, report["text"])
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


def build_parser() -> argparse.ArgumentParser:
    """The ``workbench`` parser; each group of commands adds its own (``cli_project``, ``cli_jobs``,
    ``cli_engine``, ``cli_trust``), in the order ``--help`` lists them."""
    from workbench.cli_engine import add_commands as add_engine_commands  # lint, engine-report, diff
    from workbench.cli_jobs import add_commands as add_job_commands  # calibrate ... finetune
    from workbench.cli_project import add_commands as add_project_commands  # new, show, set
    from workbench.cli_trust import add_commands as add_trust_commands  # trust, untrust
    from workbench.quant.calib.methods import AMAX_METHODS
    from workbench.sources.demo import DEMO_CALIB_BATCHES, DEMO_METHOD

    parser = argparse.ArgumentParser(prog="workbench", description="Quant Workbench: INT8 quantization of "
                                     "PyTorch models for TensorRT.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def project_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("project", help="the project file (.qwb)")
        command.add_argument("--trust-code", action="store_true",
                             help="allow running the project's model/data/metric code (entry points, pickles), "
                                  "and remember it for this project until that code changes")
        command.add_argument("--no-trust", action="store_true",
                             help="ignore the trust remembered for this project (its code does not run)")
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        return command

    version = sub.add_parser("version", help="print versions")
    version.set_defaults(func=_cmd_version)

    add_project_commands(sub, project_command)
    add_job_commands(sub, project_command)
    add_engine_commands(sub, project_command)
    add_trust_commands(sub)

    demo = sub.add_parser("demo", help="the whole job on the built-in digits CNN, without a screen")
    demo.add_argument("--out", default="workbench-demo", help="folder for the project and ONNX (default: "
                                                              "./workbench-demo)")
    demo.add_argument("--method", choices=AMAX_METHODS, default=DEMO_METHOD)
    demo.add_argument("--calib-batches", type=int, default=DEMO_CALIB_BATCHES)
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(func=_cmd_demo)

    gui = sub.add_parser("gui", help="open the desktop app")
    gui.add_argument("project", nargs="?", help="a project to open")
    gui.add_argument("--demo", action="store_true", help="open the demo project, ready to calibrate")
    gui.add_argument("--trust-code", action="store_true")
    gui.set_defaults(func=_cmd_gui)
    return parser


def _launch_workers(args: argparse.Namespace, argv: list[str]) -> int:
    """``--workers N``: the same command in N processes; rank 0 prints the result and writes the project."""
    from workbench.launcher import JobInterrupted, WorkerFailed, launch

    if args.workers < 1:
        print(f"workbench: error: --workers must be at least 1, got {args.workers}.", file=sys.stderr)
        return EXIT_USAGE
    try:
        return launch(_worker_main, (argv,), nprocs=args.workers)
    except JobInterrupted as error:  # Ctrl-C: one line and 130, not the agent's traceback
        print(f"workbench: {error}; the project was not changed.", file=sys.stderr)
        return 128 + error.signum
    except WorkerFailed as error:
        print(f"workbench: error: {error} The project was not changed.", file=sys.stderr)
        return EXIT_INTERNAL


def _worker_main(argv: list[str]) -> int:
    """One process of ``--workers N``: the command as usual, but a failure is raised, so that the launcher
    stops the other workers and reports this rank's error."""
    from workbench.launcher import WorkerError

    args = build_parser().parse_args(argv)
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
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed the usage line
        return EXIT_USAGE if exit_.code else EXIT_OK
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s")
    from workbench.quant.distributed import launched_by_torchrun

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


def _run(args: argparse.Namespace) -> tuple[int, str | None]:
    """Run the command; its exit code and, on failure, the one line to show (tracebacks only with --debug)."""
    from workbench.project import ProjectError
    from workbench.session import SessionError
    from workbench.sources.errors import SourceError

    user_errors: tuple[type[BaseException], ...] = (UsageError, ProjectError, SessionError, SourceError,
                                                    ValueError, TypeError, FileNotFoundError)
    try:
        from workbench.analysis import AnalysisCancelled, AnalysisError, MetricError
        from workbench.export import ExportError
        from workbench.quant.calibrate import CalibrationCancelled, CalibrationError
        from workbench.training import FinetuneError

        user_errors += (ExportError, AnalysisError, MetricError, CalibrationError, FinetuneError)
        cancelled: tuple[type[BaseException], ...] = (CalibrationCancelled, AnalysisCancelled)
    except ImportError:  # pragma: no cover - optional parts missing
        cancelled = ()
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
    except cancelled as error:  # on the command line only Ctrl-C cancels
        return EXIT_INTERRUPTED, f"cancelled: {error}"
    except user_errors as error:
        if args.debug:
            raise
        return EXIT_USAGE, f"error: {error}"
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED, "interrupted"
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK, None
    except Exception as error:  # noqa: BLE001 - last resort: one line, not a traceback
        if args.debug:
            raise
        return EXIT_INTERNAL, f"internal error: {type(error).__name__}: {error} (run with --debug for details)"

if __name__ == "__main__":
    sys.exit(main())
