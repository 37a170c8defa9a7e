"""Export time and peak memory, as ratios measured in one run.

1. Time: ``export_qdq_onnx`` (capture, Q/DQ, checker, onnxruntime parity with dynamic-batch, sequence and
   range checks), the default ("auto": the TorchScript fast path for this CNN) and each exporter asked for
   (torch.export-based, TorchScript), over the proxy for Model Optimizer's export of the same fake-quant model. Model
   Optimizer cannot be installed here, so the proxy is what its ``export_onnx`` does: plain
   ``torch.onnx.export`` of the model with torch's native fake-quant operators (which export as
   QuantizeLinear/DequantizeLinear), then ``onnx.checker`` and one onnxruntime run. Target <= 1.5x.
   Both are timed interleaved; each row is the median.
2. Memory: peak resident memory of one export in a fresh process, over the fp32 model's size, for
   models of several sizes (a stack of quantized Linear layers). Peak (the kernel's VmHWM, reset before
   the model is built) minus the process's memory before the model was built (after a warm-up export of
   a tiny model, so that imports and the exporter's caches are not counted); the model itself is part of
   it. Target <= 3x at every size. The fixed overhead of an export (a second tiny model's peak) is shown
   too, with (peak - fixed) / size: the part that grows with the model. ``--exporter dynamo,torchscript``
   measures each size with each exporter (each in its own fresh process); the default, ``auto``, is what
   ``export_qdq_onnx`` picks.

    python bench/export_speed.py [--repeats 3] [--sizes 40,160] [--exporter auto|dynamo|torchscript,...]
                                 [--skip-memory] [--skip-time] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

# this checkout's workbench (the script's folder is first on the path, not the repository's root)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.export import export_qdq_onnx  # noqa: E402
from workbench.quant import replace_to_quantization_module  # noqa: E402
from workbench.quant.algorithms.calibrate import calibrate  # noqa: E402
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer  # noqa: E402
from workbench.sources.demo import resnet18_like  # noqa: E402


def quantized_resnet(device: torch.device) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = resnet18_like(num_classes=100).to(device).eval()
    replace_to_quantization_module(model)
    batches = [torch.randn(4, 3, 64, 64, device=device) for _ in range(2)]
    calibrate(model, batches, num_batches=None, method="max", report_sqnr=False)
    return model, batches[0]


def proxy_export(model: nn.Module, sample: torch.Tensor, path: str) -> None:
    """Model Optimizer's way: torch's fake-quant operators exported as Q/DQ, then check and run the file."""
    import onnx
    import onnxruntime

    TensorQuantizer.use_fb_fake_quant = True
    try:
        with torch.no_grad():
            torch.onnx.export(model, (sample,), path, opset_version=17, input_names=["input"], output_names=["output"],
                              dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, dynamo=False)
    finally:
        TensorQuantizer.use_fb_fake_quant = False
    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    session.run(None, {"input": sample.cpu().numpy()})


def export_time(repeats: int, device: torch.device,
                exporters: tuple[str, ...] = ("auto", "dynamo", "torchscript")) -> dict:
    """export_qdq_onnx with each of ``exporters`` ("auto": the default, which takes the TorchScript fast path for
    this CNN; "dynamo": the torch.export-based exporter asked for; "torchscript": asked for) and the proxy,
    interleaved; medians. ``ratio``/``ours_s``: the default's."""
    model, sample = quantized_resnet(device)
    runs: dict[str, list[float]] = {"proxy": []}
    reports = {}
    with tempfile.TemporaryDirectory() as folder:
        ours_path, proxy_path = str(Path(folder) / "ours.onnx"), str(Path(folder) / "proxy.onnx")
        for exporter in exporters:  # warm up every path (imports, registries)
            export_qdq_onnx(copy.deepcopy(model), sample, ours_path, exporter=exporter)
        proxy_export(copy.deepcopy(model), sample, proxy_path)
        for _ in range(repeats):
            for exporter in exporters:
                start = time.perf_counter()
                report = export_qdq_onnx(model, sample, ours_path, exporter=exporter)
                runs.setdefault(exporter, []).append(time.perf_counter() - start)
                reports[exporter] = report
            start = time.perf_counter()
            proxy_export(model, sample, proxy_path)
            runs["proxy"].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    default = "auto" if "auto" in medians else exporters[0]
    return {"proxy_s": medians["proxy"], "ours_s": medians[default], "exporter": reports[default].exporter,
            "ratio": medians[default] / medians["proxy"],
            "paths": [{"requested": name, "exporter": reports[name].exporter, "default": name == default,
                       "seconds": medians[name], "ratio": medians[name] / medians["proxy"],
                       "export_s": reports[name].export_time_s, "validation_s": reports[name].validation_time_s}
                      for name in exporters]}


