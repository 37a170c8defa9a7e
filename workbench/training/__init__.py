"""Quantization-aware fine-tuning: train a calibrated fake-quant model a little longer, amax fixed.

    from workbench.training import finetune, recipe
    result = finetune(model, train_batches, "cross_entropy", **recipe(original_lr=0.1, original_epochs=90),
                      eval_batches=test_batches, metric="top1")
    print(result.summary())

No Qt here: the session runs :func:`finetune` as a job (progress, cancel) and stores its history and
weights in the project; the GUI plots the history live.
"""
from workbench.training.amax import LearnedAmax, finish_learning_amax, start_learning_amax  # noqa: F401
from workbench.training.finetune import (  # noqa: F401
    FINAL_LR_RATIO,
    OPTIMIZERS,
    SCHEDULES,
    EpochRecord,
    FinetuneError,
    FinetuneResult,
    StepInfo,
    finetune,
    recipe,
)
from workbench.training.losses import batch_targets, cross_entropy, resolve_loss  # noqa: F401

__all__ = ["finetune", "recipe", "FinetuneResult", "EpochRecord", "StepInfo", "FinetuneError", "SCHEDULES",
           "OPTIMIZERS", "FINAL_LR_RATIO", "LearnedAmax", "start_learning_amax", "finish_learning_amax",
           "resolve_loss", "cross_entropy", "batch_targets"]
