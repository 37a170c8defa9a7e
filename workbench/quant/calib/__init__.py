"""Calibrators: collect statistics of a tensor and propose its amax (``pytorch_quantization.calib``).

The face imports its modules on first use (``lazy_loader``): the method registry (``calib.methods``, which
``--help`` reads) comes without the calibrators and torch.
"""
from typing import TYPE_CHECKING

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "calibrator": ["Calibrator"],
    "histogram": ["HISTOGRAM_METHODS", "HistogramCalibrator", "UnknownMethodError", "calibrate_weights"],
    "max": ["MaxCalibrator"],
    "methods": ["AMAX_METHODS", "DEFAULT_AMAX_METHOD", "PERCENTILE", "PERCENTILE_FLOOR", "AmaxMethod", "Parameter",
                "percentile_mistake"],
})

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
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
