"""Quantization-aware fine-tuning of a calibrated fake-quant model (step 6 of the reference workflow).

The recipe (pytorch-quantization's user guide): after calibration, keep training the fake-quant
model with the straight-through estimator for about 10% of the original schedule, starting at 1% of
the original learning rate, with a cosine annealing schedule down to 1% of the fine-tuning start
rate; keep the learning rate small and do not change the quantization scale (amax) while training.
:func:`recipe` turns an original schedule into these numbers; :func:`finetune` runs it.

What a user can rely on:

* amax stays as calibrated unless quantizers are named in ``learn_amax``;
* BatchNorm statistics stay frozen (they are what calibration saw and what TensorRT folds);
* the best checkpoint wins: the metric (or the evaluation loss) is measured before training and after
  every epoch, and the model ends with the parameters of the best of those;
* cancel is checked between steps; a cancelled fine-tune returns the best model so far, which is the
  untouched model when no epoch finished: never a half-updated one. An error (the model raising, a
  NaN loss) also puts the best parameters back before it propagates;
* the trained parameters are new tensors: a quantized model that shares its weights with the float
  model it was made from (``from_float``) leaves the float model as it was;
* on a CUDA device it trains with automatic mixed precision (float16 autocast and a gradient scaler);
  on the CPU in float32.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.analysis.metrics import Metric, ModelMetric, OutputMetric, get_metric
from workbench.project.settings import FinetuneSettings
from workbench.quant.algorithms.batches import model_device, model_inputs, run_model, to_device
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.snapshot import ModelSnapshot, all_quantizers
from workbench.quant.switches import disable_quantization
from workbench.training.amax import LearnedAmax, finish_learning_amax, start_learning_amax
from workbench.training.losses import LossFunction, batch_targets, resolve_loss

logger = logging.getLogger(__name__)

__all__ = ["finetune", "recipe", "FinetuneResult", "EpochRecord", "StepInfo", "FinetuneError", "SCHEDULES",
           "OPTIMIZERS", "FINAL_LR_RATIO"]

SCHEDULES = ("cosine", "constant")
OPTIMIZERS = ("sgd", "adam")
FINAL_LR_RATIO = 0.01  # cosine annealing ends at 1% of the fine-tuning start rate (the reference recipe)
# the defaults a project starts with are the library's too: one home, the project's typed settings
_DEFAULTS = FinetuneSettings()


class FinetuneError(RuntimeError):
    """The fine-tune could not go on (the model raised, the loss is not a finite number); the model
    has the best parameters so far (the ones it came with if no epoch finished)."""


@dataclass
class StepInfo:
    """One optimizer step, for live plots."""

    epoch: int          # 1-based
    step: int           # 1-based within the epoch
    global_step: int    # 1-based over the run
    total_steps: int | None
    loss: float
    lr: float


@dataclass
class EpochRecord:
    """The numbers of one epoch (epoch 0: the starting model, before any step)."""

    epoch: int
    train_loss: float | None   # mean over the epoch's steps (None for epoch 0)
    eval_loss: float | None    # on the evaluation batches, when they have targets (or the loss needs none)
    metric: float | None       # the metric on the evaluation batches
    lr: float | None           # the learning rate of the epoch's last step
    steps: int = 0
    seconds: float = 0.0
    best: bool = False         # the best checkpoint when this epoch ended

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class FinetuneResult:
    """What a fine-tune did. ``model`` is the fine-tuned model (the same object that was passed in)."""

    settings: dict[str, Any]
    baseline: EpochRecord
    history: list[EpochRecord] = field(default_factory=list)
    best_epoch: int = 0                 # 0: the starting model was never beaten
    criterion: str = "metric"           # what chose the best epoch: "metric", "eval_loss" or "train_loss"
    metric_name: str | None = None
    metric_direction: str | None = None
    cancelled: bool = False
    steps: int = 0
    learned_amax: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> {"before", "after"}
    learn_amax_skipped: dict[str, str] = field(default_factory=dict)
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def epochs_completed(self) -> int:
        return len(self.history)

    @property
    def best(self) -> EpochRecord:
        return self.baseline if self.best_epoch == 0 else self.history[self.best_epoch - 1]

    @property
    def changed(self) -> bool:
        """Whether the model's parameters differ from what it came with."""
        return self.best_epoch > 0 or bool(self.learned_amax and any(
            v["before"] != v["after"] for v in self.learned_amax.values()))

    def summary(self) -> str:
        done = f"{self.epochs_completed} of {self.settings.get('epochs')} epochs"
        text = f"fine-tuned {done} ({self.steps} steps)" + (", cancelled" if self.cancelled else "")
        key = {"metric": "metric", "eval_loss": "eval_loss", "train_loss": "train_loss"}[self.criterion]
        label = self.metric_name if self.criterion == "metric" else self.criterion.replace("_", " ")
        start, best = getattr(self.baseline, key), getattr(self.best, key)
        if best is not None:
            text += f"; {label} {_fmt(start)} -> {_fmt(best)}" if start is not None else f"; best {label} {_fmt(best)}"
        text += "; kept the starting model" if self.best_epoch == 0 else f"; kept epoch {self.best_epoch}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain data (no model), for the project file and ``--json``."""
        return {"settings": dict(self.settings), "baseline": self.baseline.to_dict(),
                "history": [e.to_dict() for e in self.history], "best_epoch": self.best_epoch,
                "criterion": self.criterion, "metric_name": self.metric_name,
                "metric_direction": self.metric_direction, "cancelled": self.cancelled, "steps": self.steps,
                "learned_amax": {k: dict(v) for k, v in self.learned_amax.items()},
                "learn_amax_skipped": dict(self.learn_amax_skipped)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinetuneResult:
        return cls(settings=dict(data.get("settings") or {}), baseline=EpochRecord.from_dict(data["baseline"]),
                   history=[EpochRecord.from_dict(e) for e in data.get("history") or []],
                   best_epoch=int(data.get("best_epoch", 0)), criterion=str(data.get("criterion", "metric")),
                   metric_name=data.get("metric_name"), metric_direction=data.get("metric_direction"),
                   cancelled=bool(data.get("cancelled", False)), steps=int(data.get("steps", 0)),
                   learned_amax={k: dict(v) for k, v in (data.get("learned_amax") or {}).items()},
                   learn_amax_skipped=dict(data.get("learn_amax_skipped") or {}))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def recipe(original_lr: float, original_epochs: int | None = None) -> dict[str, Any]:
    """The reference's fine-tuning schedule for a model trained with ``original_lr`` for ``original_epochs``:
    1% of the learning rate, about 10% of the epochs (at least one), cosine annealing to 1% of the start."""
    if not original_lr > 0:
        raise ValueError(f"original_lr must be positive, got {original_lr!r}.")
    settings: dict[str, Any] = {"lr": original_lr * 0.01, "schedule": "cosine"}
    if original_epochs is not None:
        settings["epochs"] = max(1, round(original_epochs * 0.1))
    return settings


def _lr_at(lr: float, schedule: str, fraction: float, final_ratio: float) -> float:
    """The learning rate at ``fraction`` (0 at the first step, 1 at the last) of the run."""
    if schedule == "constant":
        return lr
    final = lr * final_ratio
    return final + (lr - final) * 0.5 * (1.0 + math.cos(math.pi * min(max(fraction, 0.0), 1.0)))


def _length(batches: Any) -> int | None:
    try:
        return len(batches)
    except TypeError:
        return None


class _Checkpoint:
    """Copies of the tensors a fine-tune changes (trained parameters, learned ranges, BatchNorm statistics)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors
        self.values = {name: t.detach().clone() for name, t in tensors.items()}

    def update(self) -> None:
        for name, tensor in self._tensors.items():
            self.values[name].copy_(tensor.detach())

    @torch.no_grad()
    def restore(self) -> None:
        for name, tensor in self._tensors.items():
            tensor.copy_(self.values[name])


def _unshare_trained_parameters(model: nn.Module, skip: set[int]) -> int:
    """Give every trainable parameter of ``model`` a new tensor (ties inside the model are kept).

    A quantized module made with ``from_float`` shares its weight with the float module; training
    that tensor would change the user's float model too.
    """
    clones: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not param.requires_grad or id(param) in skip:
                continue
            if id(param) not in clones:
                clones[id(param)] = nn.Parameter(param.detach().clone(), requires_grad=True)
            module._parameters[name] = clones[id(param)]
    return len(clones)


def _check_positive(name: str, value: Any, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}.")


def finetune(model: nn.Module, train_batches: Iterable, loss: str | LossFunction | None = _DEFAULTS.loss, *,
             epochs: int, lr: float, schedule: str = _DEFAULTS.schedule, optimizer: str = _DEFAULTS.optimizer,
             momentum: float = _DEFAULTS.momentum, weight_decay: float = _DEFAULTS.weight_decay,
             final_lr_ratio: float = FINAL_LR_RATIO,
             eval_batches: Iterable | None = None, metric: Metric | str | None = None,
             steps_per_epoch: int | None = None, shuffle: bool = True, seed: int = 0,
             progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
             on_step: Callable[[StepInfo], None] | None = None,
             on_epoch: Callable[[EpochRecord], None] | None = None,
             device: torch.device | str | None = None, amp: bool | None = None,
             learn_amax: str | Iterable[str] | None = None, trust_code: bool = False) -> FinetuneResult:
    """Fine-tune a calibrated fake-quant ``model`` in place and return what happened.

    The steps: the arguments are checked (nothing changes before that), the optimizer and the checkpoint of
    the starting model are set up, the starting model is measured, then each epoch trains and is validated
    (the best epoch's parameters are kept), and at the end the best checkpoint is put back and the modules and
    quantizers return to the modes they came in.

    Args:
        model: a model with calibrated TensorQuantizers (amax set).
        train_batches: a re-iterable of batches (a list, a DataLoader, a workbench data source);
            ``(inputs, targets)`` pairs for the cross-entropy loss. A list is visited in a new seeded
            order every epoch (``shuffle``).
        loss: ``"cross_entropy"``, a function ``fn(outputs, targets) -> scalar tensor``, or such a
            function as ``"module:function"`` / ``"file.py:function"`` (needs ``trust_code``).
        epochs: passes over the training batches (the recipe: ~10% of the original schedule).
        lr: the starting learning rate (the recipe: 1% of the original one; see :func:`recipe`).
        schedule: ``"cosine"`` (down to ``final_lr_ratio * lr`` at the last step) or ``"constant"``.
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        momentum, weight_decay: the optimizer's (``momentum`` for SGD only; learned amax has no decay).
        final_lr_ratio: where the cosine schedule ends, as a fraction of ``lr``, in (0, 1].
        eval_batches, metric: measured before training and after every epoch to keep the best
            checkpoint; ``metric`` is a :class:`~workbench.analysis.Metric` or a name (``"top1"``,
            ``"sqnr"``..., whose FP32 reference is the starting model with quantization off). Without
            a metric the evaluation loss decides; without evaluation batches the epoch's mean training
            loss (and the starting model is no candidate).
        steps_per_epoch: stop each epoch after this many steps (default: every batch).
        shuffle, seed: visit a list of batches in a new order every epoch, from this seed.
        progress: ``progress(done, total, message)`` after every step (total 0 when unknown).
        cancel: checked between steps (and between evaluation batches).
        on_step, on_epoch: called with a :class:`StepInfo` after every step and an
            :class:`EpochRecord` after every epoch (epoch 0 included), for live plots.
        device: where to train (the model is moved there); default: the model's device.
        amp: automatic mixed precision; default on for CUDA, off elsewhere (CUDA only).
        learn_amax: regexes of quantizer names whose (per-tensor) amax is learned; default none.
        trust_code: allow a loss given as an entry point.

    Returns:
        A :class:`FinetuneResult`: the settings used, the starting model's record and one per epoch, the
        best epoch (0: the starting model was never beaten) and what chose it, the learned amax values,
        whether it was cancelled. ``model`` holds the best epoch's parameters.

    Raises:
        ValueError, TypeError: bad arguments (checked before anything changes).
        TrustRequired: an entry-point loss without ``trust_code``.
        FinetuneError: the model raised during training or the loss became NaN/inf; the model holds
            the best parameters so far.
    """
    checked = _check_arguments(model, train_batches, loss, epochs=epochs, lr=lr, schedule=schedule,
                               optimizer=optimizer, steps_per_epoch=steps_per_epoch, final_lr_ratio=final_lr_ratio,
                               eval_batches=eval_batches, metric=metric, device=device, amp=amp,
                               trust_code=trust_code)
    setup = _set_up(model, learn_amax, checked.device, checked.amp, optimizer=optimizer, lr=lr, momentum=momentum,
                    weight_decay=weight_decay)
    plan = _Schedule.of(train_batches, steps_per_epoch, epochs, lr, schedule, final_lr_ratio)
    learn = setup.learned
    settings = {"epochs": epochs, "lr": lr, "schedule": schedule, "optimizer": optimizer, "momentum": momentum,
                "weight_decay": weight_decay, "final_lr_ratio": final_lr_ratio, "loss": checked.loss_name,
                "steps_per_epoch": steps_per_epoch, "device": str(checked.device), "amp": checked.amp,
                "learn_amax": [learn_amax] if isinstance(learn_amax, str) else list(learn_amax or [])}
    metric_obj = checked.metric
    result = FinetuneResult(settings=settings, baseline=EpochRecord(0, None, None, None, None), model=model,
                            metric_name=metric_obj.name if metric_obj else None,
                            metric_direction=metric_obj.direction if metric_obj else None,
                            learn_amax_skipped=dict(learn.skipped))
    trainer = _Trainer(model, checked.loss_fn, metric_obj, checked.eval_batches, checked.device, checked.amp, cancel)
    try:
        best_value = _measure_start(trainer, result, on_epoch)
        generator = torch.Generator().manual_seed(seed)
        for epoch in range(1, 1 + (0 if result.cancelled else epochs)):
            started = time.monotonic()
            losses, current_lr = _train_epoch(trainer, setup, plan, train_batches, epoch, result,
                                              shuffle=shuffle, generator=generator, cancel=cancel,
                                              progress=progress, on_step=on_step)
            if result.cancelled or not losses:
                if not losses and not result.cancelled:
                    raise ValueError("train_batches yielded no batch.")
                break
            best_value = _validate_epoch(trainer, setup, result, epoch, losses, current_lr, started, best_value,
                                         on_epoch)
            if result.cancelled:
                break
    except BaseException as error:
        setup.best_state.restore()
        _finish(model, setup.entry_state, learn, result)
        if isinstance(error, FinetuneError) or not isinstance(error, Exception):
            raise
        raise FinetuneError(f"Fine-tuning failed: {type(error).__name__}: {error}; the model keeps the best "
                            f"parameters so far (epoch {result.best_epoch}).") from error
    # commit: the best checkpoint (or the starting model) unless the last epoch was the best
    if result.cancelled or result.best_epoch != len(result.history):
        setup.best_state.restore()
    _finish(model, setup.entry_state, learn, result)
    logger.info("%s", result.summary())
    return result


# ----- the steps of finetune() ---------------------------------------------------------------------------------

@dataclass
class _Checked:
    """finetune()'s arguments once checked and resolved (nothing has changed on the model yet)."""

    loss_fn: LossFunction
    loss_name: str
    metric: Metric | None
    device: torch.device
    amp: bool
    eval_batches: list | None


def _check_arguments(model: nn.Module, train_batches: Iterable, loss: str | LossFunction | None, *, epochs: int,
                     lr: float, schedule: str, optimizer: str, steps_per_epoch: int | None, final_lr_ratio: float,
                     eval_batches: Iterable | None, metric: Metric | str | None, device: torch.device | str | None,
                     amp: bool | None, trust_code: bool) -> _Checked:
    """Every argument checked before anything changes; the loss and metric resolved, the device and amp chosen."""
    _check_positive("epochs", epochs, integer=True)
    _check_positive("lr", lr)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}.")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}.")
    if steps_per_epoch is not None:
        _check_positive("steps_per_epoch", steps_per_epoch, integer=True)
    if not 0 < final_lr_ratio <= 1:
        raise ValueError(f"final_lr_ratio must be in (0, 1], got {final_lr_ratio!r}.")
    if isinstance(train_batches, (torch.Tensor, Iterator)):  # not iter(): that would start a loader's workers
        raise TypeError("train_batches must be re-iterable (a list, a DataLoader or a data source), not a single "
                        "tensor or a one-shot iterator: every epoch goes over it again.")
    loss_fn, loss_name = resolve_loss(loss, trust_code=trust_code)
    metric_obj = get_metric(metric) if metric is not None else None
    if isinstance(metric_obj, ModelMetric):
        metric_obj.load()  # a bad entry point fails before anything changes
    target = torch.device(device) if device is not None else model_device(model)
    if amp is None:
        amp = target.type == "cuda"
    if amp and target.type != "cuda":
        raise ValueError(f"Mixed precision (amp) needs a CUDA device; the model trains on {target}.")
    eval_list = list(eval_batches) if eval_batches is not None else None
    if eval_list is not None and not eval_list:
        raise ValueError("eval_batches is empty.")
    if metric_obj is not None and eval_list is None:
        raise ValueError("A metric needs eval_batches to be measured on.")
    return _Checked(loss_fn, loss_name, metric_obj, target, bool(amp), eval_list)