class Stack(nn.Module):
    """Linear layers of one width: parameters grow with depth, activations stay tiny."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])

    def forward(self, x):
        return self.layers(x)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Start the kernel's peak-RSS record (VmHWM) afresh at the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def tiny_export(folder: str, name: str, exporter: str = "auto") -> None:
    warm = Stack(64, 1).eval()
    replace_to_quantization_module(warm)
    calibrate(warm, [torch.randn(2, 64)], num_batches=None, method="max", report_sqnr=False)
    export_qdq_onnx(warm, torch.randn(2, 64), Path(folder) / name, exporter=exporter)


def memory_child(megabytes: int, exporter: str = "auto") -> dict:
    """Runs in a fresh process: build a model of about ``megabytes`` MB, export it, report the peak.

    First a tiny model is exported twice: the first run pays the imports and the exporter's caches (not
    counted); the second one's peak over the memory before it is the fixed overhead of an export (tracing,
    onnxruntime's session, buffers that do not grow with the model), reported so that the part that grows
    with the model can be read apart from it."""
    torch.manual_seed(0)
    width = 2048
    with tempfile.TemporaryDirectory() as folder:
        tiny_export(folder, "warm.onnx", exporter)
        before = rss_bytes()
        reset_peak()
        tiny_export(folder, "tiny.onnx", exporter)
        fixed = peak_bytes() - before
    before = rss_bytes()
    reset_peak()
    depth = max(1, round(megabytes * 2**20 / (4 * width * (width + 1))))
    with torch.no_grad():
        model = Stack(width, depth).eval()
        replace_to_quantization_module(model)
        sample = torch.randn(2, width)
    calibrate(model, [sample], num_batches=None, method="max", report_sqnr=False)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        report = export_qdq_onnx(model, sample, Path(folder) / "model.onnx", exporter=exporter)
        seconds = time.perf_counter() - start
    peak = peak_bytes()
    return {"size": size, "peak_over_before": peak - before, "ratio": (peak - before) / size, "seconds": seconds,
            "fixed": fixed, "ratio_over_fixed": (peak - before - fixed) / size,
            "exporter": report.exporter, "external": report.external_data_path is not None}


def export_memory(sizes_mb: list[int], exporter: str = "auto") -> list[dict]:
    rows = []
    for megabytes in sizes_mb:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(megabytes), "--exporter", exporter],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            rows.append({"mb": megabytes, "requested": exporter,
                         "error": (out.stderr.strip().splitlines() or ["failed"])[-1][:120]})
            continue
        rows.append({"mb": megabytes, "requested": exporter, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="40,160", help="model sizes in MB for the memory table")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--exporter", default="auto",
                        help="exporter(s) of the memory table, comma-separated: auto, dynamo, torchscript "
                             "(e.g. dynamo,torchscript measures both, each size in a fresh process)")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args.exporter)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, load average "
          + " / ".join(f"{v:.2f}" for v in os.getloadavg()))
    if not args.skip_time:
        row = export_time(args.repeats, torch.device(args.device))
        print("\n| export time (ResNet-18-like, 4x3x64x64, " + args.device + ") | time (median) | capture (last run) "
              "| validation (last run) "
              "| / proxy (target <= 1.5) |")
        print("|---|---|---|---|---|")
        labels = {"auto": "export_qdq_onnx, the default (exporter='auto')",
                  "dynamo": "export_qdq_onnx, torch.export-based exporter (exporter='dynamo')",
                  "torchscript": "export_qdq_onnx, TorchScript exporter (exporter='torchscript')"}
        for path in row["paths"]:
            label = f"{labels[path['requested']]}: used {path['exporter']}"
            print(f"| {label} | {path['seconds']:.2f} s | {path['export_s']:.2f} s | {path['validation_s']:.2f} s "
                  f"| **{path['ratio']:.2f}** |")
        print(f"| proxy: torch.onnx.export + onnx.checker + onnxruntime run | {row['proxy_s']:.2f} s | | | 1 |")
    if not args.skip_memory:
        exporters = [e.strip() for e in args.exporter.split(",") if e.strip()]
        unknown = [e for e in exporters if e not in ("auto", "dynamo", "torchscript")]
        if unknown:
            parser.error(f"--exporter takes auto, dynamo or torchscript, got {', '.join(unknown)}")
        print("\n| model size | requested exporter | export peak memory | peak / size (target <= 3) "
              "| fixed overhead (tiny model's export) | (peak - fixed) / size | exporter used | external data | time |")
        print("|---|---|---|---|---|---|---|---|---|")
        for megabytes in [int(s) for s in args.sizes.split(",")]:
            for exporter in exporters:
                for row in export_memory([megabytes], exporter):
                    if "error" in row:
                        print(f"| {row['mb']} MB | {exporter} | failed: {row['error']} | | | | | | |")
                        continue
                    print(f"| {row['size'] / 2**20:.0f} MB | {exporter} | {row['peak_over_before'] / 2**20:.0f} MB | "
                          f"**{row['ratio']:.2f}** | {row['fixed'] / 2**20:.0f} MB | {row['ratio_over_fixed']:.2f} | "
                          f"{row['exporter']} | {row['external']} | {row['seconds']:.1f} s |", flush=True)

if __name__ == "__main__":
    main()
