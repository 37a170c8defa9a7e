"""What giving every pass its own copy of the batch costs (reliability item 6), as ratios measured in this run.

A model that edits its input in place must not change the batch the next pass reads, so the evaluator
(sensitivity, evaluate) and run_model (calibration, its SQNR) copy the inputs for each call. This prints,
per model, one evaluation pass with the copy over the same pass without it (medians of interleaved repeats):

  model             what runs
  pass ms           one pass over the batches with the copy (the cost the user sees)
  copy / no copy    the pass with the copy over the pass without it (1.00 = free)

The worst case is a model that does little per input byte (a small MLP on a wide input); a CNN is the usual case.

    python bench/input_copy.py [--repeats 7] [--batches 4] [--batch-size 16] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from workbench import quant
from workbench.analysis import get_metric
from workbench.analysis.evaluator import Evaluator
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.snapshot import ModelSnapshot
from workbench.sources.demo import resnet18_like


def models(batch_size: int) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 16), nn.ReLU(), nn.Linear(16, 10))
    return [("ResNet-18-like 3x64x64", resnet18_like(), (batch_size, 3, 64, 64)),
            ("small MLP on 3x64x64 (worst case)", mlp, (batch_size, 3, 64, 64))]


def one_pass(evaluator: Evaluator) -> float:
    started = time.perf_counter()
    evaluator.measure("quantized")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{'model':<36} {'pass ms':>9} {'copy / no copy':>15}")
    for name, model, shape in models(args.batch_size):
        model.eval()
        quant.replace_to_quantization_module(model)
        data = [torch.randn(shape) for _ in range(args.batches)]
        calibrate(model, data, num_batches=len(data), method="max", report_sqnr=False)
        with ModelSnapshot(model), torch.no_grad():
            copying = Evaluator(model, data, get_metric("sqnr"))
            sharing = Evaluator(model, data, get_metric("sqnr"))
            sharing.fresh_inputs = lambda i, e=sharing: e.inputs[i]  # the old behaviour: the batch itself
            for evaluator in (copying, sharing):
                evaluator.measure_fp32()
            with_copy, without = [], []
            for _ in range(args.repeats):  # interleaved, so that load changes hit both alike
                with_copy.append(one_pass(copying))
                without.append(one_pass(sharing))
        ratio = statistics.median(with_copy) / statistics.median(without)
        print(f"{name:<36} {statistics.median(with_copy) * 1e3:>9.2f} {ratio:>15.3f}")


if __name__ == "__main__":
    main()