@dataclass
class _Setup:
    """What training changes and what puts it back: the quantizers, the modes the model came in, the learned
    ranges, the optimizer and the checkpoint of the best parameters so far."""

    quantizers: list
    entry_state: ModelSnapshot
    learned: LearnedAmax
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    best_state: _Checkpoint


def _set_up(model: nn.Module, learn_amax: str | Iterable[str] | None, target: torch.device, amp: bool, *,
            optimizer: str, lr: float, momentum: float, weight_decay: float) -> _Setup:
    """Snapshot the modes, start learning amax, give the trained parameters their own tensors on ``target``,
    build the optimizer, and checkpoint the starting model (what a cancel before the first epoch restores)."""
    quantizers = all_quantizers(model)
    if not any(q.has_amax for q in quantizers):
        logger.warning("No quantizer of the model has an amax: fine-tune a calibrated model.")
    own_params = {id(p) for q in quantizers for p in q.parameters()}
    if not any(p.requires_grad and id(p) not in own_params for p in model.parameters()):
        raise ValueError("The model has no trainable parameters (every parameter has requires_grad=False).")
    # train/eval modes and quantizer flags (calibration is off while training) go back at the end;
    # amax does not: learned ranges are the result
    entry_state = ModelSnapshot(model)
    learned = start_learning_amax(model, learn_amax)
    quantizer_params = {id(p) for q in quantizers for p in q.parameters()}
    # new tensors before moving: Module.to() moves a shared Parameter in place, for both models
    _unshare_trained_parameters(model, quantizer_params)
    model.to(target)
    weights = [p for p in model.parameters() if p.requires_grad and id(p) not in quantizer_params]
    learned_params = learned.parameters()
    groups: list[dict[str, Any]] = [{"params": weights}]
    if learned_params:
        groups.append({"params": learned_params, "weight_decay": 0.0})
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    else:
        opt = torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay)
    scaler = torch.amp.GradScaler(target.type, enabled=bool(amp))

    tracked: dict[str, torch.Tensor] = {f"param{i}": p for i, p in enumerate(weights + learned_params)}
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            for key, buffer in module._buffers.items():
                if buffer is not None and buffer.is_floating_point():
                    tracked[f"{name}.{key}"] = buffer
    return _Setup(quantizers, entry_state, learned, opt, scaler, _Checkpoint(tracked))


