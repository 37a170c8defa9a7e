"""Speed of sensitivity analysis, as ratios measured in this one run (medians over interleaved repeats).

For each model and scheme it prints:
  units             N, the number of units (quantized layers) profiled
  pass ms           one full evaluation pass: the all-quantized model over the batches, metric included
  plain / N·pass    wall time of a plain-loop profile over N x (one pass); the FP32 reference and
                    all-quantized passes are part of the profile (target <= 1.1 on ResNet-18-like)
  cached / N·pass   the same with cached activations (each pass starts at its unit)
  speed-up          plain time / cached time (target >= 1.5 for one-on on a sequential-style CNN)
  identical         whether the cached profile's numbers equal the plain loop's, bit for bit

    python bench/sensitivity.py [--repeats 3] [--device cpu|cuda] [--batches 4] [--batch-size 8] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from workbench import quant
from workbench.analysis import get_metric, sensitivity
from workbench.analysis.evaluator import Evaluator
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.sources.demo import randomize_batchnorm, resnet18_like


def vgg16_like(width: int = 16, num_classes: int = 100) -> nn.Sequential:
    """A sequential-style CNN with VGG-16's layout (13 conv-bn-relu in 5 stages, 3 linear layers), narrower."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    channels = 3
    for stage, count in enumerate((2, 2, 3, 3, 3)):
        out = width * 2 ** min(stage, 3)
        for _ in range(count):
            layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                       nn.ReLU(inplace=True)]
            channels = out
        layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 4 * channels), nn.ReLU(inplace=True),
               nn.Linear(4 * channels, 4 * channels), nn.ReLU(inplace=True), nn.Linear(4 * channels, num_classes)]
    model = nn.Sequential(*layers).eval()
    randomize_batchnorm(model)  # trained-looking BatchNorm statistics, as resnet18_like has
    return model


def prepare(model: nn.Module, batches: list[torch.Tensor], device: torch.device) -> nn.Module:
    model = model.to(device).eval()
    quant.replace_to_quantization_module(model)
    calibrate(model, batches, num_batches=None, method="max", report_sqnr=False)
    return model


def one_pass(model: nn.Module, batches: list[torch.Tensor], sync) -> float:
    """Seconds of one evaluation pass of the all-quantized model with the metric (SQNR against FP32)."""
    with ModelSnapshot(model), torch.no_grad():
        evaluator = Evaluator(model, batches, get_metric("sqnr"))
        evaluator.measure_fp32()  # the reference outputs, not timed
        sync()
        start = time.perf_counter()
        evaluator.measure_quantized()
        sync()
        return time.perf_counter() - start


def profile(model, batches, scheme, cache, sync):
    sync()
    start = time.perf_counter()
    result = sensitivity(model, batches, "sqnr", scheme=scheme, cache=cache)
    sync()
    return time.perf_counter() - start, result


def bench(name: str, model: nn.Module, batches: list[torch.Tensor], repeats: int, sync,
          schemes: tuple[str, ...] = ("one-off", "one-on")) -> list[dict]:
    """Each profile is timed between two evaluation passes and compared with their mean, and each cached
    profile right after its plain twin, so that load changing on a shared machine cancels out of the ratios."""
    one_pass(model, batches, sync)  # warm up kernels and the allocator
    rows = []
    for scheme in schemes:
        passes, plain_ratio, cached_ratio, speedup = [], [], [], []
        identical = True
        for _ in range(repeats):
            before = one_pass(model, batches, sync)
            plain_s, plain = profile(model, batches, scheme, False, sync)
            cached_s, cached = profile(model, batches, scheme, True, sync)
            after = one_pass(model, batches, sync)
            pass_s = (before + after) / 2
            n = len(plain.units)
            passes.append(pass_s)
            plain_ratio.append(plain_s / (n * pass_s))
            cached_ratio.append(cached_s / (n * pass_s))
            speedup.append(plain_s / cached_s)
            identical &= ([(u.name, u.value) for u in plain.units] == [(u.name, u.value) for u in cached.units]
                          and (plain.fp32, plain.quantized) == (cached.fp32, cached.quantized))
        median = statistics.median
        rows.append({"model": name, "scheme": scheme, "units": n, "pass_ms": median(passes) * 1e3,
                     "plain/Npass": median(plain_ratio), "cached/Npass": median(cached_ratio),
                     "speedup": median(speedup), "identical": identical, "cache": cached.cache})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="input height and width")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(args.batch_size, 3, args.size, args.size, generator=generator).to(device)
               for _ in range(args.batches)]
    models = {
        "resnet18-like": prepare(resnet18_like(num_classes=100), batches, device),
        "vgg16-like sequential": prepare(vgg16_like(), batches, device),
    }
    print(f"device {device.type}, {args.batches} batches of {args.batch_size}x3x{args.size}x{args.size}, "
          f"metric SQNR, median of {args.repeats} runs, torch {torch.__version__}, {torch.get_num_threads()} threads")
    header = (f"{'model':<22} {'scheme':<8} {'units':>5} {'pass ms':>9} {'plain/N·pass':>13} "
              f"{'cached/N·pass':>14} {'speed-up':>9} {'identical':>9}  cache")
    print(header)
    print("-" * len(header))
    for name, model in models.items():
        for row in bench(name, model, batches, args.repeats, sync):
            print(f"{row['model']:<22} {row['scheme']:<8} {row['units']:>5} {row['pass_ms']:>9.1f} "
                  f"{row['plain/Npass']:>13.3f} {row['cached/Npass']:>14.3f} {row['speedup']:>8.2f}x "
                  f"{str(row['identical']):>9}  {row['cache']}")


if __name__ == "__main__":
    main()
