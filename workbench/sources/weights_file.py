"""A weights file (``.pt``/``.pth``/``.bin`` state_dict, ``.safetensors``) read without running code, and loaded
into a model only when every name, shape and kind of dtype fits. The demo's weights and a user's go through the
same checks.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from workbench.sources.errors import TRUST_HINT, SourceError, unreadable_reason

__all__ = ["read_state_dict", "load_weights"]


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors from a weights file, without running any code (``weights_only`` / safetensors)."""
    if not path.is_file():
        raise SourceError(f"{path}: no such weights file.")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as error:
            raise SourceError(f"{path}: not a valid safetensors file ({error}).") from error
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        reason, holds_code = unreadable_reason(path, error)
        raise SourceError(f"{path}: cannot be read as weights: {reason}. Weights are read without running code "
                          f"(tensors only).{' ' + TRUST_HINT if holds_code else ''}") from error
    if isinstance(state, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SourceError(f"{path}: does not hold a state_dict (a mapping of names to tensors).")
    return state


def _dtype_kind(dtype: torch.dtype) -> str:
    """float, complex, bool or int: a file may store another width of the same kind (fp16 weights for an fp32
    model load exactly), never another kind."""
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "bool" if dtype == torch.bool else "int"


def load_weights(model: nn.Module, path: Path) -> None:
    """Load a state_dict file into ``model``; every mismatch of names, shapes or kinds of dtype is listed in the
    error."""
    state = read_state_dict(path)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    # load_state_dict casts silently: int32 weights would truncate a float model to zeros (and back)
    dtypes = [f"{k}: file {str(state[k].dtype).removeprefix('torch.')} vs model "
              f"{str(own[k].dtype).removeprefix('torch.')}"
              for k in own if k in state and _dtype_kind(state[k].dtype) != _dtype_kind(own[k].dtype)]
    if missing or unexpected or shapes or dtypes:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {', '.join(missing[:10])}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:10])}")
        if shapes:
            parts.append(f"shape mismatches ({len(shapes)}): {'; '.join(shapes[:10])}")
        if dtypes:
            parts.append(f"dtype mismatches ({len(dtypes)}): {'; '.join(dtypes[:10])}")
        raise SourceError(f"{path}: the weights do not fit the model: " + "; ".join(parts) + ".")
    model.load_state_dict(state)
