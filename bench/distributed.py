"""Scaling out: calibration and sensitivity in 1 and N local processes, and a ~600M-parameter model on CPU.

Part 1 (always): a ResNet-18-like model, the same batches, run through the elastic launcher
(workbench.launcher.launch) with 1 process (all cores as threads) and with N processes (gloo, an
equal share of the cores each). For each job it prints

  job s        the job itself inside the workers (rank 0, from the start of the job to the merged result;
               process start, imports and model building not included)
  launch s     the whole launch as a user waits for it (process start and model building included)
  speed-up     1-process time / N-process time, against one process with one thread (what each worker
               has) and with every core as threads (goal: sensitivity job >= 1.7x with 2)
  same result  whether the amax (or sensitivity ranking and values) equal the 1-process, 1-thread ones

Part 2 (--big): a decoder-style transformer of about 600M parameters with random weights, built
here, calibrated on CPU in a fresh process; it prints the model's fp32 size, the peak RSS (goal:
<= 3x the fp32 size) and the export (ONNX with external data when the exporter supports it; "n/a"
otherwise, never an invented figure).

    python bench/distributed.py [--workers 2] [--batches 8] [--batch-size 8] [--big] [--big-only]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn

from workbench import quant
from workbench.analysis import sensitivity
from workbench.launcher import launch
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.distributed import init_from_env
from workbench.quant.tensor_quant import QuantDescriptor
from workbench.sources.demo import resnet18_like


def _batches(count: int, size: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(size, 3, 64, 64, generator=generator) for _ in range(count)]


def _model(calibrated: bool, batches: list[torch.Tensor]) -> nn.Module:
    torch.manual_seed(0)
    model = resnet18_like(num_classes=100, width=32).eval()
    quant.replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    if calibrated:
        calibrate(model, batches, num_batches=None, method="max", report_sqnr=False)
    return model


def job(kind: str, count: int, size: int) -> dict:
    """One worker's part of a calibration or sensitivity job; rank 0 returns the timing and the result."""
    context = init_from_env()
    try:
        batches = _batches(count, size)
        model = _model(kind == "sensitivity", batches)
        started = time.perf_counter()
        if kind == "calibration":
            result = calibrate(model, batches, num_batches=None, method="entropy", report_sqnr=False,
                               context=context)
            outcome = {name: item.amax.tolist() for name, item in result.quantizers.items()}
        else:
            result = sensitivity(model, batches, "sqnr", scheme="one-off", context=context)
            outcome = [(u.name, u.rank, u.value) for u in result.units]
        return {"job_s": time.perf_counter() - started, "outcome": outcome, "world_size": context.world_size,
                "threads": torch.get_num_threads()}
    finally:
        context.close()


def _same(kind: str, a, b) -> bool:
    if kind == "calibration":
        return a == b
    return [(n, r) for n, r, _ in a] == [(n, r) for n, r, _ in b] and all(
        math.isclose(x, y, rel_tol=1e-6) or x == y for (_, _, x), (_, _, y) in zip(a, b))


