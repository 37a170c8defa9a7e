"""Which files on disk Quant Workbench wrote: the mark an export leaves in its files, and how to read it.

A project's export history alone cannot vouch for a file: the history is part of the project file, which
anyone can edit (a crafted history can list a victim's path and its current sha256). What the project
cannot forge alone is the content of the file on disk: an ONNX graph carries :data:`WRITER_KEY` in its
model-level ``metadata_props``, the amax table the ``writer`` field, a TensorRT calibration cache its
header line. An export replaces an existing file only when the history records it with the same sha256
*and* the file is one of these (see :mod:`workbench.session.exports`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from workbench import __version__, bounded_json

__all__ = ["WRITER_KEY", "WRITER", "mark_onnx", "onnx_written_here", "amax_json_written_here",
           "calibration_cache_written_here", "written_here"]

WRITER_KEY = "workbench.writer"
WRITER = "Quant Workbench"
if TYPE_CHECKING:  # onnx is loaded when a file is read: asking whether a path is ours starts light
    import onnx

_CACHE_HEADER = re.compile(r"TRT-\d+-\w+Calibration\w*")


def mark_onnx(proto: onnx.ModelProto) -> None:
    """Record in ``proto``'s model metadata that Quant Workbench wrote it (in place; once)."""
    kept = [entry for entry in proto.metadata_props if entry.key != WRITER_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    entry = proto.metadata_props.add()
    entry.key, entry.value = WRITER_KEY, f"{WRITER} {__version__}"


def onnx_written_here(path: Path) -> bool:
    """True when ``path`` is an ONNX model that carries Quant Workbench's writer mark (weights not read)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not ONNX at all (a text file, a truncated download): not ours
        return False
    return any(entry.key == WRITER_KEY and entry.value.startswith(WRITER) for entry in model.metadata_props)


def amax_json_written_here(path: Path) -> bool:
    """True when ``path`` is an amax table as :func:`~workbench.export.export_qdq_onnx` writes it."""
    try:
        table = bounded_json.read_json_file(path)
    except (OSError, ValueError):
        return False
    return isinstance(table, dict) and str(table.get("writer", "")).startswith(WRITER) and "quantizers" in table


def calibration_cache_written_here(path: Path) -> bool:
    """True when ``path`` is a TensorRT calibration cache: a ``TRT-<version>-<algorithm>`` header, then
    ``tensor: hex`` lines (the format has no room for a mark of its own)."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, ValueError):
        return False
    return bool(lines) and _CACHE_HEADER.fullmatch(lines[0]) is not None and all(
        re.fullmatch(r".+: [0-9a-f]{8}", line) for line in lines[1:])


def written_here(path: Path, kind: str) -> bool:
    """Whether ``path`` is a file of ``kind`` ("onnx", "amax_json", "calibration_cache") that we write."""
    check = {"onnx": onnx_written_here, "amax_json": amax_json_written_here,
             "calibration_cache": calibration_cache_written_here}[kind]
    return check(path)