@dataclass
class _Schedule:
    """The learning rate at each step: steps per epoch and in all (None when the data's length is unknown)."""

    epochs: int
    lr: float
    schedule: str
    final_lr_ratio: float
    per_epoch: int | None
    total_steps: int | None

    @classmethod
    def of(cls, batches: Iterable, steps_per_epoch: int | None, epochs: int, lr: float, schedule: str,
           final_lr_ratio: float) -> _Schedule:
        length = _length(batches)
        per_epoch = min(length, steps_per_epoch) if length is not None and steps_per_epoch else (
            length or steps_per_epoch)
        return cls(epochs, lr, schedule, final_lr_ratio, per_epoch, per_epoch * epochs if per_epoch else None)

    def lr_at(self, steps_done: int, epoch: int) -> float:
        """The rate of the next step, after ``steps_done`` steps of the run, in (1-based) ``epoch``."""
        if self.total_steps and self.total_steps > 1:
            fraction = steps_done / (self.total_steps - 1)
        else:  # unknown length: anneal per epoch
            fraction = (epoch - 1) / max(self.epochs - 1, 1)
        return _lr_at(self.lr, self.schedule, fraction, self.final_lr_ratio)


def _measure_start(trainer: _Trainer, result: FinetuneResult,
                   on_epoch: Callable[[EpochRecord], None] | None) -> float | None:
    """Measure the starting model (epoch 0) and choose what decides the best epoch; its value (None: the
    starting model is no candidate)."""
    result.baseline = trainer.evaluate(0)
    if result.baseline is None:  # cancelled while measuring the starting model: no epoch runs
        result.baseline = EpochRecord(0, None, None, None, None)
        result.cancelled = True
    result.criterion = ("metric" if result.baseline.metric is not None else
                        "eval_loss" if result.baseline.eval_loss is not None else "train_loss")
    best_value = _value(result.baseline, result.criterion)
    result.baseline.best = best_value is not None
    if on_epoch is not None:
        on_epoch(result.baseline)
    return best_value


