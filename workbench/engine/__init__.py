"""What TensorRT did with the model: its engine report read back onto the module tree.

:mod:`workbench.engine.layers` reads the files ``trtexec`` writes (``--exportLayerInfo``,
``--exportProfile``); :mod:`workbench.engine.report` maps engine layers to modules through the ONNX
node names of :mod:`workbench.export.naming` and flags the hazards. It sits on the export layer:
it imports :mod:`workbench.export` and plain data only.
"""
from workbench.engine.layers import (  # noqa: F401
    PRECISIONS,
    EngineLayer,
    EngineReportError,
    TensorInfo,
    load_engine_layers,
    precision_of_format,
    read_layer_info,
    read_profile,
)
from workbench.engine.report import (  # noqa: F401
    HAZARD_KINDS,
    EngineHazard,
    EngineReport,
    ModuleOutcome,
    analyse_engine,
)
