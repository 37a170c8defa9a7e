"""Strict JSON for everything the workbench prints or stores: no bare ``NaN`` or ``Infinity``.

Python's ``json.dumps`` writes non-finite floats as ``NaN``/``Infinity``, which is not JSON: strict
parsers (``jq``, JavaScript, Go, ``json.loads(..., parse_constant=...)``) reject the whole document.
Here a non-finite number becomes the text ``"nan"``, ``"inf"`` or ``"-inf"`` (it says what it was,
and a reader that wants a number sees at once that it has none), and ``allow_nan=False`` makes any
number that slips through an error rather than a broken document. A leaf module: every layer may use it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import PurePath
from typing import Any

__all__ = ["strict", "dumps"]


def strict(value: Any) -> Any:
    """``value`` as plain JSON data: dicts with text keys, lists, text, finite numbers, booleans and null.

    Tuples and sets become lists, NumPy scalars and arrays and torch tensors become numbers and lists
    (through ``tolist``), paths and any other object become text, and NaN/Inf become ``"nan"``,
    ``"inf"``, ``"-inf"``.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [strict(v) for v in value]
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else str(number)
    if isinstance(value, PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return strict(dataclasses.asdict(value))
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return strict(value.tolist())
    return str(value)


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict` ``(value)``, refusing any non-finite number that remains."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)