def _train_epoch(trainer: _Trainer, setup: _Setup, plan: _Schedule, train_batches: Iterable, epoch: int,
                 result: FinetuneResult, *, shuffle: bool, generator: torch.Generator, cancel: CancelToken | None,
                 progress: ProgressCallback | None,
                 on_step: Callable[[StepInfo], None] | None) -> tuple[list[float], float]:
    """One pass over the training batches (BatchNorm frozen, calibration off); the step losses and the last
    rate. A cancel sets ``result.cancelled`` and ends the pass."""
    for module in trainer.model.modules():
        module.train()
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()  # frozen statistics: what calibration saw, what TensorRT folds
    for q in setup.quantizers:
        q.disable_calib()
    losses: list[float] = []
    current_lr = plan.lr
    for step, batch in enumerate(_epoch_batches(train_batches, shuffle, generator), start=1):
        if plan.per_epoch is not None and step > plan.per_epoch:
            break
        if cancel is not None and cancel.is_set():
            result.cancelled = True
            break
        current_lr = plan.lr_at(result.steps, epoch)
        for group in setup.opt.param_groups:
            group["lr"] = current_lr
        value = trainer.step(batch, setup.opt, setup.scaler, epoch, step)
        setup.learned.symmetrize()
        losses.append(value)
        result.steps += 1
        if progress is not None:
            progress(result.steps, plan.total_steps or 0, f"epoch {epoch}/{plan.epochs}, step {step}: loss {value:.4g}")
        if on_step is not None:
            on_step(StepInfo(epoch, step, result.steps, plan.total_steps, value, current_lr))
    return losses, current_lr


