"""Giving memory freed by one export step back to the system before the next step allocates.

glibc's allocator raises its mmap threshold each time a large block (a weight, its fake-quant copy, an
onnxruntime buffer) is freed, up to 32 MB; later blocks of that size then come from the heap, and freed
heap memory stays in the process. An export allocates and frees weight-sized blocks in every step (the
fake-quant reference run, the exporter, onnxruntime's Q/DQ of each weight), so the freed memory of one
step piled up under the next: a 32 MB model peaked at 4.7x its size, 2.7x with the freed memory returned
between steps (``bench/export_speed.py``). ``malloc_trim`` returns it; it does not change the allocator's
settings for the rest of the process. Elsewhere (macOS, Windows, musl) this is a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

__all__ = ["release_freed_memory", "available_memory"]


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``). True where it ran."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def available_memory() -> int | None:
    """Bytes of memory the system can give without swapping (``MemAvailable`` of ``/proc/meminfo``; the free
    pages elsewhere), or None where neither is known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
