"""Reading JSON that someone else wrote: nesting too deep for Python and files too large are errors, not crashes.

``json.loads`` recurses once per level of nesting, so ``[[[[...]]]]`` 100,000 levels deep (200 KB) raises
``RecursionError``, which no reader's ``except ValueError`` catches: it surfaced as an "internal error".
Here it is a :class:`json.JSONDecodeError` like any other malformed document, saying why; and
:func:`read_json_file` refuses a file over a size limit at once, with the number, before reading it.
A leaf module: every layer may use it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["loads", "read_json_file", "JSONTooLargeError", "MAX_JSON_BYTES"]

# the largest JSON file read whole: a real engine's detailed layer information is a few MB to a few tens of MB,
# and Python needs about 8-10 bytes of memory per byte of JSON
MAX_JSON_BYTES = int(os.environ.get("WORKBENCH_MAX_JSON_MB", "256")) * 1024 * 1024


class JSONTooLargeError(ValueError):
    """A JSON file over the size limit (the message gives both sizes)."""


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads``, with nesting too deep for Python raised as a :class:`json.JSONDecodeError`."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        document = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply to read (lists or objects inside each other beyond "
                                   "Python's recursion limit)", document[:1], 0) from None


def read_json_file(path: str | os.PathLike, limit: int | None = None, **kwargs: Any) -> Any:
    """The JSON document in ``path`` (UTF-8), refusing one over ``limit`` bytes (default :data:`MAX_JSON_BYTES`).

    Raises:
        JSONTooLargeError: the file is over the limit (nothing was read).
        json.JSONDecodeError: not JSON, or nested too deeply.
        OSError, UnicodeDecodeError: the file cannot be read as text.
    """
    path = Path(path)
    limit = MAX_JSON_BYTES if limit is None else limit
    size = path.stat().st_size
    if size > limit:
        raise JSONTooLargeError(f"{path}: {size / 2**20:,.1f} MB, over the {limit / 2**20:,.0f} MB read whole "
                                "(set WORKBENCH_MAX_JSON_MB to raise the limit)")
    return loads(path.read_text(encoding="utf-8"), **kwargs)
