"""Small helpers shared by the core (``pytorch_quantization.utils``)."""
from workbench.quant.utils.reduce_amax import reduce_amax  # noqa: F401
