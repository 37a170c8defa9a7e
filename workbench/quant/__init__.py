"""The fake-quantization core: descriptors, quantizers, quantized modules and calibrators.

Three rooms. This package's own modules are NVIDIA pytorch-quantization's vocabulary with its module layout
(``tensor_quant``, ``nn``, ``calib``, ``quant_modules``, ``nn.modules.tensor_quantizer``, ``utils``, ``optim``), so
that scripts written for it run with only their import lines changed; ``kernels/`` is how one tensor is computed
(C, Triton, ``torch.compile``); ``algorithms/`` is what walks a whole model (calibration, auto method choice,
SmoothQuant/AWQ, precisions and their rules, the distributed merge). No Qt, no project file: everything else in
Quant Workbench is built on top of this package.

The face imports its modules on first use (``lazy_loader``): reading a registry such as
``workbench.quant.calib.methods`` (``workbench calibrate --help``) loads no torch.
"""
from typing import TYPE_CHECKING

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["calib", "nn", "quant_modules", "tensor_quant", "utils"],
    submod_attrs={
        "kernels.fake_quant": ["backend_name"],
        "nn": ["Clip", "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d", "QuantAdaptiveAvgPool3d", "QuantAvgPool1d",
               "QuantAvgPool2d", "QuantAvgPool3d", "QuantConv1d", "QuantConv2d", "QuantConv3d", "QuantConvTranspose1d",
               "QuantConvTranspose2d", "QuantConvTranspose3d", "QuantInstanceNorm1d", "QuantInstanceNorm2d",
               "QuantInstanceNorm3d", "QuantLinear", "QuantLSTM", "QuantLSTMCell", "QuantMaxPool1d", "QuantMaxPool2d",
               "QuantMaxPool3d", "TensorQuantizer"],
        "quant_modules": ["deactivate", "enable_onnx_export", "initialize"],
        "replace": ["IgnoredLayer", "ReplacedLayer", "ReplacementReport", "default_quant_map", "ignore_matcher",
                    "replace_to_quantization_module"],
        "switches": ["bypass_quantization", "disable_fake_quant", "disable_observer", "disable_quantization",
                     "disable_quantizer", "enable_fake_quant", "enable_observer", "enable_quantization",
                     "enable_quantizer", "quantizer_state", "restore_quantizer_state"],
        "tensor_quant": ["QuantDescriptor", "ScaledQuantDescriptor", "fake_tensor_quant"],
    },
)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
    from workbench.quant import calib, nn, quant_modules, tensor_quant, utils  # noqa: F401
    from workbench.quant.kernels.fake_quant import backend_name  # noqa: F401
    from workbench.quant.nn import (  # noqa: F401
        Clip,
        QuantAdaptiveAvgPool1d,
        QuantAdaptiveAvgPool2d,
        QuantAdaptiveAvgPool3d,
        QuantAvgPool1d,
        QuantAvgPool2d,
        QuantAvgPool3d,
        QuantConv1d,
        QuantConv2d,
        QuantConv3d,
        QuantConvTranspose1d,
        QuantConvTranspose2d,
        QuantConvTranspose3d,
        QuantInstanceNorm1d,
        QuantInstanceNorm2d,
        QuantInstanceNorm3d,
        QuantLinear,
        QuantLSTM,
        QuantLSTMCell,
        QuantMaxPool1d,
        QuantMaxPool2d,
        QuantMaxPool3d,
        TensorQuantizer,
    )
    from workbench.quant.quant_modules import deactivate, enable_onnx_export, initialize  # noqa: F401
    from workbench.quant.replace import (  # noqa: F401
        IgnoredLayer,
        ReplacedLayer,
        ReplacementReport,
        default_quant_map,
        ignore_matcher,
        replace_to_quantization_module,
    )
    from workbench.quant.switches import (  # noqa: F401
        bypass_quantization,
        disable_fake_quant,
        disable_observer,
        disable_quantization,
        disable_quantizer,
        enable_fake_quant,
        enable_observer,
        enable_quantization,
        enable_quantizer,
        quantizer_state,
        restore_quantizer_state,
    )
    from workbench.quant.tensor_quant import QuantDescriptor, ScaledQuantDescriptor, fake_tensor_quant  # noqa: F401
