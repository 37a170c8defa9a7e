"""The GPU figures bench/gpu_check.sh collects, one step per call, as table rows on stdout.

Each step prints lines ``ROW|step|case|value|target`` (gpu_check.sh turns them into one table) and
reuses the CPU benchmarks' own measuring code with ``device=cuda``, so a GPU figure means what the
CPU figure of the same name means. No Qt, no project files.

    python bench/gpu_bench.py fake-quant|calibration|sensitivity|export [--device cuda] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def row(step: str, case: str, value: str, target: str = "") -> None:
    print(f"ROW|{step}|{case}|{value}|{target}", flush=True)


def fake_quant(device: torch.device, repeats: int) -> None:
    import fake_quant as bench

    for r in bench.run(device, repeats):
        row("fake-quant fwd", r["case"], f"{r['ours/clone']:.2f}x clone ({r['ours_ms']:.3f} ms)", "<= 2x clone")
    for r in bench.run_training(device, repeats):
        row("fake-quant fwd+bwd", r["case"], f"{r['fwd+bwd/clone']:.2f}x clone; bwd {r['torch-bwd/bwd']:.2f}x "
            "faster than torch ops", "<= 2.5x clone")


def calibration(device: torch.device, repeats: int) -> None:
    import copy

    from workbench.quant import QuantDescriptor, replace_to_quantization_module
    from workbench.quant.algorithms.calibrate import calibrate
    from workbench.sources.demo import resnet18_like

    torch.manual_seed(0)
    model = resnet18_like().to(device).eval()
    batches = [torch.randn(32, 3, 64, 64, device=device) for _ in range(8)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for method in ("max", "histogram"):
        quantized = copy.deepcopy(model)
        replace_to_quantization_module(quantized, quant_desc_input=QuantDescriptor(calib_method=method))
        amax_method = "max" if method == "max" else "entropy"

        def forward() -> None:
            with torch.no_grad():
                for batch in batches:
                    model(batch)
            sync()

        calibrate(quantized, batches, num_batches=None, method=amax_method, report_sqnr=False)  # warm up
        forward()
        fp32, collect = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            forward()
            fp32.append(time.perf_counter() - start)
            result = calibrate(quantized, batches, num_batches=None, method=amax_method, report_sqnr=False)
            sync()
            collect.append(result.collect_time_s)
        ratio = statistics.median(collect) / statistics.median(fp32)
        row("calibration", f"ResNet-18-like 8x32x3x64x64, {method} calibrators", f"{ratio:.2f}x FP32 pass "
            f"({statistics.median(collect) * 1e3:.0f} ms)", "<= 1.5x")


def sensitivity(device: torch.device, repeats: int) -> None:
    import sensitivity as bench

    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(16, 3, 64, 64, generator=generator).to(device) for _ in range(4)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = bench.prepare(bench.resnet18_like(num_classes=100), batches, device)
    for r in bench.bench("resnet18-like", model, batches, repeats, sync, schemes=("one-off",)):
        row("sensitivity", f"ResNet-18-like {r['scheme']}, {r['units']} units",
            f"cached {r['cached/Npass']:.2f} / plain {r['plain/Npass']:.2f} of N passes, identical "
            f"{r['identical']}", "cached <= 0.5")


def export(device: torch.device, repeats: int) -> None:
    import export_speed as bench

    r = bench.export_time(repeats, device, exporters=("auto",))  # the default path only: the step has 90 s
    row("export", f"ResNet-18-like from {device.type} ({r['exporter']})",
        f"{r['ratio']:.2f}x proxy ({r['ours_s']:.1f} s vs {r['proxy_s']:.1f} s)", "<= 1.5x ModelOpt proxy")


STEPS = {"fake-quant": fake_quant, "calibration": calibration, "sensitivity": sensitivity, "export": export}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        row(args.step, "-", "no GPU: skipped")
        return
    STEPS[args.step](device, args.repeats)


if __name__ == "__main__":
    main()