def _validate_epoch(trainer: _Trainer, setup: _Setup, result: FinetuneResult, epoch: int, losses: list[float],
                    current_lr: float, started: float, best_value: float | None,
                    on_epoch: Callable[[EpochRecord], None] | None) -> float | None:
    """Measure the epoch, checkpoint it when it is the best so far, and record it; the best value after it. A
    cancel while measuring sets ``result.cancelled`` and the epoch does not count."""
    record = trainer.evaluate(epoch)
    if record is None:  # cancelled while measuring: the epoch does not count
        result.cancelled = True
        return best_value
    record.train_loss = sum(losses) / len(losses)
    record.lr, record.steps, record.seconds = current_lr, len(losses), time.monotonic() - started
    value = _value(record, result.criterion)
    if best_value is None or _better(value, best_value, result.criterion, result.metric_direction):
        best_value, result.best_epoch, record.best = value, epoch, True
        setup.best_state.update()
    result.history.append(record)
    if on_epoch is not None:
        on_epoch(record)
    return best_value


def _finish(model: nn.Module, entry_state: ModelSnapshot, learned: LearnedAmax, result: FinetuneResult) -> None:
    """Learned ranges back into amax buffers, modules and quantizers back to the modes they came in."""
    if learned.quantizers:
        after = finish_learning_amax(learned)
        for name, value in after.items():
            for alias in learned.names.get(name, [name]):
                result.learned_amax[alias] = {"before": learned.before[name], "after": value}
    entry_state.restore_modes()
    entry_state.restore_flags()
    model.zero_grad(set_to_none=True)


