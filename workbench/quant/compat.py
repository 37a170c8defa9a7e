"""Run scripts written for NVIDIA's pytorch-quantization against this core.

``alias_pytorch_quantization()`` registers ``pytorch_quantization`` and its submodules in
``sys.modules`` so that ``from pytorch_quantization import nn as quant_nn`` (and the rest) import
``workbench.quant``. The classes are the same objects, so state_dicts saved by either load into the
other.
"""
from __future__ import annotations

import importlib
import sys
import types

__all__ = ["alias_pytorch_quantization", "ALIASED_MODULES", "PYTORCH_QUANTIZATION_VERSION"]

# The pytorch-quantization release whose API this core mirrors.
PYTORCH_QUANTIZATION_VERSION = "2.2.1"

# pytorch_quantization submodule -> workbench module
ALIASED_MODULES = {
    "tensor_quant": "workbench.quant.tensor_quant",
    "cuda_ext": "workbench.quant.cuda_ext",
    "nn": "workbench.quant.nn",
    "nn.functional": "workbench.quant.nn.functional",
    "nn.modules": "workbench.quant.nn.modules",
    "nn.modules.tensor_quantizer": "workbench.quant.nn.modules.tensor_quantizer",
    "nn.modules._utils": "workbench.quant.nn.modules._utils",
    "nn.modules.clip": "workbench.quant.nn.modules.clip",
    "nn.modules.quant_conv": "workbench.quant.nn.modules.quant_conv",
    "nn.modules.quant_linear": "workbench.quant.nn.modules.quant_linear",
    "nn.modules.quant_pooling": "workbench.quant.nn.modules.quant_pooling",
    "nn.modules.quant_rnn": "workbench.quant.nn.modules.quant_rnn",
    "nn.modules.quant_instancenorm": "workbench.quant.nn.modules.quant_instancenorm",
    "calib": "workbench.quant.calib",
    "calib.calibrator": "workbench.quant.calib.calibrator",
    "calib.max": "workbench.quant.calib.max",
    "calib.histogram": "workbench.quant.calib.histogram",
    "quant_modules": "workbench.quant.quant_modules",
    "utils": "workbench.quant.utils",
    "utils.reduce_amax": "workbench.quant.utils.reduce_amax",
    "utils.quant_logging": "workbench.quant.utils.quant_logging",
    "optim": "workbench.quant.optim",
    "optim.helper": "workbench.quant.optim.helper",
}


def alias_pytorch_quantization(force: bool = False) -> types.ModuleType:
    """Make ``import pytorch_quantization...`` import this core; returns the top-level alias module.

    Args:
        force: replace a ``pytorch_quantization`` that is already imported (the real library, say).
            Without it, an existing real import is left alone and a RuntimeError explains why.
    """
    existing = sys.modules.get("pytorch_quantization")
    if existing is not None and not getattr(existing, "__workbench_alias__", False) and not force:
        raise RuntimeError("The real pytorch_quantization is already imported in this process; call "
                           "alias_pytorch_quantization(force=True) to replace it, or alias before importing it.")
    core = importlib.import_module("workbench.quant")
    top = types.ModuleType("pytorch_quantization", "Alias of workbench.quant (Quant Workbench).")
    top.__workbench_alias__ = True
    top.__version__ = PYTORCH_QUANTIZATION_VERSION
    top.__path__ = []  # a package, so that submodule imports consult sys.modules
    for name in dir(core):
        if not name.startswith("__"):
            setattr(top, name, getattr(core, name))
    sys.modules["pytorch_quantization"] = top
    version = types.ModuleType("pytorch_quantization.version")
    version.__version__ = PYTORCH_QUANTIZATION_VERSION
    sys.modules["pytorch_quantization.version"] = version
    top.version = version
    for alias, target in ALIASED_MODULES.items():
        module = importlib.import_module(target)
        sys.modules[f"pytorch_quantization.{alias}"] = module
        parent_name, _, leaf = f"pytorch_quantization.{alias}".rpartition(".")
        parent = sys.modules[parent_name]
        if not hasattr(parent, leaf):  # utils.reduce_amax is the function, not its module, as upstream
            setattr(parent, leaf, module)
    return top
