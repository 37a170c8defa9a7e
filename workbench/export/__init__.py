"""QDQ ONNX export with validation, and TensorRT side files (amax table, calibration cache)."""
from workbench.export.errors import (  # noqa: F401
    ExportError,
    ExportValidationError,
    QuantizerStateError,
    SampleInputError,
    UnsupportedOperationError,
)
from workbench.export.onnx_export import (  # noqa: F401
    ExportReport,
    OutputParity,
    amax_table,
    export_qdq_onnx,
    report_json,
)
from workbench.export.qdq import QDQStandIn, export_params, qdq_reference  # noqa: F401
from workbench.export.tensorrt import calibration_cache_text, scale_hex, strip_qdq  # noqa: F401
