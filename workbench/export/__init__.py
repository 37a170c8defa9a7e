"""QDQ ONNX export with validation, and TensorRT side files (amax table, calibration cache).

The face imports its modules on first use (:mod:`workbench.lazy_imports`): a module that needs one light part
(``workbench.export.naming``, the errors) does not load onnx with it.
"""
from typing import TYPE_CHECKING

from workbench.export.errors import (  # light (no onnx): every caller catching export errors imports them
    ExportError,
    ExportValidationError,
    QuantizerStateError,
    SampleInputError,
    UnsupportedOperationError,
)
from workbench.lazy_imports import lazy_face

__getattr__, __dir__, _lazy = lazy_face(__name__, {
    "workbench.export.onnx_export": ("ExportReport", "OutputParity", "amax_table", "export_qdq_onnx", "report_json"),
    "workbench.export.qdq": ("QDQStandIn", "export_params", "qdq_reference"),
    "workbench.export.tensorrt": ("calibration_cache_text", "scale_hex", "strip_qdq"),
})
__all__ = ["ExportError", "ExportValidationError", "QuantizerStateError", "SampleInputError",
           "UnsupportedOperationError", *_lazy]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
    from workbench.export.onnx_export import ExportReport, OutputParity, amax_table, export_qdq_onnx, report_json  # noqa: F401
    from workbench.export.qdq import QDQStandIn, export_params, qdq_reference  # noqa: F401
    from workbench.export.tensorrt import calibration_cache_text, scale_hex, strip_qdq  # noqa: F401
