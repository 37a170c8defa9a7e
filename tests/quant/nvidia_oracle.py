"""pytorch-quantization's own three amax searches (NVIDIA, Apache-2.0), loaded to test ours against them.

The functions are not copied into this repository: they are read, unchanged, from pytorch-quantization's
source wherever it is present, in this order:

- the file named by ``WORKBENCH_PQ_HISTOGRAM``: ``tools/pytorch-quantization/pytorch_quantization/calib/
  histogram.py`` of a checkout of https://github.com/NVIDIA/TensorRT;
- an installed ``pytorch_quantization`` (NVIDIA's wheel from pypi.ngc.nvidia.com; the PyPI name is a
  placeholder package that installs nothing).

Only the three function definitions run (found with ``ast``; the module itself imports absl and the rest
of its package). They get what the module gives them: numpy, ``collections.Counter``, ``scipy.stats.entropy``,
torch, a logger, and ``fake_tensor_quant``: pytorch-quantization's own where its package is importable, else
ours (``workbench.quant.tensor_quant``, the same formula), which the caller is told.
"""
from __future__ import annotations

import ast
import importlib.util
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ENV = "WORKBENCH_PQ_HISTOGRAM"
FUNCTIONS = ("_compute_amax_entropy", "_compute_amax_mse", "_compute_amax_percentile")


@dataclass
class Oracle:
    entropy: Callable
    mse: Callable
    percentile: Callable
    source: Path
    quantizer: str  # whose fake_tensor_quant the mse search calls


def _source() -> Path | None:
    named = os.environ.get(ENV)
    if named:
        path = Path(named)
        return path / "pytorch_quantization" / "calib" / "histogram.py" if path.is_dir() else path
    spec = importlib.util.find_spec("pytorch_quantization")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "calib" / "histogram.py"
    return candidate if candidate.is_file() else None


def load() -> Oracle | str:
    """NVIDIA's three functions, or why they cannot be loaded here (a reason to skip with)."""
    path = _source()
    if path is None:
        return (f"pytorch-quantization's source is not here: set {ENV} to tools/pytorch-quantization/"
                "pytorch_quantization/calib/histogram.py of a NVIDIA/TensorRT checkout")
    if not path.is_file():
        return f"{ENV}={path}: no such file"
    try:
        from scipy.stats import entropy
    except ImportError:
        return "scipy is needed by pytorch-quantization's entropy search (pip install scipy)"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    found = {node.name: ast.get_source_segment(text, node) for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS}
    if set(found) != set(FUNCTIONS):
        return f"{path} does not define {', '.join(sorted(set(FUNCTIONS) - set(found)))}"
    try:
        from pytorch_quantization.tensor_quant import fake_tensor_quant
        quantizer = "pytorch-quantization's"
    except ImportError:
        from workbench.quant.tensor_quant import fake_tensor_quant
        quantizer = "workbench's (pytorch_quantization is not importable)"
    namespace = {"np": np, "Counter": Counter, "entropy": entropy, "torch": torch,
                 "logging": logging.getLogger("pytorch_quantization"), "fake_tensor_quant": fake_tensor_quant,
                 "scaled_e4m3": None}
    for name in FUNCTIONS:
        exec(compile(found[name], str(path), "exec"), namespace)  # noqa: S102 - NVIDIA's code, unchanged
    return Oracle(namespace["_compute_amax_entropy"], namespace["_compute_amax_mse"],
                  namespace["_compute_amax_percentile"], path, quantizer)
