"""Metric against weight bytes for each precision choice on the outlier-channel block, and what the ladder picks.

The block (workbench.sources.outliers: a LayerNorm, fc1 writing four channels ~250x the rest, fc2 reading
them) is where one layer's precision decides the block's accuracy. Each row is one way to run it, through
the session as a user would (set precisions, smooth, calibrate, export): the output SQNR against FP32
(evaluation over the calibration batches), the weight bytes of the mix (scales included) and their share
of all-float, the calibration and export wall times, and the exported ONNX against the fake-quant model in
onnxruntime (max |diff|). The ladder rows run ``Session.ladder`` (the same as ``sensitivity --ladder``).

    python bench/precision_ladder.py [--target 25]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from workbench.session import Session
from workbench.sources import outliers
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def new_session(folder: Path) -> Session:
    model = ModelSpec("entrypoint", f"{outliers.__file__}:outlier_block")
    data = DataSpec("entrypoint", f"{outliers.__file__}:calibration_batches", batch_size=8)
    session = Session.create(model, data, trust_code=True, base_dir=folder)
    session.update_setting("calibration", method="max")
    session.update_setting("metric", name="sqnr", direction=None)
    return session


def measure(name: str, folder: Path, prepare: Callable[[Session], str]) -> dict[str, str]:
    session = new_session(folder)
    started = time.perf_counter()
    detail = prepare(session)  # what the row did (precisions set, smoothing, a search)
    calibrate_s = time.perf_counter() - started
    evaluation = session.evaluate("sqnr")
    started = time.perf_counter()
    report = session.export(folder / f"{name.replace(' ', '_').replace(',', '')}.onnx", force=True)
    export_s = time.perf_counter() - started
    from workbench.quant.algorithms.precision import weight_bytes

    precisions = session.precisions()
    model = session.quantized_model()
    size = weight_bytes(model, precisions)
    full = weight_bytes(model, dict.fromkeys(precisions, None))
    mix = ", ".join(f"{layer} {p.value if p is not None else 'custom'}" for layer, p in precisions.items())
    return {"row": name, "mix": mix, "SQNR dB": f"{evaluation.output_sqnr_db:.1f}", "weight bytes": f"{size:,}",
            "of float": f"{size / full:.0%}", "prepare+calib s": f"{calibrate_s:.2f}", "export s": f"{export_s:.2f}",
            "ORT max|diff|": f"{report.max_abs_diff:.1e}", "detail": detail}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=25.0, help="the ladder's target SQNR in dB")
    args = parser.parse_args()

    def precision(mix: dict[str, str]) -> Callable[[Session], str]:
        def prepare(session: Session) -> str:
            for layer, name in mix.items():
                session.set_precision([layer], name)
            if set(mix.values()) != {"float"}:
                session.calibrate()
            return ""
        return prepare

    def smoothquant(session: Session) -> str:
        session.calibrate(smoothquant=0.5)
        return f"{len(session.project.smoothing)} layers smoothed"

    def awq(session: Session) -> str:
        session.set_precision(["fc1", "fc2"], "int4w")
        session.calibrate(awq=True)
        return ", ".join(f"{r.layer} a={r.alpha:g}" for r in session.project.smoothing.values())

    def ladder(spec: str, **goal) -> Callable[[Session], str]:
        def prepare(session: Session) -> str:
            session.calibrate()
            result = session.ladder(spec, apply=True, **goal)
            return f"{'reached' if result.reached else 'not reached'}, {len(result.steps)} mixes measured"
        return prepare

    rows = [
        ("all int8", precision({})),
        ("int8 + SmoothQuant 0.5", smoothquant),
        ("fc2 fp8, fc1 int8", precision({"fc2": "fp8"})),
        ("all fp8", precision({"fc1": "fp8", "fc2": "fp8"})),
        ("all int4w", precision({"fc1": "int4w", "fc2": "int4w"})),
        ("all int4w + AWQ", awq),
        (f"ladder int8,fp8,float -> {args.target:g} dB", ladder("int8,fp8,float", target=args.target)),
        (f"ladder int8,float -> {args.target:g} dB", ladder("int8,float", target=args.target)),
        ("ladder int4w,int8,fp8,float budget 12 kB", ladder("int4w,int8,fp8,float", budget_bytes=12_000)),
        ("all float", precision({"fc1": "float", "fc2": "float"})),
    ]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name, prepare in rows:
            results.append(measure(name, Path(folder), prepare))
    columns = ["row", "SQNR dB", "weight bytes", "of float", "prepare+calib s", "export s", "ORT max|diff|", "mix",
               "detail"]
    widths = {c: max(len(c), *(len(r[c]) for r in results)) for c in columns}
    print(" | ".join(c.ljust(widths[c]) for c in columns))
    print("-+-".join("-" * widths[c] for c in columns))
    for row in results:
        print(" | ".join(row[c].ljust(widths[c]) for c in columns))


if __name__ == "__main__":
    main()
