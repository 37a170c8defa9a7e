"""Quantization-aware fine-tuning as session jobs: a run on the calibrated model, its history, and going
back to the calibrated weights. The active run's weights (and learned ranges) are kept in the project.

Functions of the calibrated model, its data and project, returning what the
:class:`~workbench.session.Session` keeps (its methods call them, apply what they return and tell the front
ends). :mod:`workbench.training` is imported when a job runs.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.project import FinetuneRecord, Project
from workbench.project.model import now_iso
from workbench.project.settings import FinetuneSettings, SettingsError
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.session.build import to_numpy
from workbench.session.errors import SessionError
from workbench.sources.data_source import DataSource
from workbench.sources.errors import TrustRequired
from workbench.sources.paths import absolute_entrypoint

__all__ = ["finetune_options", "finetune", "finetune_record", "activate", "finetune_history", "reset_finetune"]


def finetune_options(current: FinetuneSettings, given: dict[str, Any], *, trust_code: bool,
                     base_dir: Path) -> tuple[FinetuneSettings, str]:
    """The options of a run: ``current`` (the project's ``finetune`` setting) with the ``given`` ones that are
    not None, and the loss to train with (a loss file next to the project, in ``base_dir``, is found from any
    working directory; the setting keeps it relative).

    Raises:
        SessionError: a given option is refused. TrustRequired: the loss is user code and ``trust_code`` is off.
    """
    try:
        options = replace(current, **{key: value for key, value in given.items() if value is not None})
    except SettingsError as error:
        raise SessionError(str(error)) from None
    loss_name = options.loss
    if ":" in str(loss_name) and not trust_code:
        raise TrustRequired(f"The loss {loss_name} is user code; trust it first (--trust-code).")
    loss_spec = absolute_entrypoint(loss_name, base_dir) if ":" in str(loss_name) else loss_name
    return options, loss_spec


def finetune(model: nn.Module, training: DataSource, eval_batches: list, metric: Any, options: FinetuneSettings,
             loss: str, *, device: torch.device, trust_code: bool, progress: ProgressCallback | None = None,
             cancel: CancelToken | None = None, on_step: Any = None, on_epoch: Any = None):
    """Fine-tune the calibrated ``model`` in place on ``training`` with ``options`` (see
    :func:`workbench.training.finetune`), keeping the best epoch on ``eval_batches`` by ``metric``."""
    from workbench.training import finetune as run_finetune

    return run_finetune(
        model, training, loss, epochs=options.epochs, lr=options.lr,
        schedule=options.schedule, optimizer=options.optimizer, momentum=options.momentum,
        weight_decay=options.weight_decay, steps_per_epoch=options.steps_per_epoch,
        eval_batches=eval_batches, metric=metric,
        progress=progress, cancel=cancel, on_step=on_step, on_epoch=on_epoch, device=device,
        amp=options.amp, learn_amax=list(options.learn_amax) or None, trust_code=trust_code)


def finetune_record(model: nn.Module, project: Project, result: Any, folded: Iterable[str]) -> FinetuneRecord:
    """The record of a run that changed ``model``: its history, the resulting weights and the ranges it learned
    (those that differ from ``project``'s current calibration); ``folded``: layers a BatchNorm is folded into."""
    quantizers = quantizer_names(model)
    own = {id(p) for q in quantizers.values() for p in q.parameters()}
    weights = {name: to_numpy(p) for name, p in model.named_parameters() if id(p) not in own}
    run = project.current_calibration
    amax: dict[str, np.ndarray] = {}
    for name, quantizer in quantizers.items():  # ranges that differ from the calibration: learned ones
        record = run.quantizers.get(name) if run is not None else None
        current = quantizer.amax
        if record is not None and current is not None and not np.array_equal(
                to_numpy(current), np.asarray(record.amax, dtype=np.float32)):
            amax[name] = to_numpy(current)
    return FinetuneRecord(id=project.next_id(project.finetunes), created=now_iso(), data=result.to_dict(),
                          calibration_id=run.id if run is not None else None, folded=sorted(folded),
                          active=True, weights=weights, amax=amax)


def activate(project: Project, record: FinetuneRecord) -> None:
    """Append ``record`` to the project's fine-tunes as the active one: one set of weights per project."""
    for old in project.finetunes:
        old.active, old.weights, old.amax = False, {}, {}
    project.finetunes.append(record)


def finetune_history(project: Project) -> list[Any]:
    """Every stored fine-tune as a :class:`workbench.training.FinetuneResult` (no model), oldest first."""
    from workbench.training import FinetuneResult

    return [FinetuneResult.from_dict(record.data) for record in project.finetunes]


def reset_finetune(project: Project) -> bool:
    """Back to the calibrated model's own weights (the history stays); False if no fine-tune was in use."""
    if project.current_finetune is None:
        return False
    for record in project.finetunes:
        record.active, record.weights, record.amax = False, {}, {}
    return True
