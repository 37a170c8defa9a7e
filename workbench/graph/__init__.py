"""Model inspection: the module tree, torch.fx tracing for functional operations, TensorRT placement rules.

No Qt here: the GUI's tree model and the CLI both read :func:`describe_model`, and both prepare a
model for TensorRT with :func:`insert_functional_quantizers` and :func:`apply_placement_rules`.
"""
from workbench.graph.fold import FoldedPair, FoldReport, SkippedBatchNorm, fold_batchnorm  # noqa: F401
from workbench.graph.functional import (  # noqa: F401
    FunctionalQuantReport,
    InsertedQuantizer,
    SkippedOp,
    insert_functional_quantizers,
)
from workbench.graph.prepare import PreparationReport, prepare_for_tensorrt  # noqa: F401
from workbench.graph.rules import (  # noqa: F401
    PlacementReport,
    PlacementRules,
    RuleApplication,
    SharedGroup,
    apply_placement_rules,
    share_quantizers,
)
from workbench.graph.trace import QuantTracer, TracedPiece, TraceFailure, trace_pieces  # noqa: F401
from workbench.graph.tree import (  # noqa: F401
    ModelTree,
    ModuleInfo,
    QuantizerInfo,
    describe_model,
    is_quantized_module,
)
