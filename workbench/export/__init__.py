"""QDQ ONNX export with validation, and TensorRT side files (amax table, calibration cache).

The face imports its modules on first use (scientific-python's ``lazy_loader``, SPEC 1): a module that needs one
light part (``workbench.export.naming``, the errors) does not load onnx with it.
"""
from typing import TYPE_CHECKING

import lazy_loader

from workbench.export.errors import (  # light (no onnx): every caller catching export errors imports them
    ExportError,
    ExportValidationError,
    QuantizerStateError,
    SampleInputError,
    UnsupportedOperationError,
)

__getattr__, _, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "onnx_export": ("ExportReport", "OutputParity", "amax_table", "export_qdq_onnx", "report_json"),
    "qdq": ("QDQStandIn", "export_params", "qdq_reference"),
    "tensorrt": ("calibration_cache_text", "scale_hex", "strip_qdq"),
})
__all__ = ["ExportError", "ExportValidationError", "QuantizerStateError", "SampleInputError",
           "UnsupportedOperationError", *_lazy]


def __dir__() -> list[str]:  # the light names imported above, and the lazy ones
    return sorted(__all__)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
    from workbench.export.onnx_export import ExportReport, OutputParity, amax_table, export_qdq_onnx, report_json  # noqa: F401
    from workbench.export.qdq import QDQStandIn, export_params, qdq_reference  # noqa: F401
    from workbench.export.tensorrt import calibration_cache_text, scale_hex, strip_qdq  # noqa: F401
