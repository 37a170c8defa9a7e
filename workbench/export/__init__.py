"""QDQ ONNX export with validation, and TensorRT side files (amax table, calibration cache).

The names below load on first use (PEP 562), so that a layer that needs only a small piece of this package
(the opset bounds in :mod:`workbench.export.opset`, the node naming) does not load the exporter and torch.onnx.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "workbench.export.errors": ("ExportError", "ExportValidationError", "QuantizerStateError", "SampleInputError",
                                "UnsupportedOperationError"),
    "workbench.export.onnx_export": ("ExportReport", "OutputParity", "amax_table", "export_qdq_onnx", "report_json"),
    "workbench.export.qdq": ("QDQStandIn", "export_params", "qdq_reference"),
    "workbench.export.tensorrt": ("calibration_cache_text", "scale_hex", "strip_qdq"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = list(_MODULE_OF)

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
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


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.export' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
