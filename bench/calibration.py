"""Speed and memory of calibration, as ratios measured in one run.

1. Collection overhead: the histogram-calibration pass over N batches (calibrate()'s collection) over a
   plain FP32 forward over the same batches, on a ResNet-18-like network built in code (input
   16x3x64x64). Target: at most 1.5 on CPU. Also shown: the whole calibrate() call, amax included.
2. amax computation for one 2048-bin histogram: the vectorised searches against straightforward
   one-candidate-per-iteration implementations of the same algorithms (same answers). Target: entropy
   and mse at least 50x faster.
3. Memory held by 200 histogram calibrators after collecting. Target: under 50 MB.
4. Histogram collection on a ViT-like model (tests/transformers/models.py, 192d, 4 blocks, 65 tokens,
   attention inputs quantized by prepare_for_tensorrt) over an FP32 pass. Target: at most 1.15. The
   same run also times the previous "max first" collection (a max pass, then the histogram pass, for
   every batch) and checks that both give the same histograms.

    python bench/calibration.py [--batches 8] [--repeats 5] [--threads N] [--only vit ...]

``--threads 1`` measures both sides on one thread: on a loaded machine a second thread makes the FP32
pass (and so every ratio) swing by several times. ``--clock cpu`` (with ``--threads 1``) times with the
process's CPU time instead of the wall clock, which other jobs on a shared machine do not inflate.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import workbench.quant.algorithms.calibrate as calibrate_module
from workbench.quant import QuantDescriptor, replace_to_quantization_module
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.calib import HistogramCalibrator, histogram, reference
from workbench.sources.demo import resnet18_like

clock = time.perf_counter  # --clock cpu: time.process_time, here and in calibrate()'s own timings


class _CalibrateClock:
    """Stands in for the time module inside calibrate(), so that its collect_time_s uses the bench's clock."""

    @staticmethod
    def perf_counter() -> float:
        return clock()


def median_time(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples)


