"""Quantization-aware fine-tuning as session jobs: a run on the calibrated model, its history, and going
back to the calibrated weights. The active run's weights (and learned ranges) are kept in the project.

Functions of a :class:`~workbench.session.Session` (its methods call them), like
:mod:`workbench.session.tensorrt`. :mod:`workbench.training` is imported when a job runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.project import FinetuneRecord
from workbench.project.model import now_iso
from workbench.project.settings import SettingsError
from workbench.quant.calibrate import CancelToken, ProgressCallback
from workbench.quant.snapshot import quantizer_names
from workbench.session.analysis import analysis_batches
from workbench.session.build import to_numpy
from workbench.session.errors import SessionError
from workbench.session.events import SessionEvent
from workbench.sources.errors import TrustRequired
from workbench.sources.paths import absolute_entrypoint

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["finetune", "finetune_history", "reset_finetune"]


def finetune(session: Session, *, epochs: int | None = None, lr: float | None = None, optimizer: str | None = None,
             schedule: str | None = None, loss: str | None = None, learn_amax: Sequence[str] | str | None = None,
             momentum: float | None = None, weight_decay: float | None = None,
             steps_per_epoch: int | None = None, amp: bool | None = None, metric: Any = None,
             progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
             on_step: Any = None, on_epoch: Any = None):
    """Fine-tune the calibrated model; the options given are stored in the project's ``finetune`` setting,
    and a run that completed an epoch is appended to the project as the active one (its weights in use)."""
    from workbench.training import finetune as run_finetune

    given = {"epochs": epochs, "lr": lr, "optimizer": optimizer, "schedule": schedule, "loss": loss,
             "momentum": momentum, "weight_decay": weight_decay, "steps_per_epoch": steps_per_epoch, "amp": amp,
             "learn_amax": learn_amax}
    try:
        options = replace(session.settings.finetune, **{key: value for key, value in given.items() if value is not None})
    except SettingsError as error:
        raise SessionError(str(error)) from None
    loss_name = options.loss
    if ":" in str(loss_name) and not session.trust_code:
        raise TrustRequired(f"The loss {loss_name} is user code; trust it first (--trust-code).")
    # a loss file next to the project is found from any working directory (the setting keeps it relative)
    loss_spec = absolute_entrypoint(loss_name, session.base_dir) if ":" in str(loss_name) else loss_name
    model = session._require_calibrated()
    result = run_finetune(
        model, session.data("training"), loss_spec, epochs=options.epochs, lr=options.lr,
        schedule=options.schedule, optimizer=options.optimizer, momentum=options.momentum,
        weight_decay=options.weight_decay, steps_per_epoch=options.steps_per_epoch,
        eval_batches=analysis_batches(session), metric=metric if metric is not None else session.metric(),
        progress=progress, cancel=cancel, on_step=on_step, on_epoch=on_epoch, device=session.device,
        amp=options.amp, learn_amax=list(options.learn_amax) or None, trust_code=session.trust_code)
    session.project.settings["finetune"] = options.to_stored()
    session._changed(SessionEvent.SETTINGS, keys=["finetune"])
    if result.epochs_completed == 0 and not result.changed:
        return result  # cancelled before an epoch finished: the model is as it was
    quantizers = quantizer_names(model)
    own = {id(p) for q in quantizers.values() for p in q.parameters()}
    weights = {name: to_numpy(p) for name, p in model.named_parameters() if id(p) not in own}
    run = session.project.current_calibration
    amax: dict[str, np.ndarray] = {}
    for name, quantizer in quantizers.items():  # ranges that differ from the calibration: learned ones
        record = run.quantizers.get(name) if run is not None else None
        current = quantizer.amax
        if record is not None and current is not None and not np.array_equal(
                to_numpy(current), np.asarray(record.amax, dtype=np.float32)):
            amax[name] = to_numpy(current)
    finetunes = session.project.finetunes
    for old in finetunes:  # one set of weights per project: the active run's
        old.active, old.weights, old.amax = False, {}, {}
    finetunes.append(FinetuneRecord(
        id=session.project.next_id(finetunes), created=now_iso(), data=result.to_dict(),
        calibration_id=run.id if run is not None else None, folded=sorted(session.folded_layers()),
        active=True, weights=weights, amax=amax))
    session.build_report.finetune = f"fine-tuned weights of run {finetunes[-1].id} in use"
    session._changed(SessionEvent.FINETUNE, run=finetunes[-1].id)
    return result


def finetune_history(session: Session) -> list[Any]:
    """Every stored fine-tune as a :class:`workbench.training.FinetuneResult` (no model), oldest first."""
    from workbench.training import FinetuneResult

    return [FinetuneResult.from_dict(record.data) for record in session.project.finetunes]


def reset_finetune(session: Session) -> bool:
    """Back to the calibrated model's own weights (the history stays); False if no fine-tune was in use."""
    if session.project.current_finetune is None:
        return False
    for record in session.project.finetunes:
        record.active, record.weights, record.amax = False, {}, {}
    session._invalidate()
    session._changed(SessionEvent.FINETUNE, run=None)
    return True
