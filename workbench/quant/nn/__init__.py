"""Quantized modules and the TensorQuantizer (``workbench.quant.nn``, like ``pytorch_quantization.nn``)."""
from workbench.quant.nn.modules.clip import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_attention import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_conv import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_experts import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_gemm import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_instancenorm import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_linear import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_ops import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_pooling import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_rnn import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_router import *  # noqa: F401,F403
from workbench.quant.nn.modules.quant_transformer import *  # noqa: F401,F403
from workbench.quant.nn.modules.tensor_quantizer import *  # noqa: F401,F403
