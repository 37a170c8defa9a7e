"""How the C kernels read a CPU tensor where it lies: its layout as evenly spaced rows of contiguous values,
and the one-pass largest finite |x| that the max calibrator uses (per tensor, and per output channel of a
weight).

Calibration statistics do not depend on the order of the values, so a permuted or sliced activation (an
attention tensor, the keys cut out of a fused qkv projection) can be read in place instead of copied.
"""
from __future__ import annotations

import functools

import torch

from workbench.quant.kernels.fake_quant import cpu_extension  # None without a C compiler

__all__ = ["KERNEL_DTYPES", "dense_block", "memory_rows", "rows_of_layout", "abs_max_in_place", "abs_max_per_channel"]

# dtype codes of the C kernels
KERNEL_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# Rows shorter than this are copied out first (histogram) or left to torch (max): the kernels work on at
# most a row at a time.
_MIN_ROW = 64


def dense_block(x: torch.Tensor) -> bool:
    """Whether the elements of ``x`` are exactly the ``numel`` consecutive storage slots from ``x.data_ptr()``,
    in any order of dimensions (contiguous, or a permutation of a contiguous tensor); expanded or sliced
    views are not."""
    expected = 1
    for size, stride in sorted((pair for pair in zip(x.shape, x.stride()) if pair[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def memory_rows(x: torch.Tensor) -> tuple[int, int] | None:
    """``(row_length, row_step)`` when the elements of ``x`` are rows of ``row_length`` consecutive storage
    slots whose starts are ``row_step`` slots apart, the first at ``x.data_ptr()``, in any order of
    dimensions: a dense block is one row; a slice of a wider tensor (the keys or values cut out of a fused
    qkv projection, a token taken from every sequence) is several. None for other layouts (or rows too
    short to be worth reading in place)."""
    return rows_of_layout(x.shape, x.stride())


@functools.lru_cache(maxsize=256)  # a model shows the same few layouts on every batch
def rows_of_layout(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """:func:`memory_rows` of a tensor with this shape and these strides."""
    pairs = sorted((pair for pair in zip(shape, strides) if pair[0] != 1), key=lambda p: p[1])
    length = 1
    while pairs and pairs[0][1] == length:
        length *= pairs.pop(0)[0]
    if not pairs:
        return length, length
    step = expected = pairs[0][1]
    for size, stride in pairs:
        if stride != expected:
            return None
        expected *= size
    return (length, step) if length >= _MIN_ROW and step >= length else None


def abs_max_in_place(x: torch.Tensor) -> tuple[float, int] | None:
    """``(largest finite |x|, NaN/Inf count)`` in one pass of the C kernel over ``x`` where it lies; None
    when the kernel cannot read it (not on the CPU, another dtype, a layout that is not rows, no compiler),
    for torch's reductions to do instead. The max is a float32 value (exact: no arithmetic is involved)."""
    n = x.numel()
    if cpu_extension is None or n == 0 or x.dtype not in KERNEL_DTYPES or x.device.type != "cpu":
        return None
    rows = (n, n) if x.is_contiguous() else rows_of_layout(x.shape, x.stride())
    if rows is None:
        return None
    return cpu_extension.abs_max(x.data_ptr(), KERNEL_DTYPES[x.dtype], n, rows[0], rows[1], torch.get_num_threads())


def abs_max_per_channel(x: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``(largest finite |x| of every slice along dim 0, NaN/Inf count)`` of a contiguous CPU tensor in one pass of
    the C kernel (0 for a slice with no finite value); the maxima are a float32 tensor of ``x.shape[0]`` values
    (exact: no arithmetic is involved). None when the kernel cannot read ``x``, for torch's reductions to do
    instead. This is a weight's per-output-channel max, which torch needs about seven operations for."""
    if (cpu_extension is None or x.dim() < 2 or not x.is_cpu or x.dtype not in KERNEL_DTYPES or not x.numel()
            or not x.is_contiguous()):
        return None
    rows = x.shape[0]
    maxima = torch.empty(rows, dtype=torch.float32)
    nonfinite = cpu_extension.abs_max_rows(x.data_ptr(), KERNEL_DTYPES[x.dtype], rows, x.numel() // rows,
                                           maxima.data_ptr(), torch.get_num_threads())
    return maxima, nonfinite
