"""What the fused CUDA kernels actually do on this GPU: one row per kernel, dtype and layout.

For the fake-quant forward (both roundings) and the STE backward, per dtype (float32, float16, bfloat16)
and layout (per tensor; per channel on axis 0 of a (256, 64, 32, 32) weight), it prints which path the
dispatch took (the compiled kernel, or the torch reference and why), how many elements differ from the
CPU path's result (bits; NaN payloads aside) and the largest |difference|, the time per call of the
dispatch, of the reference and of a clone at 16M elements, and how many graphs dynamo holds for the
kernel (1 = no recompiles). Then the fixed cost of one small call. Rows are ``ROW|step|case|value|target``
(bench/gpu_check.sh puts them in its table). A time budget (--budget-s, default 80) skips what is left.

    python bench/cuda_diag.py [--device cuda|cpu] [--numel 16777216] [--budget-s 80]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.quant.kernels import fake_quant as kernels  # noqa: E402
from workbench.quant.kernels import (
    ste,  # noqa: E402
    triton_kernels,  # noqa: E402
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def row(case: str, value: str, target: str = "") -> None:
    print(f"ROW|cuda diag|{case}|{value}|{target}", flush=True)


def per_call_ms(fn, device: torch.device, calls: int = 20) -> float:
    """Median milliseconds per call over a few batches of ``calls`` calls (after one warm-up call)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples)


def graphs(kernel_map: dict, match) -> str:
    counts = [k.cache_entries() for key, k in kernel_map.items() if match(key)]
    counts = [c for c in counts if c is not None]
    return "/".join(str(c) for c in counts) if counts else "-"


