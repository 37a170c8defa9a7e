"""Calibrators: collect statistics of a tensor and propose its amax (``pytorch_quantization.calib``)."""
from workbench.quant.calib.calibrator import Calibrator  # noqa: F401
from workbench.quant.calib.histogram import (  # noqa: F401
    HISTOGRAM_METHODS,
    HistogramCalibrator,
    UnknownMethodError,
    calibrate_weights,
)
from workbench.quant.calib.max import MaxCalibrator  # noqa: F401
from workbench.quant.calib.methods import (  # noqa: F401
    AMAX_METHODS,
    DEFAULT_AMAX_METHOD,
    PERCENTILE,
    PERCENTILE_FLOOR,
    AmaxMethod,
    Parameter,
    percentile_mistake,
)
