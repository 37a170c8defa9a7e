"""Numbers, sizes, durations and shapes as the GUI shows them: one spelling in every tab.

Plain functions (no Qt), so that they are tested without a window.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from workbench.plurals import count_text  # the one plural rule: the core's messages read it too

__all__ = ["count_text", "format_number", "format_delta", "format_size", "format_seconds", "job_count_text",
           "job_times_text", "WIDEST_JOB_TIMES", "format_shape", "elide_name"]


def format_number(value: Any, digits: int = 4, *, spec: str | None = None, missing: str = "n/a") -> str:
    """A metric, amax or loss as people read it: ``digits`` significant digits (or a format ``spec``
    such as ``".6f"``), ``∞`` rather than ``inf``, and ``missing`` for None, NaN or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return missing
    if math.isnan(number):
        return missing
    if math.isinf(number):
        return "∞" if number > 0 else "−∞"
    return format(number, spec or f".{digits}g")


def format_delta(value: float | None, digits: int = 3) -> str:
    """A difference with its sign (``+0.564``, ``−1.2``), so gains and losses read at a glance."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return format_number(value)
    if value == 0:
        return "0"
    text = f"{abs(value):.{digits}g}"
    return ("+" if value > 0 else "−") + text


def format_size(size: float | None) -> str:
    """Bytes as people read them (``47.8 KiB``)."""
    if size is None:
        return "n/a"
    size = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def format_seconds(seconds: float) -> str:
    """A job's elapsed time or ETA: ``4.2 s``, ``42 s``, ``3 min 07 s``, ``1 h 05 min``."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f} s"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def job_count_text(done: int, total: int) -> str:
    """A job's count as every progress display shows it: ``7/26``; empty for one step or an unknown count
    (a moving busy bar then, never a ``0/1`` that looks stuck)."""
    return f"{done}/{total}" if total > 1 else ""


def job_times_text(elapsed_s: float, eta_at_report_s: float | None, since_report_s: float) -> str:
    """A job's clock as every progress display shows it: ``12 s elapsed · ETA 30 s``.

    ``eta_at_report_s`` is the ETA of the last progress report (None: not known yet), ``since_report_s`` the
    time since that report: the ETA counts down between reports as the elapsed time counts up, so two
    displays of the same job read the same numbers.
    """
    text = f"{format_seconds(elapsed_s)} elapsed"
    if eta_at_report_s is not None:
        left = eta_at_report_s - since_report_s
        # counted down and still running (a last step the count does not cover, such as measuring the amax
        # methods after the last batch): say so, not a frozen "ETA 0.0 s"
        text += f" · ETA {format_seconds(left)}" if left >= 0.5 else " · finishing"
    return text


# the widest clock a job shows: progress displays size their label to it, so that no part is cut off
WIDEST_JOB_TIMES = "88 h 88 min elapsed · ETA 88 h 88 min"


def format_shape(shape: Sequence[int] | None) -> str:
    """A tensor shape: ``1×3×224×224`` (``?`` when unknown)."""
    return "?" if shape is None else "×".join(str(s) for s in shape)


def elide_name(name: str, fits: Callable[[str], bool]) -> str:
    """A dotted module name shortened at the front so that ``fits(text)`` holds, keeping its end and the
    block index nearest to it: ``…layer.10.attention.self.query``, then ``…10.….self.query``.

    Middle elision cuts exactly where transformers differ (``bert.encoder.laye…ention.self.query`` three
    times over); the front is what every row shares. Returns the last name part alone (``…query``) when
    nothing else fits.
    """
    if fits(name):
        return name
    parts = name.split(".")
    numeric = [i for i, part in enumerate(parts) if part.isdigit()]
    index = numeric[-1] if numeric else -1
    candidate = parts[-1]
    for start in range(1, len(parts)):
        tail = ".".join(parts[start:])
        candidate = f"…{tail}" if start <= index or index < 0 else f"…{parts[index]}.….{tail}"
        if fits(candidate):
            return candidate
    return f"…{parts[-1]}"
