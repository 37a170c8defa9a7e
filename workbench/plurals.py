"""A count with its noun (and verb) in the right number: one spelling for every message, the core's reports and the
app's labels alike ("1 attention modules left in floating point" was the core's; the app had its own helper).

A leaf helper: any layer may import it, and it imports no layer.
"""
from __future__ import annotations

__all__ = ["count_text", "agree"]


def count_text(count: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """A count with its noun in the right number: ``1 quantizer``, ``16 quantizers``, ``0 layers``; ``plural`` for a
    noun that does not take an s (``mix``/``mixes``, ``matrix product``/``matrix products`` needs none); ``grouped``:
    thousands separated (``10,000 modules``). Every count message says it this way (it read "1 quantizers need
    recalibrating")."""
    number = f"{count:,}" if grouped else str(count)
    return f"{number} {noun if count == 1 else (plural or noun + 's')}"


def agree(count: int, singular: str, plural: str) -> str:
    """The word that agrees with ``count``: ``agree(1, "is", "are")`` is ``is``, ``agree(3, "has", "have")`` is
    ``have`` (the verb after :func:`count_text`: "1 quantizer has", "2 quantizers have")."""
    return singular if count == 1 else plural
