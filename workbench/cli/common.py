"""What every ``workbench`` command shares: exit codes, the usage error, printing a result (``--json``),
number formatting, opening the project, the progress bar with Ctrl-C as cancel, and reading the data and
entry-point options as typed on the command line.

Kept light on purpose (the standard library at import time): every command module imports it, and
``workbench --help`` must not pay for torch or the session. What a helper needs is imported inside it.
"""
from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_NOT_REACHED", "EXIT_NOT_VALIDATED", "EXIT_OK", "EXIT_USAGE",
           "Command", "Progress", "UsageError", "data_spec", "emit", "fmt", "open_project", "typed_entrypoint",
           "shown_name", "MAX_SHOWN_NAME"]

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2
EXIT_NOT_REACHED = 3  # a search ran and was saved, but did not reach its goal (sensitivity --target/--tolerance)
EXIT_NOT_VALIDATED = 4  # export: the file was written, but onnxruntime and the model disagree (see its diagnosis)
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, as shells and CI expect


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


@dataclass(frozen=True)
class Command:
    """One ``workbench`` sub-command as its group module declares it. ``add_options`` adds its options (and its
    handler, as ``func``) to its parser; it runs only when the command is chosen or a complete parser is asked
    for, so the registries its choices come from are imported then, not for ``workbench --help``."""

    name: str
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]
    on_project: bool = True  # takes a project file, with --trust-code, --no-trust and --json


class Progress:
    """A tqdm bar for one job (silent with --json or when stderr is not a terminal) and Ctrl-C as cancel."""

    def __init__(self, args: argparse.Namespace, description: str, shown: bool = True) -> None:
        self.cancel = threading.Event()
        self.bar = None
        self.description = description
        self.enabled = shown and not args.json and sys.stderr.isatty()
        self._previous_handler = None

    def __enter__(self) -> Progress:
        from workbench.launcher import in_launched_worker

        # in a --workers process Ctrl-C belongs to the launcher (it stops every worker and says so once); a process
        # started with SIGINT ignored (a background job of a script, nohup) keeps ignoring it, as its parent asked
        if threading.current_thread() is threading.main_thread() and not in_launched_worker() \
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
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


def open_project(args: argparse.Namespace) -> Any:
    """The :class:`~workbench.session.Session` on ``args.project``, with the trust the options give; an
    untrusted project's error says how to trust it."""
    from workbench.session import Session
    from workbench.sources.errors import TrustRequired

    try:
        return Session.open(args.project, trust_code=args.trust_code, remembered=not args.no_trust)
    except TrustRequired as error:
        raise TrustRequired(f"{error} To trust it once and for later commands: workbench trust {args.project} "
                            f"(or --trust-code); 'workbench show {args.project}' says what it runs.") from None


def emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    """Print a command's result: ``data`` as strict JSON with ``--json``, else ``text``."""
    # with --json, stdout is the JSON alone: user code printed to stderr meanwhile (see workbench.cli.entry)
    out = getattr(args, "stdout", None) or sys.stdout
    if getattr(args, "json", False):
        from workbench.strict_json import dumps

        print(dumps(data, indent=2), file=out)  # strict: NaN/Inf as text, never a bare NaN
    else:
        print(text, file=out)


MAX_SHOWN_NAME = 200  # characters of a project's name a table prints (a crafted file may hold 200 MB of it)


def shown_name(name: str) -> str:
    """``name`` as ``show`` prints it: whole up to :data:`MAX_SHOWN_NAME` characters, else cut with its length."""
    if len(name) <= MAX_SHOWN_NAME:
        return name
    return f"{name[:MAX_SHOWN_NAME]}... ({len(name):,} characters)"


def fmt(value: float | None, unit: str = "") -> str:
    """A number as the tables print it: 4 significant digits, ``-`` for none (or not a number), ``inf`` for
    infinity: a table never shows ``nan``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.4g}{unit}"


def data_spec(text: str, args: argparse.Namespace, batch_size: int) -> Any:
    """The :class:`~workbench.sources.data_source.DataSpec` that a ``--data``-like option and the image
    options beside it (``--resize``, ``--crop``, ``--mean``, ``--std``, ``--grayscale``) describe."""
    from workbench.session.new_project import image_options
    from workbench.sources.data_source import DataSpec

    spec = DataSpec.parse(text, batch_size=batch_size, num_batches=args.num_batches, shuffle=args.shuffle,
                          seed=args.seed)
    given = [f"--{name}" for name in ("resize", "crop", "mean", "std") if getattr(args, name) is not None]
    given += ["--grayscale"] if args.grayscale else []
    if given and spec.kind != "images":  # said, not silently dropped: tensors are used as they are
        print(f"workbench: note: {', '.join(given)} apply to folders of images; {text} is {spec.kind} data, used "
              "as it is: ignored", file=sys.stderr)
    elif given:
        spec.image = image_options(resize=args.resize, crop=args.crop, mean=args.mean, std=args.std,
                                   grayscale=args.grayscale)
    return spec


def typed_entrypoint(spec: str | None, session: Any) -> str | None:
    """A ``file.py:function`` typed on the command line names a file relative to where it was typed; the
    project keeps it relative to its own folder (which may be elsewhere)."""
    from workbench.sources.paths import absolute_entrypoint, relative_entrypoint

    return None if spec is None else relative_entrypoint(absolute_entrypoint(spec, Path.cwd()), session.base_dir)
