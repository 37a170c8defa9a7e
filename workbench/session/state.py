"""A fingerprint of what the quantized model computes: the layers' decisions and descriptors, the settings it is
built from, the calibration in use (each quantizer's amax and method) and the active fine-tune.

Results measured on one state (a calibration's output SQNR, a fusion lint, an exported graph) keep the digest of
that state; comparing it with the digest now tells whether they still describe the project, across edits, undos
and reopening, without recomputing anything.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from workbench.project import Project
from workbench.project.settings import REBUILD_SETTINGS

__all__ = ["state_digest", "STATE_SETTINGS"]

# the settings that change the quantized model's numbers (the output key changes what is compared and exported)
STATE_SETTINGS = REBUILD_SETTINGS | {"output"}


def state_digest(project: Project) -> str:
    """A short hex digest that changes exactly when what the quantized model computes may have changed."""
    digest = hashlib.sha256()
    finetune = project.current_finetune
    plain = {
        "settings": {key: project.settings.get(key) for key in sorted(STATE_SETTINGS)},
        "layers": [[d.name, d.quantize, d.input_desc, d.weight_desc] for d in project.layers.values()],
        "finetune": finetune.id if finetune is not None else None,
    }
    digest.update(json.dumps(plain, sort_keys=True, default=str).encode())
    run = project.current_calibration
    if run is not None:
        digest.update(f"calibration {run.id}".encode())
        for name in sorted(run.quantizers):
            record = run.quantizers[name]
            digest.update(f"{name} {record.method}".encode())
            digest.update(np.ascontiguousarray(np.asarray(record.amax, dtype=np.float32)).tobytes())
    if finetune is not None:
        for name in sorted(finetune.amax or {}):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(np.asarray(finetune.amax[name], dtype=np.float32)).tobytes())
    return digest.hexdigest()[:20]
