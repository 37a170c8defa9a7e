"""A block whose activations carry a few outlier channels, as LLM and ViT activations do: the example where
the precision of one layer decides the accuracy of the whole block (issue 22).

``fc1`` writes a few channels about 250 times larger than the others (the "massive activations" of large
transformers); ``fc2`` reads them. With INT8 on every layer, ``fc2``'s per-tensor input step is set by the
outliers and the ordinary channels round to a handful of levels: the block's output SQNR is about 12 dB.
FP8 E4M3 on ``fc2`` keeps a relative precision of 2**-4 on every channel: about 28 dB (its inputs and
weights each round to 3 mantissa bits, about 31 dB apiece); the other layer can stay INT8. Random weights
from a fixed seed, no download: ``--model workbench.sources.outliers:outlier_block``
and ``--data <this file>:calibration_batches`` build it from the command line.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["OutlierBlock", "outlier_block", "calibration_batches", "OUTLIER_CHANNELS"]

OUTLIER_CHANNELS = (3, 17, 40, 101)
OUTLIER_GAIN = 250.0


class OutlierBlock(nn.Module):
    """``fc2(gelu(fc1(norm(x))))`` on ``[batch, tokens, dim]``, with outlier channels in ``fc1``'s output."""

    def __init__(self, dim: int = 64, hidden: int = 128, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.randn(hidden, dim, generator=generator) / dim ** 0.5)
            self.fc1.bias.zero_()
            self.fc2.weight.copy_(torch.randn(dim, hidden, generator=generator) / hidden ** 0.5)
            self.fc2.bias.zero_()
            for channel in OUTLIER_CHANNELS:
                self.fc1.weight[channel] *= OUTLIER_GAIN  # large activations on these channels...
                self.fc2.weight[:, channel] /= OUTLIER_GAIN  # ...read with small weights, as trained models do

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def outlier_block() -> OutlierBlock:
    """The block as the CLI's ``--model`` factory takes it."""
    return OutlierBlock().eval()


def calibration_batches(count: int = 8, batch: int = 8, tokens: int = 16, dim: int = 64,
                        seed: int = 1) -> list[torch.Tensor]:
    """Random token activations ``[batch, tokens, dim]`` (fixed seed), the block's input."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, tokens, dim, generator=generator) for _ in range(count)]