def _value(record: EpochRecord, criterion: str) -> float | None:
    return getattr(record, criterion)


def _better(value: float | None, best: float, criterion: str, direction: str | None) -> bool:
    if value is None or math.isnan(value):
        return False
    if criterion == "metric" and direction == "higher":
        return value > best
    return value < best


def _epoch_batches(batches: Iterable, shuffle: bool, generator: torch.Generator) -> Iterable:
    if shuffle and isinstance(batches, Sequence) and not isinstance(batches, (str, bytes)):
        order = torch.randperm(len(batches), generator=generator).tolist()
        return (batches[i] for i in order)
    return batches


class _Trainer:
    """One step and one evaluation, on the right device and precision."""

    def __init__(self, model: nn.Module, loss_fn: LossFunction, metric: Metric | None, eval_batches: list | None,
                 device: torch.device, amp: bool, cancel: CancelToken | None) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.metric = metric
        self.eval_batches = eval_batches
        self.device = device
        self.amp = amp
        self.cancel = cancel
        self.reference: list[Any] | None = None

    def _autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=torch.float16, enabled=self.amp)

    def _loss(self, outputs: Any, targets: Any) -> torch.Tensor:
        value = self.loss_fn(outputs, targets)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise FinetuneError(f"The loss must return a scalar tensor, got {type(value).__name__}"
                                f"{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}.")
        return value.reshape(())

    def step(self, batch: Any, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, epoch: int,
             step: int) -> float:
        targets = to_device(batch_targets(batch), self.device)
        opt.zero_grad(set_to_none=True)
        with self._autocast():
            outputs = run_model(self.model, batch, self.device)
        loss = self._loss(outputs, targets)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FinetuneError(f"The loss became {value} at epoch {epoch}, step {step}: lower the learning rate. "
                                "The model keeps the best parameters so far.")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return value

    @torch.no_grad()
    def evaluate(self, epoch: int) -> EpochRecord | None:
        """Metric and loss on the evaluation batches in eval mode and float32; None when cancelled."""
        record = EpochRecord(epoch, None, None, None, None)
        if self.eval_batches is None:
            return record
        self.model.eval()
        if isinstance(self.metric, OutputMetric) and self.metric.needs_reference and self.reference is None:
            # the FP32 reference: the starting model with every quantizer off
            with disable_quantization(self.model):
                self.reference = []
                for batch in self.eval_batches:
                    if self._cancelled():
                        return None
                    self.reference.append(run_model(self.model, batch, self.device))
        accumulator = self.metric.start() if isinstance(self.metric, OutputMetric) else None
        total, count, with_loss = 0.0, 0, True
        for i, batch in enumerate(self.eval_batches):
            if self._cancelled():
                return None
            outputs = run_model(self.model, batch, self.device)
            if accumulator is not None:
                accumulator.update(outputs, self.reference[i] if self.reference is not None else outputs, batch)
            if with_loss:
                try:
                    value = float(self._loss(outputs, to_device(batch_targets(batch), self.device)))
                except Exception as error:  # noqa: BLE001 - unlabelled evaluation data: no evaluation loss
                    logger.info("No evaluation loss: %s: %s", type(error).__name__, error)
                    with_loss = False
                    continue
                size = _batch_size(batch)
                total += value * size
                count += size
        if accumulator is not None:
            record.metric = float(accumulator.value())
        elif isinstance(self.metric, ModelMetric):
            record.metric = float(self.metric.evaluate(self.model, self.eval_batches))
        if with_loss and count:
            record.eval_loss = total / count
        return record

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


def _batch_size(batch: Any) -> int:
    args, kwargs = model_inputs(batch)
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 1
