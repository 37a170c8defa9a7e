"""The ``workbench`` command line.

Exit codes: 0 success, 2 bad input or usage (one clear line on stderr), 1 internal error. Tracebacks
only with ``--debug``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from workbench import __version__

logger = logging.getLogger("workbench")

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    from workbench.quant import backend_name

    print(f"Quant Workbench {__version__} (torch {torch.__version__}, CPU fake-quant kernel: {backend_name()})")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.core_demo import run_core_demo

    report = run_core_demo(methods=args.method, calib_batches=args.calib_batches, batch_size=args.batch_size,
                           show_progress=not args.json and sys.stderr.isatty())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(report["text"])
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="Quant Workbench: INT8 quantization of "
                                     "PyTorch models for TensorRT.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    version = sub.add_parser("version", help="print versions")
    version.set_defaults(func=_cmd_version)

    demo = sub.add_parser("demo", help="quantize the built-in digits CNN and compare FP32 with INT8")
    demo.add_argument("--method", choices=["max", "entropy", "mse", "percentile", "all"], default="all",
                      help="amax method for activations (weights use per-channel max); default: all")
    demo.add_argument("--calib-batches", type=int, default=8, help="calibration batches (default 8)")
    demo.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed the usage line
        return EXIT_USAGE if exit_.code else EXIT_OK
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except UsageError as error:
        print(f"workbench: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, TypeError, FileNotFoundError) as error:
        if args.debug:
            raise
        print(f"workbench: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("workbench: interrupted", file=sys.stderr)
        return EXIT_INTERNAL
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:  # noqa: BLE001 - last resort: one line, not a traceback
        if args.debug:
            raise
        print(f"workbench: internal error: {type(error).__name__}: {error} (run with --debug for details)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
