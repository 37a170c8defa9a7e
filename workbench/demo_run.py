"""``workbench demo``: the whole job on the built-in digits CNN, headless.

Creates a project on the demo model and data, calibrates, ranks layer sensitivity, exports and
validates QDQ ONNX, saves the project, and reports FP32 against INT8 accuracy on the digits test
split. Every step goes through :class:`workbench.session.Session`, exactly as the GUI does.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.demo import DEMO_BATCH_SIZE, DEMO_CALIB_BATCHES, DEMO_EVAL_BATCH_SIZE, DEMO_METHOD
from workbench.sources.model_source import ModelSpec

DEMO_PROJECT = "digits-demo.qwb"


def demo_project_specs(calib_batches: int = DEMO_CALIB_BATCHES, batch_size: int = DEMO_BATCH_SIZE) -> dict[str, Any]:
    """``Session.create`` arguments of the demo project (the GUI's ``--demo`` creates the same one)."""
    return {"model": ModelSpec("demo", "digits"),
            "calibration": DataSpec("demo", "digits", split="train", batch_size=batch_size,
                                    num_batches=calib_batches),
            "evaluation": DataSpec("demo", "digits", split="test", batch_size=DEMO_EVAL_BATCH_SIZE),
            "name": "digits-demo",
            "settings": {"metric": {"name": "sqnr", "direction": None}}}


def create_demo_session(calib_batches: int = DEMO_CALIB_BATCHES, batch_size: int = DEMO_BATCH_SIZE) -> Session:
    """A new, unsaved session on the demo digits CNN with its train (calibration) and test splits."""
    return Session.create(**demo_project_specs(calib_batches, batch_size))


def _stage(progress: ProgressCallback | None, name: str) -> ProgressCallback | None:
    if progress is None:
        return None
    return lambda done, total, message: progress(done, total, f"{name}: {message}")


def run_demo(out: Path, *, calib_batches: int = DEMO_CALIB_BATCHES, method: str = DEMO_METHOD,
             progress: ProgressCallback | None = None,
             cancel: CancelToken | None = None) -> dict[str, Any]:
    """Run the demo into folder ``out``; returns a report with a ``text`` rendering."""
    if calib_batches < 1:
        raise ValueError(f"calibration batches must be positive, got {calib_batches}.")
    out.mkdir(parents=True, exist_ok=True)
    # a folder a previous demo run wrote (its project is there): this run replaces that run's exported file,
    # which the new project did not write and would otherwise refuse to overwrite
    rerun = (out / DEMO_PROJECT).is_file()
    session = create_demo_session(calib_batches)
    session.save(out / DEMO_PROJECT)
    calibration = session.calibrate(method=method, progress=_stage(progress, "calibrate"), cancel=cancel)
    evaluation = session.evaluate("top1")
    profile = session.sensitivity(scheme="one-off", metric="sqnr", progress=_stage(progress, "sensitivity"),
                                  cancel=cancel)
    export = session.export(out / "digits-demo.qdq.onnx", force=rerun)
    path = session.save()

    worst = profile.ranked()[:3]
    lines = [
        "Quant Workbench demo: digits CNN (8x8 images, 10 classes)",
        f"  project: {path}",
        f"  model: {session.summary()['model_description']}",
        f"  calibration: {calibration.summary()}",
        "",
        f"  {'':<14} {'FP32':>8} {'INT8':>8} {'delta':>8}",
        f"  {evaluation.name:<14} {evaluation.fp32:>8.4f} {evaluation.int8:>8.4f} "
        f"{evaluation.delta:>+8.4f}   ({session.data('evaluation').num_samples} test images)",
        f"  output SQNR INT8 vs FP32: {_db(evaluation.output_sqnr_db)}",
        "",
        "  most sensitive layers (output SQNR with the layer left in float):",
    ]
    for unit in worst:
        lines.append(f"    {unit.rank}. {unit.name:<24} {_db(unit.value)}")
    lines += ["", f"  exported: {export.summary()}"]
    return {
        "project": str(path),
        "onnx": export.path,
        "fp32_top1": evaluation.fp32,
        "int8_top1": evaluation.int8,
        "output_sqnr_db": evaluation.output_sqnr_db,
        "calibration": {"method": calibration.method, "batches": calibration.num_batches,
                        "warnings": calibration.warnings},
        "sensitivity": [{"rank": u.rank, "unit": u.name, "value": u.value} for u in profile.ranked()],
        "export": {"max_abs_diff": export.max_abs_diff, "cosine": export.cosine,
                   "quantize_nodes": export.quantize_nodes, "dequantize_nodes": export.dequantize_nodes,
                   "exporter": export.exporter},
        "text": "\n".join(lines),
    }


def _db(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.1f} dB"
