"""Saving and reopening a project of a calibrated ResNet-50-sized model (target: each under 1 s).

The model is built in code (random weights); every quantizer, weights included (per tensor), uses a
histogram calibrator, with QuantAdd quantizers on both inputs of every residual add (the residual rule
off), and one calibration batch gives every quantizer its statistics. Then the project is saved and
reopened (which rebuilds the model from its source and restores amax and histograms without
recalibrating).

    python bench/project_io.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from workbench.project import load_project
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="qwb-bench-"))
    np.save(folder / "calib.npy", np.random.default_rng(0).normal(size=(2, 3, 64, 64)).astype(np.float32))
    session = Session.create(ModelSpec("demo", "resnet50"), DataSpec("tensors", str(folder / "calib.npy"),
                                                                     batch_size=2), base_dir=folder,
                             settings={"defaults": {"input": {"calib_method": "histogram"},
                                                    "weight": {"calib_method": "histogram"}},
                                       "rules": {"concat": True, "maxpool": True, "residual": False}})
    session.calibrate(method="max", num_batches=1)
    quantizers = len(session.project.current_calibration.quantizers)
    histograms = sum(1 for q in session.project.current_calibration.quantizers.values()
                     if q.calibrator == "HistogramCalibrator")
    path = folder / "resnet50.qwb"

    save_times, load_times, open_times = [], [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        session.save(path)
        save_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        load_project(path)
        load_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        reopened = Session.open(path)
        open_times.append(time.perf_counter() - start)
    restored = len(reopened.build_report.restored)
    same = all(torch.equal(a, b) for a, b in zip(
        (q._amax for q in session.quantized_model().modules() if hasattr(q, "_amax")),
        (q._amax for q in reopened.quantized_model().modules() if hasattr(q, "_amax"))))

    print(f"torch {torch.__version__}; ResNet-50-like: {sum(p.numel() for p in session.float_model.parameters()):,} "
          f"parameters, {quantizers} quantizer names ({histograms} with histograms)")
    print(f"\n| operation (median of {args.repeats}) | time | target |")
    print("|---|---|---|")
    print(f"| save project ({path.stat().st_size / 2**20:.1f} MB file) | {statistics.median(save_times) * 1e3:.0f} ms "
          "| < 1 s |")
    print(f"| read project file | {statistics.median(load_times) * 1e3:.0f} ms | |")
    print(f"| reopen (read + rebuild model + restore calibration) | {statistics.median(open_times) * 1e3:.0f} ms "
          "| < 1 s |")
    print(f"| quantizers restored without recalibrating | {restored} | all |")
    print(f"| amax identical after reopening | {same} | True |")
    _integrity_overhead(session, path, args.repeats, statistics.median(save_times), statistics.median(load_times))


def _integrity_overhead(session: Session, path: Path, repeats: int, save_s: float, load_s: float) -> None:
    """What the two-writer check and the content checksum cost: the same save and read with both off."""
    from workbench.project import store

    checksums, digests = store.content_checksums, store.digests
    store.content_checksums = lambda db: {}
    store.digests = lambda project: {}
    store_check, store.check_content = store.check_content, lambda db, path: None
    try:
        bare_save, bare_load = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            session.save(path)
            bare_save.append(time.perf_counter() - start)
            start = time.perf_counter()
            load_project(path)
            bare_load.append(time.perf_counter() - start)
    finally:
        store.content_checksums, store.digests, store.check_content = checksums, digests, store_check
    print("\n| with revision digests and checksum, over without (same run) | ratio |")
    print("|---|---|")
    print(f"| save | {save_s / statistics.median(bare_save):.2f}x |")
    print(f"| read | {load_s / statistics.median(bare_load):.2f}x |")


if __name__ == "__main__":
    main()
