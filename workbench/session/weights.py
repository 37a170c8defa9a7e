"""Which weights a calibration saw: a cheap fingerprint of the float model, kept with each calibration run.

A factory with random initialisation and no ``--weights`` builds other weights at every command, so the
amax stored by ``calibrate`` would be applied by ``evaluate`` and ``export`` to weights they were not
computed on (37.5 dB at calibrate, 30.4 at evaluate, in issue 38). Weight *files* are covered by their
sha256 (:func:`workbench.session.paths.changed_files`); this covers weights made by code.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

import torch
from torch import nn

from workbench.project import Project

__all__ = ["weights_digest", "other_weights_note", "SAMPLED_VALUES"]

logger = logging.getLogger(__name__)

# values read from each tensor: re-initialised weights differ everywhere, so a strided sample finds them
# without hashing gigabytes at every open
SAMPLED_VALUES = 4096


def weights_digest(model: nn.Module,
                   sample: Callable[[str, torch.Tensor, int, int], torch.Tensor] | None = None) -> str:
    """A short hex digest of ``model``'s parameters and buffers: names, shapes, dtypes and a strided sample.

    ``sample(name, tensor, step, count)`` gives the values ``tensor.reshape(-1)[::step][:count]`` of a state_dict
    entry whose weights are not in memory (a lazily opened checkpoint's, on meta, reading only those values): the
    digest is the one the eagerly loaded model has.
    """
    digest = hashlib.blake2b(digest_size=10)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            step = max(1, tensor.numel() // SAMPLED_VALUES)
            if sample is not None and tensor.is_meta:
                values = sample(name, tensor, step, SAMPLED_VALUES)
            else:
                values = tensor.detach().reshape(-1)[::step][:SAMPLED_VALUES]
            values = values.to("cpu", copy=True).contiguous()
            digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype};".encode())
            digest.update(values.view(torch.uint8).numpy().tobytes() if values.numel() else b"")
    return digest.hexdigest()


def other_weights_note(project: Project, digest: str) -> list[str]:
    """A warning (also logged) when the project's calibration was computed on other weights than ``digest``."""
    run = project.current_calibration
    if run is None or run.weights_digest is None or run.weights_digest == digest:
        return []
    message = (f"calibration {run.id} was computed on other weights than the model built now (its factory "
               "builds different weights at each run: random initialisation without --weights?); its amax do "
               "not describe these weights: recalibrate, or give the model fixed weights (--weights FILE, or a "
               "seed in the factory).")
    logger.warning(message)
    return [message]
