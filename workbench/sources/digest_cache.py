"""The sha256 of large model files, computed once per version of the file rather than at every open.

A project fingerprints the files its model is read from (:func:`workbench.sources.model_source.load_model`), so that
opening it after a checkpoint changed says so. Hashing a 7B bf16 checkpoint reads 13.5 GB (about a minute) at every
``show`` and every job; here the digest is remembered with what ``stat`` says of the file (size, modification and
change times in nanoseconds, inode and device), as git's index does, and hashed again only when any of those
changed. Writing a file (even with its old size and a restored modification time) moves its change time, which no
user call can set back. Small files are hashed every time (cheaper than the lookup is worth).

The table is ``$XDG_CACHE_HOME/quant-workbench/file-digests.json`` (``~/.cache`` by default), written atomically;
an unreadable or foreign table is ignored and rewritten, so the cache can only save work, never change a digest.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["CACHED_FROM_BYTES", "cache_file", "cached_sha256"]

logger = logging.getLogger(__name__)

# files from this size are remembered: below it hashing costs less than a millisecond per MiB read
CACHED_FROM_BYTES = 16 * 1024 ** 2
_MAX_ENTRIES = 512  # the most recently hashed files are kept


def cache_file() -> Path:
    """Where the table of remembered digests lies."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "quant-workbench" / "file-digests.json"


def _stamp(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def _read_table(path: Path) -> dict[str, dict]:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def cached_sha256(path: Path, compute: Callable[[Path], str]) -> str:
    """The sha256 (hex) of ``path``: remembered when the file is unchanged since it was computed, else
    ``compute(path)`` (and remembered for next time, for files of :data:`CACHED_FROM_BYTES` or more)."""
    stat = path.stat()
    if stat.st_size < CACHED_FROM_BYTES:
        return compute(path)
    key = str(path.resolve())
    table_path = cache_file()
    entry = _read_table(table_path).get(key)
    if isinstance(entry, dict) and entry.get("stat") == _stamp(stat) and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = compute(path)
    after = path.stat()
    if _stamp(after) != _stamp(stat):  # written while it was read: this digest describes no version of it
        return digest
    table = _read_table(table_path)  # again: another process may have added its own meanwhile
    table.pop(key, None)
    table[key] = {"stat": _stamp(stat), "sha256": digest}
    for old in list(table)[:-_MAX_ENTRIES]:
        del table[old]
    temporary = None
    try:
        table_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=table_path.parent, prefix=".file-digests.", suffix=".tmp",
                                         delete=False) as handle:
            temporary = Path(handle.name)
            json.dump(table, handle)
        os.replace(temporary, table_path)  # readers see the old table or the new one, never half of it
    except OSError as error:  # a read-only home: hash again next time
        logger.debug("file digests not remembered in %s: %s", table_path, error)
        if temporary is not None:
            temporary.unlink(missing_ok=True)
    return digest
