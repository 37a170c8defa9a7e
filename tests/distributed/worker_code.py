"""A tiny project's code for tests of worker processes: a model entry point, and a data entry point that
one rank can be told to fail (``FAIL_ON_RANK``), as a full disk on that machine would."""
from __future__ import annotations

import textwrap
from pathlib import Path

MODEL = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4))
"""

DATA = """
import os
import torch

def batches():
    if os.environ.get("RANK") is not None and os.environ.get("RANK") == os.environ.get("FAIL_ON_RANK"):
        raise RuntimeError("the data disk of this rank is full")
    generator = torch.Generator().manual_seed(5)
    for index in range(BATCHES):
        yield torch.randn(2, 3, 8, 8, generator=generator) * (4.0 if index == 3 else 1.0)
"""


def write_worker_code(folder: Path, batches: int) -> None:
    """``net.py:make`` and ``data.py:batches`` (``batches`` batches of 2 images) in ``folder``."""
    (folder / "net.py").write_text(textwrap.dedent(MODEL))
    (folder / "data.py").write_text(textwrap.dedent(DATA).replace("BATCHES", str(batches)))
