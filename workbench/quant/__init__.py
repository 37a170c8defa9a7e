"""The fake-quantization core: descriptors, quantizers, quantized modules and calibrators.

Mirrors NVIDIA pytorch-quantization's vocabulary and module layout (``tensor_quant``, ``nn``,
``calib``, ``quant_modules``, ``nn.modules.tensor_quantizer``) with fused kernels. No Qt, no project
file: everything else in Quant Workbench is built on top of this package.
"""
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
from workbench.quant.tensor_quant import (  # noqa: F401
    QuantDescriptor,
    ScaledQuantDescriptor,
    fake_tensor_quant,
)
