"""What TensorRT did with the model: its engine report read back onto the module tree.

:mod:`workbench.engine.layers` reads the files ``trtexec`` writes (``--exportLayerInfo``,
``--exportProfile``); :mod:`workbench.engine.mapping` finds the module of each name part whatever exporter
wrote the ONNX file; :mod:`workbench.engine.graph` follows the engine's own data flow;
:mod:`workbench.engine.hazards` and :mod:`workbench.engine.costs` say what went wrong and what it costs;
:mod:`workbench.engine.report` puts them together. It sits on the export layer:
it imports :mod:`workbench.export` and plain data only.
"""
from workbench.engine.costs import COST_KINDS, EngineCost  # noqa: F401
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
from workbench.engine.mapping import MAPPED_BY, read_onnx_names  # noqa: F401
from workbench.engine.report import (  # noqa: F401
    HAZARD_KINDS,
    EngineHazard,
    EngineMismatchError,
    EngineReport,
    ModuleOutcome,
    analyse_engine,
)