def inputs_for(layout: str, dtype: torch.dtype, numel: int, device: torch.device):
    generator = torch.Generator().manual_seed(0)
    if layout == "per-tensor":
        x = torch.randn(numel, generator=generator)
        amax = x.abs().max()
    else:
        x = torch.randn(256, 64, max(1, numel // (256 * 64 * 32)), 32, generator=generator)
        amax = x.abs().amax(dim=(1, 2, 3), keepdim=True)
    x = x.to(dtype)
    return x, amax, x.to(device), amax.to(device)


def path_of(fused: tuple, device: torch.device) -> str:
    if device.type != "cuda":
        return f"CPU {kernels.backend_name()} kernel"
    ok, why = fused
    return f"fused ({why.split(',')[0]})" if ok else f"reference ({why})"


def settled(first: tuple, after: tuple) -> tuple:
    """The status of the timed calls: the first call's, unless the kernel was switched off while timing
    (a later layout failed to compile), which the row must say since the times are then the reference's."""
    if first[0] is True and after[0] is not True:
        return False, f"compiled for the first call, then {after[1]}"
    return after


def forward_row(name: str, dtype: torch.dtype, layout: str, rounding: str, numel: int, device: torch.device) -> None:
    x_cpu, amax_cpu, x, amax = inputs_for(layout, dtype, numel, device)
    out = kernels.quantize(x, amax, 127.0, -127.0, rounding)[0]  # first call: compiles and verifies
    status = kernels.fused_status(device, dtype, rounding, True, -127.0, 127.0)
    expected = kernels.quantize(x_cpu, amax_cpu, 127.0, -127.0, rounding)[0]
    count, largest = kernels.count_differences(out, expected)
    ours = per_call_ms(lambda: kernels.quantize(x, amax, 127.0, -127.0, rounding), device)
    status = settled(status, kernels.fused_status(device, dtype, rounding, True, -127.0, 127.0))
    reference = per_call_ms(lambda: kernels.quantize_reference(x, amax, 127.0, -127.0, rounding, True), device)
    clone = per_call_ms(lambda: x.clone(), device)
    per_tensor = layout == "per-tensor"
    count_graphs = graphs(kernels.compiled_kernels(),
                          lambda key: key[2] == dtype and key[5] == per_tensor and key[0] == (rounding == "onnx"))
    short = "pq" if rounding == "pytorch_quantization" else "onnx"
    row(f"fwd {name} {layout} {short} ({x.numel() / 2**20:.0f}M)",
        f"{path_of(status, device)}; diff {count} (max {largest:.3g}); {ours:.3f} ms = {ours / clone:.2f}x clone "
        f"({clone:.3f}), ref {reference:.3f}; graphs {count_graphs}", "diff 0; <= 2x clone")


def ste_row(name: str, dtype: torch.dtype, layout: str, numel: int, device: torch.device) -> None:
    x_cpu, amax_cpu, x, amax = inputs_for(layout, dtype, numel, device)
    g_cpu = torch.randn(x_cpu.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    g = g_cpu.to(device)
    out = ste.ste_grad(x, amax, g)
    status = ste.fused_status(device, dtype)
    count, largest = kernels.count_differences(out, ste.ste_grad_reference(x_cpu, amax_cpu, g_cpu))
    ours = per_call_ms(lambda: ste.ste_grad(x, amax, g), device)
    status = settled(status, ste.fused_status(device, dtype))
    reference = per_call_ms(lambda: ste.ste_grad_reference(x, amax, g), device)
    clone = per_call_ms(lambda: x.clone(), device)
    per_tensor = layout == "per-tensor"
    count_graphs = graphs(ste.compiled_kernels(), lambda key: key == (dtype, per_tensor))
    row(f"ste {name} {layout} ({x.numel() / 2**20:.0f}M)",
        f"{path_of(status, device)}; diff {count} (max {largest:.3g}); {ours:.3f} ms = {ours / clone:.2f}x clone "
        f"({clone:.3f}), ref {reference:.3f}; graphs {count_graphs}", "diff 0; <= 2x clone")


def overhead_row(device: torch.device) -> None:
    """Microseconds per call on a 64x64 tensor: the dispatch's fixed cost (dynamo guards, launches)."""
    x = torch.randn(64, 64, device=device)
    amax = x.abs().max()
    ours = per_call_ms(lambda: kernels.quantize(x, amax, 127.0, -127.0), device, calls=500) * 1e3
    reference = per_call_ms(lambda: kernels.quantize_reference(x, amax, 127.0, -127.0, "pytorch_quantization", True),
                            device, calls=500) * 1e3
    clone = per_call_ms(lambda: x.clone(), device, calls=500) * 1e3
    path = path_of(kernels.fused_status(device, torch.float32, "pytorch_quantization", True), device)
    # the compiled kernel called directly (dynamo guards + Inductor wrapper + launch), to split the fixed cost
    kernel = kernels.compiled_variant(False, True, torch.float32, -127.0, 127.0, True, torch.float32)
    alone = ""
    if kernel is not None and path.startswith("fused"):
        flat, bound = x.view(-1), kernels.bound_tensor(127.0, x.device)
        call = lambda: kernel(flat, amax.reshape(1), -127.0, 127.0, bound, False, True, torch.float32)  # noqa: E731
        alone = f" (torch.compile kernel alone {per_call_ms(call, device, calls=500) * 1e3:.1f} us"
        if triton_kernels.available():
            direct = lambda: triton_kernels.fake_quant(flat, amax.reshape(1), 1, flat.numel(), -127.0,  # noqa: E731
                                                       127.0, kernels.TINY_AMAX, False, True)
            alone += f", triton kernel alone {per_call_ms(direct, device, calls=500) * 1e3:.1f} us"
        alone += ")"
        profile_calls(lambda: kernels.quantize(x, amax, 127.0, -127.0))
    row("fwd fp32 per-tensor pq (64x64): fixed cost", f"{path}: {ours:.1f} us per call{alone}, ref {reference:.1f} us, "
        f"clone {clone:.1f} us", "")


def profile_calls(fn, calls: int = 300) -> None:
    """Where a call's fixed cost goes (Python functions by own time), into the log for the next round."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    print(f"profile of {calls} calls (64x64 fp32 per-tensor pq):\n{text.getvalue()}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--numel", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--budget-s", type=float, default=80.0)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        row("-", "no GPU: skipped")
        return
    started = time.perf_counter()
    steps = []
    for name, dtype in DTYPES.items():
        for layout in ("per-tensor", "per-channel"):
            for rounding in ("pytorch_quantization", "onnx"):
                steps.append((f"fwd {name} {layout} {rounding}",
                              lambda n=name, d=dtype, la=layout, r=rounding: forward_row(n, d, la, r, args.numel,
                                                                                         device)))
            steps.append((f"ste {name} {layout}", lambda n=name, d=dtype, la=layout: ste_row(n, d, la, args.numel,
                                                                                             device)))
        if name == "fp32":
            steps.append(("fixed cost", lambda: overhead_row(device)))
    for label, step in steps:
        if time.perf_counter() - started > args.budget_s:
            row(label, f"skipped: the {args.budget_s:.0f} s budget is spent")
            continue
        try:
            step()
        except Exception as error:  # noqa: BLE001 - a diagnostic: report and go on with the next case
            row(label, f"ERROR {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}")
    print(f"cuda_diag: {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
