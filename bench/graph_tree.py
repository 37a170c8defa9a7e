"""How long describe_model takes on a model of 10,000 modules (the layer tree view's data).

Run: ``python bench/graph_tree.py [--modules N]``. Prints the time per description and, for scale,
the time of a bare ``list(model.named_modules())`` over the same model, measured in the same run.
"""
from __future__ import annotations

import argparse
import time

from torch import nn

from workbench.graph import describe_model
from workbench.quant import replace_to_quantization_module


class Block(nn.Module):
    """conv, bn, relu, linear: four modules plus the block itself."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 4)


def big_model(modules: int) -> nn.Module:
    """A model with ``modules`` modules in stages of blocks (quantized: each conv/linear adds 2 quantizers)."""
    blocks_per_stage = 20
    per_stage = blocks_per_stage * 5 + 1
    stages = max(1, modules // per_stage)
    return nn.Sequential(*(nn.Sequential(*(Block() for _ in range(blocks_per_stage))) for _ in range(stages)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--modules", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    model = big_model(args.modules)
    replace_to_quantization_module(model)
    rows = len(describe_model(model))
    all_modules = sum(1 for _ in model.modules())

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    describe = best(lambda: describe_model(model))
    walk = best(lambda: list(model.named_modules()))
    print(f"model: {all_modules} modules including quantizers, {rows} tree rows")
    print(f"describe_model: {describe * 1000:.1f} ms (best of {args.repeat})")
    print(f"list(named_modules()): {walk * 1000:.1f} ms; ratio {describe / walk:.1f}x")


if __name__ == "__main__":
    main()