def scaling(workers: int, count: int, size: int) -> None:
    cores = len(os.sched_getaffinity(0))
    print(f"ResNet-18-like (width 32, 64x64), {count} batches of {size}; 1 vs {workers} processes on {cores} cores "
          f"(load average before: {os.getloadavg()[0]:.1f})")
    print(f"{'job':<12} {'procs':>5} {'threads':>7} {'job s':>8} {'launch s':>9} {'job speed-up':>26} "
          f"{'launch speed-up':>16} {'same result':>12}")
    # two one-process baselines: one thread (what each of the N workers has) and every core as threads
    configs = [(1, 1), (1, cores), (workers, max(1, cores // workers))]
    for kind in ("calibration", "sensitivity"):
        rows = []
        for nprocs, threads in configs:
            started = time.perf_counter()
            result = launch(job, (kind, count, size), nprocs=nprocs, threads=threads)
            rows.append((nprocs, result, time.perf_counter() - started))
        (_, one_thread, _), (_, one, one_launch) = rows[0], rows[1]
        for index, (nprocs, result, wall) in enumerate(rows):
            last = index == len(rows) - 1
            ratios = (f"{one_thread['job_s'] / result['job_s']:.2f}x vs 1x1, {one['job_s'] / result['job_s']:.2f}x "
                      f"vs 1x{cores}") if last else ""
            launch_ratio = f"{one_launch / wall:.2f}x" if last else ""
            same = str(_same(kind, rows[0][1]["outcome"], result["outcome"])) if index else ""
            print(f"{kind:<12} {nprocs:>5} {result['threads']:>7} {result['job_s']:>8.2f} {wall:>9.2f} "
                  f"{ratios:>26} {launch_ratio:>16} {same:>12}")


# ----- part 2: a ~600M-parameter transformer on CPU ---------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block written with Linear layers, so every projection is quantized."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // self.heads), dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class BigTransformer(nn.Module):
    def __init__(self, width: int = 1536, depth: int = 21, heads: int = 16, vocab: int = 8192) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class _RssSampler:
    """Samples /proc/self/status every 50 ms and keeps the largest RSS with its parts: anonymous memory
    (tensors, arenas) and mapped files (libraries, onnxruntime's mapped external data)."""

    def __init__(self) -> None:
        self.peak = (0, 0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            fields = {}
            with open("/proc/self/status") as status:
                for line in status:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "RssAnon", "RssFile"):
                        fields[key] = int(value.split()[0]) * 1024
            sample = (fields.get("VmRSS", 0), fields.get("RssAnon", 0), fields.get("RssFile", 0))
            if sample[0] > self.peak[0]:
                self.peak = sample
            self._stop.wait(0.05)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def big_model(width: int, depth: int) -> None:
    """Build, calibrate and (where supported) export the ~600M model in this process; print a table."""
    torch.manual_seed(0)
    with torch.no_grad():
        model = BigTransformer(width, depth).eval()
    params = sum(p.numel() for p in model.parameters())
    size = params * 4
    baseline = _peak_rss_bytes()
    quant.replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 8192, (1, 32), generator=generator) for _ in range(2)]
    started = time.perf_counter()
    result = calibrate(model, batches, num_batches=None, method="percentile", report_sqnr=True)
    calib_s = time.perf_counter() - started
    calib_peak = _peak_rss_bytes()
    gib = 2 ** 30
    print(f"\nBig model: {params / 1e6:.0f}M parameters, fp32 size {size / gib:.2f} GiB "
          f"(RSS after building {baseline / gib:.2f} GiB)")
    print(f"{'step':<12} {'time s':>8} {'peak RSS GiB':>13} {'RSS / fp32 size':>16}")
    print(f"{'calibrate':<12} {calib_s:>8.1f} {calib_peak / gib:>13.2f} {calib_peak / size:>15.2f}x"
          f"   ({len(result.quantizers)} quantizers, output SQNR {result.output_sqnr_db:.1f} dB)", flush=True)
    sampler = _RssSampler() if os.path.exists("/proc/self/status") else None
    try:
        with sampler or contextlib.nullcontext():
            export = _export_big(model, batches[0])
    except Exception as error:  # reported as it is: the figure is the failure, not an invented number
        print(f"{'export':<12} {'failed':>8}   {type(error).__name__}: {str(error).splitlines()[0]}")
        return
    peak = _peak_rss_bytes()
    if export is None:
        print(f"{'export':<12} {'n/a':>8} {'n/a':>13} {'n/a':>16}   (this exporter writes no external data)")
    else:
        seconds, total_bytes, files, external, cosine = export
        print(f"{'export':<12} {seconds:>8.1f} {peak / gib:>13.2f} {peak / size:>15.2f}x   "
              f"({total_bytes / gib:.2f} GiB in {files} files, external data: {external}; onnxruntime vs "
              f"PyTorch cosine {cosine:.6f})")
        if sampler is not None and sampler.peak[0]:
            rss, anon, mapped = sampler.peak
            print(f"{'':<12} at the export's sampled peak ({rss / gib:.2f} GiB): {anon / gib:.2f} GiB anonymous "
                  f"(PyTorch's model, arenas), {mapped / gib:.2f} GiB mapped files (libraries, onnxruntime's "
                  "external data)")
    print(f"goal: peak RSS <= 3x fp32 size: {'met' if peak <= 3 * size else 'NOT met'} ({peak / size:.2f}x)")


def _export_big(model: nn.Module, tokens: torch.Tensor):
    """Export (ONNX with external data over 2 GB, validated with onnxruntime); None if the exporter has no
    external data."""
    import inspect

    from workbench.export.onnx_export import export_qdq_onnx

    if "external_data_threshold" not in inspect.signature(export_qdq_onnx).parameters:
        return None
    with tempfile.TemporaryDirectory(prefix="bench-big-export-") as folder:
        path = Path(folder) / "big.onnx"
        started = time.perf_counter()
        # the default opset (17): the graph is converted without its weights, which stay in external data
        report = export_qdq_onnx(model, tokens, path, dynamic_batch=False)  # checker + onnxruntime
        print(f"export: opset {report.opset}, {report.quantize_nodes} Q / {report.dequantize_nodes} DQ nodes; "
              + "; ".join(report.warnings), flush=True)
        seconds = time.perf_counter() - started
        files = list(Path(folder).iterdir())
        return (seconds, sum(f.stat().st_size for f in files), len(files), report.external_data_path is not None,
                report.cosine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--big", action="store_true", help="also the ~600M-parameter model (minutes)")
    parser.add_argument("--big-only", action="store_true", help="only the big model, in this process")
    parser.add_argument("--big-width", type=int, default=1536, help="the big model's width (1536: ~600M)")
    parser.add_argument("--big-depth", type=int, default=21, help="its number of blocks")
    args = parser.parse_args()
    if args.big_only:
        big_model(args.big_width, args.big_depth)
        return
    scaling(args.workers, args.batches, args.batch_size)
    if args.big:  # a fresh process, so that its peak RSS is the big model's alone
        subprocess.run([sys.executable, __file__, "--big-only", "--big-width", str(args.big_width),
                        "--big-depth", str(args.big_depth)], check=True)


if __name__ == "__main__":
    main()
