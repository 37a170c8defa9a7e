"""Speed of fake quantization: our fused kernel against x.clone() and against the unfused formula.

Prints, for each case, ratios measured in this one run (medians over interleaved repetitions):
  ours / clone      time of fake_tensor_quant over the time of x.clone() (target: within 2x)
  multi-op / ours   time of a straightforward several-operation implementation of the same formula
                    over ours (target: at least 1.7x)
  torch-fq / ours   torch's built-in fake_quantize_per_{tensor,channel}_affine over ours (for reference)
On CUDA it also prints the achieved bandwidth against x.clone()'s.
A training table gives forward+backward (the straight-through estimator, as quantization-aware training
runs it: torch.autograd.grad of the fake-quantized tensor) over x.clone() (target: at most 2.5x), and the
fused backward alone against the same gradient as torch operations (abs, <=, where).
A second table gives the per-call cost on small tensors (microseconds per call), where argument
checking and dispatch, not memory bandwidth, decide the time (QAT and sensitivity loops call it often).

    python bench/fake_quant.py [--repeats 15] [--device cpu|cuda|all]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench.quant.kernels import fake_quant as kernels
from workbench.quant.kernels.ste import ste_grad, ste_grad_reference
from workbench.quant.tensor_quant import fake_tensor_quant


def multi_op(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """The formula as several torch operations (what pytorch-quantization's CPU path does)."""
    scale = torch.tensor(127.0, device=x.device) / amax
    return (torch.clamp((x.float() * scale).round_(), -127, 127) / scale).to(x.dtype)


def torch_builtin(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    if amax.numel() == 1:
        return torch.fake_quantize_per_tensor_affine(x.float(), float(amax) / 127, 0, -127, 127).to(x.dtype)
    scale = (amax.reshape(-1) / 127).float()
    zero = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(x.float(), scale, zero, 0, -127, 127).to(x.dtype)


def timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def measure(functions: dict, repeats: int, sync) -> dict[str, float]:
    for fn in functions.values():  # warm up (allocator, kernel selection, thread pool)
        fn()
        fn()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):  # interleaved so that machine noise hits every variant alike
        for name, fn in functions.items():
            samples[name].append(timed(fn, sync))
    return {name: statistics.median(values) for name, values in samples.items()}


def cases(device: torch.device):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(16 * 1024 * 1024, device=device).to(dtype)
        yield f"16M per-tensor {str(dtype).replace('torch.', '')}", x, x.float().abs().max()
        w = torch.randn(256, 64, 32, 32, device=device).to(dtype)
        yield (f"(256,64,32,32) per-channel axis0 {str(dtype).replace('torch.', '')}", w,
               w.float().abs().amax(dim=(1, 2, 3), keepdim=True))


def run(device: torch.device, repeats: int) -> list[dict]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for label, x, amax in cases(device):
        with torch.no_grad():
            assert torch.equal(fake_tensor_quant(x, amax), multi_op(x, amax)), label
            times = measure({
                "clone": lambda x=x: x.clone(),
                "ours": lambda x=x, amax=amax: fake_tensor_quant(x, amax),
                "multi-op": lambda x=x, amax=amax: multi_op(x, amax),
                "torch-fq": lambda x=x, amax=amax: torch_builtin(x, amax),
            }, repeats, sync)
        row = {"device": device.type, "case": label, **{f"{k}_ms": v * 1e3 for k, v in times.items()},
               "ours/clone": times["ours"] / times["clone"], "multi-op/ours": times["multi-op"] / times["ours"],
               "torch-fq/ours": times["torch-fq"] / times["ours"]}
        if device.type == "cuda":
            moved = 2 * x.numel() * x.element_size()  # read once, write once
            row["ours_GBps"] = moved / times["ours"] / 1e9
            row["clone_GBps"] = moved / times["clone"] / 1e9
        rows.append(row)
    return rows


def run_training(device: torch.device, repeats: int) -> list[dict]:
    """Forward+backward through the straight-through estimator, and the backward alone."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for label, x, amax in cases(device):
        x = x.detach().requires_grad_(True)
        grad = torch.randn_like(x)
        fused = ste_grad(x.detach(), amax, grad)
        assert torch.equal(fused, ste_grad_reference(x.detach(), amax, grad)), label

        def forward_backward(x=x, amax=amax, grad=grad):
            return torch.autograd.grad(fake_tensor_quant(x, amax), x, grad)

        times = measure({
            "clone": lambda x=x: x.detach().clone(),
            "fwd+bwd": forward_backward,
            "bwd": lambda x=x, amax=amax, grad=grad: ste_grad(x.detach(), amax, grad),
            "torch-bwd": lambda x=x, amax=amax, grad=grad: ste_grad_reference(x.detach(), amax, grad),
        }, repeats, sync)
        rows.append({"device": device.type, "case": label, **{f"{k}_ms": v * 1e3 for k, v in times.items()},
                     "fwd+bwd/clone": times["fwd+bwd"] / times["clone"],
                     "torch-bwd/bwd": times["torch-bwd"] / times["bwd"]})
    return rows


def print_training(devices: list[torch.device], repeats: int) -> None:
    header = (f"| {'device':6} | {'case (training: STE forward+backward)':42} | {'clone ms':>8} | {'fwd+bwd ms':>10} | "
              f"{'fwd+bwd/clone':>13} | {'bwd ms':>8} | {'torch-bwd/bwd':>13} |")
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for device in devices:
        for row in run_training(device, repeats):
            print(f"| {row['device']:6} | {row['case']:42} | {row['clone_ms']:8.2f} | {row['fwd+bwd_ms']:10.2f} | "
                  f"{row['fwd+bwd/clone']:13.2f} | {row['bwd_ms']:8.2f} | {row['torch-bwd/bwd']:13.2f} |")


def small_cases(device: torch.device):
    torch.manual_seed(0)
    x = torch.randn(64, 64, device=device)
    yield "(64,64) per-tensor float32", x, x.abs().max()
    w = torch.randn(64, 3, 3, 3, device=device)
    yield "(64,3,3,3) per-channel axis0 float32", w, w.abs().amax(dim=(1, 2, 3), keepdim=True)


def run_small(device: torch.device, repeats: int, calls: int = 2000) -> list[dict]:
    """Microseconds per call on small tensors: the fixed overhead of one fake-quant call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for label, x, amax in small_cases(device):
        with torch.no_grad():
            functions = {
                "clone": lambda x=x: [x.clone() for _ in range(calls)],
                "ours": lambda x=x, amax=amax: [fake_tensor_quant(x, amax) for _ in range(calls)],
                "multi-op": lambda x=x, amax=amax: [multi_op(x, amax) for _ in range(calls)],
            }
            times = measure(functions, repeats, sync)
        rows.append({"device": device.type, "case": label, **{f"{k}_us": v / calls * 1e6 for k, v in times.items()}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    args = parser.parse_args()
    devices = [torch.device("cpu")]
    if args.device == "cuda" or (args.device == "all" and torch.cuda.is_available()):
        devices = ([] if args.device == "cuda" else devices) + [torch.device("cuda")]
    print(f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}, CPU kernel: {kernels.backend_name()}")
    header = f"| {'device':6} | {'case':42} | {'clone ms':>8} | {'ours ms':>8} | {'ours/clone':>10} | " \
             f"{'multi-op/ours':>13} | {'torch-fq/ours':>13} |"
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for device in devices:
        for row in run(device, args.repeats):
            line = (f"| {row['device']:6} | {row['case']:42} | {row['clone_ms']:8.2f} | {row['ours_ms']:8.2f} | "
                    f"{row['ours/clone']:10.2f} | {row['multi-op/ours']:13.2f} | {row['torch-fq/ours']:13.2f} |")
            if "ours_GBps" in row:
                line += f" {row['ours_GBps']:.0f} GB/s vs clone {row['clone_GBps']:.0f} GB/s"
            print(line)
    print()
    print_training(devices, args.repeats)
    print()
    small_header = (f"| {'device':6} | {'small case (per call)':42} | {'clone us':>8} | {'ours us':>8} | "
                    f"{'multi-op us':>11} |")
    print(small_header)
    print("|" + "|".join("-" * (len(part)) for part in small_header.split("|")[1:-1]) + "|")
    for device in devices:
        for row in run_small(device, args.repeats):
            print(f"| {row['device']:6} | {row['case']:42} | {row['clone_us']:8.2f} | {row['ours_us']:8.2f} | "
                  f"{row['multi-op_us']:11.2f} |")


if __name__ == "__main__":
    main()
