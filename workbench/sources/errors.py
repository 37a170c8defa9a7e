"""Errors of model and data sources: each message names the file and what was wrong."""
from __future__ import annotations

import pickle
import re
from pathlib import Path


class SourceError(ValueError):
    """A model or data source could not be used."""


class TrustRequired(SourceError):
    """Using this source runs its Python code (a factory, a pickle); the user has to trust it first."""


class EntryPointError(SourceError):
    """An entry point (``file.py:function`` / ``package.module:function``) is malformed or cannot be loaded."""


# torch's own advice on a refused pickle says that loading with weights_only=False "will likely succeed":
# advice to run code from an untrusted file, which a message of ours must never pass on.
_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_NUMPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def unreadable_reason(path: Path, error: BaseException) -> tuple[str, bool]:
    """Why ``path`` could not be read as plain tensors (by torch.load(weights_only=True) or
    np.load(allow_pickle=False)).

    Returns (reason, holds_code): the reason in words that quote no advice to run untrusted code, and
    whether the file holds pickled Python objects (loading it would run code).
    """
    text = str(error)
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        head = b""
    found = _GLOBAL.search(text)
    if found:
        return (f"it holds pickled Python objects (it refers to {found.group(1)}), not only tensors: loading it "
                "would run code from the file", True)
    if "Object arrays cannot be loaded" in text:
        return "it holds an array of Python objects (pickled), not plain numbers", True
    if "pickled (object) data" in text:  # numpy: not an .npy/.npz header, so np.load took it for a pickle
        if head.startswith(_NUMPY_MAGIC):
            return "it holds an array of Python objects (pickled), not plain numbers", True
        return "it is not a NumPy file: it has no .npy or .npz header (damaged, or not an array file)", False
    if head.startswith(_ZIP_MAGIC):
        if isinstance(error, pickle.UnpicklingError) or "weights_only" in text:
            return "its contents cannot be read as tensors (a damaged or unsupported PyTorch file)", False
        return f"it is a damaged PyTorch file ({type(error).__name__}: {text.splitlines()[0] if text else ''})", False
    if head.startswith(_NUMPY_MAGIC):
        return f"it is a damaged NumPy file ({type(error).__name__}: {text.splitlines()[0] if text else ''})", False
    # neither a zip (torch.save) nor an array file: torch's legacy reader fails in many ways on such bytes
    return "it is not a PyTorch tensor file (damaged, or not a file torch.save wrote)", False


TRUST_HINT = ("Only if the file comes from a source you trust may it be loaded as a whole pickled model (give it "
              "as the model, with --trust-code); otherwise save its tensors as a state_dict or .safetensors.")


def mixed_sizes_message(folder: Path, first: tuple[Path, tuple[int, ...]], odd: dict[Path, tuple[int, ...]]) -> str:
    """The error for a folder of images of different sizes: which files differ, and how to make them agree."""

    def size(shape: tuple[int, ...]) -> str:
        return f"{shape[-1]}x{shape[-2]}" if len(shape) >= 2 else str(shape)

    shown = ", ".join(f"{path.name} is {size(shape)}" for path, shape in list(odd.items())[:3])
    more = f" (and {len(odd) - 3} more)" if len(odd) > 3 else ""
    return (f"{folder}: the images differ in size: {first[0].name} is {size(first[1])}, but {shown}{more}. A batch "
            "needs one size: give --resize N --crop N (resize the shorter side, then center-crop) so that every "
            "image becomes NxN.")
