"""A folder of ``.npy`` files as tensor data: one sample per file, stacked in file-name order.

Kept apart from :mod:`workbench.sources.data_source`, which only asks :func:`is_npy_folder` whether a
folder is one and :func:`stack_npy_folder` for its inputs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.sources.errors import SourceError

__all__ = ["is_npy_folder", "stack_npy_folder"]

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def is_npy_folder(path: Path) -> bool:
    """A folder holding ``.npy`` files and no images (a folder of images stays one, whatever else it holds)."""
    if not path.is_dir():
        return False
    files = [p for p in path.iterdir() if p.is_file()]
    return any(p.suffix.lower() == ".npy" for p in files) and not any(
        p.suffix.lower() in _IMAGE_SUFFIXES for p in path.rglob("*"))


def stack_npy_folder(path: Path) -> np.ndarray:
    """The ``.npy`` files directly in ``path``, each one sample, stacked on a new first axis.

    Raises:
        SourceError: no ``.npy`` file, a file that is not a plain array, or one whose shape or dtype differs
            from the first file's (both named).
    """
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".npy")
    if not files:
        raise SourceError(f"{path}: no .npy files in this folder.")
    arrays = []
    for file in files:
        try:
            array = np.load(file, allow_pickle=False)
        except Exception as error:
            raise SourceError(f"{file}: cannot be read as an array ({type(error).__name__}: {error}); a data "
                              "folder holds one plain .npy array per sample.") from error
        if arrays and (array.shape != arrays[0].shape or array.dtype != arrays[0].dtype):
            raise SourceError(f"{file}: shape {array.shape} {array.dtype}, but {files[0].name} (the first file) is "
                              f"{arrays[0].shape} {arrays[0].dtype}: every .npy in a data folder is one sample of "
                              "the same shape and dtype (or stack them into one .npy file yourself).")
        arrays.append(array)
    return np.stack(arrays)