def collection_overhead(num_batches: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = resnet18_like()
    batches = [torch.randn(16, 3, 64, 64) for _ in range(num_batches)]
    quantized = copy.deepcopy(model)
    replace_to_quantization_module(quantized, quant_desc_input=QuantDescriptor(calib_method="histogram"))

    def forward() -> None:
        with torch.no_grad():
            for batch in batches:
                model(batch)

    def calibration():
        return calibrate(quantized, batches, num_batches=num_batches, method="entropy", report_sqnr=False)

    forward()
    calibration()
    forward_times, collect_times, calib_times = [], [], []
    for _ in range(repeats):  # interleaved, so that machine noise hits both alike
        start = clock()
        forward()
        forward_times.append(clock() - start)
        start = clock()
        result = calibration()
        calib_times.append(clock() - start)
        collect_times.append(result.collect_time_s)
    fp32 = statistics.median(forward_times)
    collect, calib = statistics.median(collect_times), statistics.median(calib_times)
    quantizers = sum(1 for m in quantized.modules() if type(m).__name__ == "TensorQuantizer")
    return {"fp32_s": fp32, "collect_s": collect, "calib_s": calib, "ratio": collect / fp32,
            "total_ratio": calib / fp32, "quantizers": quantizers}


def vit_histogram_overhead(num_batches: int, repeats: int) -> dict:
    """Collection with histogram input calibrators on a ViT-like model over an FP32 pass; the one-pass
    kernel against the max-first collection it replaced (same histograms, checked)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "transformers"))
    import models as zoo

    from workbench.graph import prepare_for_tensorrt
    from workbench.quant.algorithms.snapshot import all_quantizers

    torch.manual_seed(0)
    model = zoo.ViTLike(192, 4, 3, False, image=64, patch=8).eval()
    batches = [(zoo.images(8, 64, seed=i),) for i in range(num_batches)]
    quantized, _ = prepare_for_tensorrt(copy.deepcopy(model), example_inputs=batches[0],
                                        quant_desc_input=QuantDescriptor(calib_method="histogram"))
    one_pass = HistogramCalibrator._collect_cpu

    def max_first(self, x, *rest):  # the previous collection: every batch's max in a pass of its own, then the bins
        self._widen_to(self._batch_max(x), torch.device("cpu"))
        return one_pass(self, x, *rest)

    def forward() -> None:
        with torch.no_grad():
            for batch in batches:
                model(*batch)

    def collect(previous: bool) -> tuple[float, list]:
        HistogramCalibrator._collect_cpu = max_first if previous else one_pass
        try:
            result = calibrate(quantized, batches, num_batches=None, method="entropy", report_sqnr=False)
        finally:
            HistogramCalibrator._collect_cpu = one_pass
        calibrators = [getattr(q, "_calibrator", None) for q in all_quantizers(quantized)]
        hists = [c._counts.clone() for c in calibrators if isinstance(c, HistogramCalibrator) and c._counts is not None]
        return result.collect_time_s, hists

    forward()
    _, new_hists = collect(False)
    _, old_hists = collect(True)
    same = len(new_hists) == len(old_hists) and all(torch.equal(a, b) for a, b in zip(new_hists, old_hists))
    fp32_times, new_times, old_times = [], [], []
    for _ in range(repeats):  # interleaved, so that machine noise hits all three alike
        start = clock()
        forward()
        fp32_times.append(clock() - start)
        new_times.append(collect(False)[0])
        old_times.append(collect(True)[0])
    fp32, new, old = (statistics.median(t) for t in (fp32_times, new_times, old_times))
    return {"fp32_s": fp32, "collect_s": new, "previous_s": old, "ratio": new / fp32, "previous_ratio": old / fp32,
            "histograms": len(new_hists), "same": same}


def amax_speed(repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    calibrator = HistogramCalibrator(8, None, False)
    calibrator.collect(torch.from_numpy(rng.standard_t(3, size=500_000).astype(np.float32)))
    hist = calibrator.calib_hist.numpy()
    edges = calibrator.calib_bin_edges.double().numpy()
    rows = []
    for method, fast, slow in (
        ("entropy", lambda: histogram.amax_entropy(hist, edges, 8, False),
         lambda: reference.entropy_reference(hist, edges, 8, False)),
        ("mse", lambda: histogram.amax_mse(hist, edges, 8, False),
         lambda: reference.mse_reference(hist, edges, 8, False)),
        ("percentile", lambda: histogram.amax_percentile(hist, edges, 99.99),
         lambda: reference.percentile_reference(hist, edges, 99.99)),
    ):
        fast_s = median_time(fast, max(repeats * 4, 20))
        slow_s = median_time(slow, repeats)
        rows.append({"method": method, "bins": len(hist), "fast_ms": fast_s * 1e3, "reference_ms": slow_s * 1e3,
                     "speedup": slow_s / fast_s, "same": abs(fast() - slow()) <= edges[1] - edges[0]})
    return rows


def memory_of_calibrators(count: int = 200) -> dict:
    torch.manual_seed(0)
    calibrators = []
    for i in range(count):
        calibrator = HistogramCalibrator(8, None, False)
        calibrator.collect(torch.randn(4096) * (1 + i % 7))
        calibrator.collect(torch.randn(4096) * 3 * (1 + i % 5))  # grows the range for some
        calibrators.append(calibrator)
    tensor_bytes = 0
    for calibrator in calibrators:
        for tensor in (calibrator._counts, calibrator.max_value):
            tensor_bytes += tensor.untyped_storage().nbytes()
    # Python objects around the tensors: a generous fixed allowance per calibrator
    overhead = count * 2048
    return {"calibrators": count, "tensor_mb": tensor_bytes / 2**20, "total_mb": (tensor_bytes + overhead) / 2**20}


def print_collection(batches: int, repeats: int) -> None:
    overhead = collection_overhead(batches, repeats)
    print("\n| collection (ResNet-18-like, 16x3x64x64) | value |")
    print("|---|---|")
    print(f"| batches | {batches} |")
    print(f"| quantizers | {overhead['quantizers']} |")
    print(f"| FP32 forward over the batches | {overhead['fp32_s'] * 1e3:.0f} ms |")
    print(f"| histogram collection pass | {overhead['collect_s'] * 1e3:.0f} ms |")
    print(f"| **collection / FP32 forward** (target <= 1.5) | **{overhead['ratio']:.2f}** |")
    print(f"| whole calibrate() (collection + entropy amax for every quantizer) | {overhead['calib_s'] * 1e3:.0f} ms |")
    print(f"| whole calibrate() / FP32 forward | {overhead['total_ratio']:.2f} |")


def print_amax(repeats: int) -> None:
    print("\n| amax method (one 2048-bin histogram) | fast ms | reference ms | speed-up (target >= 50) | same amax |")
    print("|---|---|---|---|---|")
    for row in amax_speed(repeats):
        print(f"| {row['method']} ({row['bins']} bins) | {row['fast_ms']:.2f} | {row['reference_ms']:.1f} | "
              f"**{row['speedup']:.0f}x** | {row['same']} |")


def print_vit(batches: int, repeats: int) -> None:
    vit = vit_histogram_overhead(batches, repeats)
    print("\n| histogram collection (ViT-like, 192d, 4 blocks, 8x3x64x64) | value |")
    print("|---|---|")
    print(f"| histogram calibrators | {vit['histograms']} |")
    print(f"| FP32 forward over the batches | {vit['fp32_s'] * 1e3:.0f} ms |")
    print(f"| **one-pass collection / FP32 forward** (target <= 1.15) | **{vit['ratio']:.2f}** |")
    print(f"| previous max-first collection / FP32 forward | {vit['previous_ratio']:.2f} |")
    print(f"| same histograms both ways | {vit['same']} |")


def print_memory() -> None:
    memory = memory_of_calibrators()
    print("\n| memory | value |")
    print("|---|---|")
    print(f"| {memory['calibrators']} histogram calibrators, tensors | {memory['tensor_mb']:.1f} MB |")
    print(f"| with a 2 KB per-object allowance (target < 50 MB) | **{memory['total_mb']:.1f} MB** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--only", nargs="+", choices=("collection", "amax", "vit", "memory"),
                        default=("collection", "amax", "vit", "memory"), help="the tables to measure")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the process's CPU time (use with --threads 1 on a shared machine)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        global clock
        clock = time.process_time
        calibrate_module.time = _CalibrateClock
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
          f"C kernels: {histogram.cpu_kernels is not None}, {args.clock} clock, code from "
          f"{Path(histogram.__file__).parents[3]}")

    if "collection" in args.only:
        print_collection(args.batches, args.repeats)
    if "amax" in args.only:
        print_amax(args.repeats)
    if "vit" in args.only:
        print_vit(args.batches, args.repeats)
    if "memory" in args.only:
        print_memory()


if __name__ == "__main__":
    main()
