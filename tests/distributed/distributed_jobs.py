"""Jobs the distributed tests launch in worker processes (module level, so spawned workers can import them).

Every job joins the process group from the environment the launcher set, runs, and returns plain
values (numbers, lists, dicts) that the test compares with a one-process run.
"""
from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

from workbench import quant
from workbench.analysis import fallback_search, sensitivity
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.distributed import SINGLE, init_from_env
from workbench.quant.tensor_quant import QuantDescriptor


def tiny_model() -> nn.Module:
    """A small CNN: histogram-calibrated inputs (per tensor), max-calibrated weights (per channel)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(6, 4))
    quant.replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    return model.eval()


def tiny_batches(count: int = 5, scale_last: float = 1.0) -> list[torch.Tensor]:
    """``count`` batches; the last one scaled, so that ranks see different ranges (different bin widths)."""
    generator = torch.Generator().manual_seed(3)
    batches = [torch.randn(2, 3, 6, 6, generator=generator) for _ in range(count)]
    batches[-1] = batches[-1] * scale_last
    return batches


def calibration_amax(method: str, num_batches: int | None, scale_last: float = 1.0) -> dict:
    """Calibrate the tiny model (distributed when launched) and return what a user would compare."""
    context = init_from_env()
    try:
        model = tiny_model()
        progress: list = []
        result = calibrate(model, tiny_batches(scale_last=scale_last), num_batches=num_batches, method=method,
                           context=context, progress=lambda d, t, m: progress.append((d, t)))
        histograms = {name: q._calibrator for name, q in model.named_modules()
                      if isinstance(q, quant.TensorQuantizer)
                      and isinstance(q._calibrator, quant.calib.HistogramCalibrator)}
        # every method's amax from the merged histograms, as the layer panel shows them
        by_method = {name: {m: float(c.compute_amax(m)) for m in ("entropy", "mse", "percentile", "max")}
                     for name, c in histograms.items()}
        return {"amax": {name: item.amax.tolist() for name, item in result.quantizers.items()},
                "by_method": by_method, "bin_width": {name: c.bin_width for name, c in histograms.items()},
                "num_samples": {name: item.num_samples for name, item in result.quantizers.items()},
                "histograms": {name: c.calib_hist.tolist() for name, c in histograms.items()},
                "num_batches": result.num_batches, "progress": progress,
                "world_size": context.world_size, "rank": context.rank}
    finally:
        context.close()


def calibrated_model() -> nn.Module:
    model = tiny_model()
    calibrate(model, tiny_batches(), num_batches=None, method="max", report_sqnr=False)
    return model


def sensitivity_values(context=SINGLE) -> dict:
    progress: list = []
    result = sensitivity(calibrated_model(), tiny_batches(3), "mse", context=context,
                         progress=lambda d, t, m: progress.append((d, t)))
    return {"units": [(u.name, u.value, u.rank) for u in result.units], "progress": progress, "cache": result.cache}


def fallback_values(target: float, context=SINGLE) -> dict:
    result = fallback_search(calibrated_model(), tiny_batches(3), "sqnr", target=target, context=context)
    return {"chosen": [u.name for u in result.chosen], "curve": [(p.num_float, p.unit, p.value) for p in result.curve],
            "reached": result.reached, "ranking": result.ranking}


def analysis_values(target: float) -> dict:
    """A sensitivity profile and a fallback search (which computes its own profile) in one job."""
    context = init_from_env()
    try:
        return {"sensitivity": sensitivity_values(context), "fallback": fallback_values(target, context),
                "world_size": context.world_size}
    finally:
        context.close()


def world() -> tuple[int, int]:
    context = init_from_env()
    try:
        return context.rank, context.world_size
    finally:
        context.close()


def failing_rank(how: str, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` raises (or kills itself) before the collective the others wait in."""
    context = init_from_env()
    if context.rank == bad_rank:
        if how == "raise":
            raise ValueError(f"rank {bad_rank} could not read its batches")
        if how == "hang":  # stuck in user code, alive: only the others' collective timeout ends the job
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)
    context.all_gather(context.rank)  # the healthy ranks wait here for the one that failed
    context.close()
    return 0


def hangs_at(phase: str, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` hangs (alive, stuck) at ``phase``: "join" before it joins the job, "work" before the
    collective the others wait in, "end" after the last collective (its result already given)."""
    if phase == "join" and int(os.environ["RANK"]) == bad_rank:
        time.sleep(600)
    context = init_from_env()
    if phase == "work" and context.rank == bad_rank:
        time.sleep(600)
    context.all_gather(context.rank)
    if phase == "end" and context.rank == bad_rank:
        time.sleep(600)
    context.close()
    return context.rank
