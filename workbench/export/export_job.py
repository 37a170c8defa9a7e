"""What one QDQ export carries from step to step: the job (its arguments, the quantizers, the reference outputs,
the captured graph and its figures) and the validation's checks. Filled in as the steps of
:func:`~workbench.export.onnx_export.export_qdq_onnx` run (:mod:`~workbench.export.capture`,
:mod:`~workbench.export.file_checks`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from workbench.export.exporters import Exporter
from workbench.export.gemms import WeightGemms
from workbench.export.notes import ReportLog
from workbench.export.onnx_file import StagedFile
from workbench.export.qdq import ExportParams
from workbench.export.reference import ExportCall
from workbench.export.report import OutputParity, ParityCheck
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer


@dataclass
class ExportJob:
    """What one export carries from step to step (filled in as the steps run)."""

    model: nn.Module
    path: Path
    call: ExportCall
    inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str] | None
    opset: int
    requested_opset: int
    dynamic_batch: bool
    exporter: Exporter
    external_data_threshold: int
    fp8_ops: str
    names: dict[int, str]
    active: dict[int, TensorQuantizer]
    params: dict[int, ExportParams]
    unreached: list[TensorQuantizer]
    formats: set[str]
    opset_notes: list[str]
    log: ReportLog
    # the fake-quant reference run (:func:`run_references`)
    reference: list[torch.Tensor] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    distinct: int = 0
    grown: tuple[torch.Tensor, ...] | None = None  # one more sample, for the dynamic-batch check
    grown_reference: list[torch.Tensor] | None = None
    longer: tuple[torch.Tensor, ...] | None = None  # token inputs one position longer
    longer_reference: list[torch.Tensor] | None = None
    ranged: tuple[torch.Tensor, ...] | None = None  # random inputs in the sample's range
    ranged_reference: list[torch.Tensor] | None = None
    # the capture (:func:`capture`) and the graph's figures (:func:`post_process_graph`)
    proto: onnx.ModelProto | None = None
    used_exporter: str = ""
    exporter_note: str = ""
    swapped: dict = field(default_factory=dict)
    export_time_s: float = 0.0
    exported_data: Path | None = None  # a large graph's weights, in a temporary file until committed
    counts: dict[str, int] = field(default_factory=dict)
    by_format: dict[str, int] = field(default_factory=dict)
    gemms: WeightGemms | None = None
    staged: StagedFile | None = None  # the validated file beside ``path``, until committed
    folded: bool = False  # a streamed graph's weights folded into the committed file
    fast_path: bool = True  # "auto" may try the TorchScript fast path (off again when its graph fails validation)
    without_qdq: list[str] = field(default_factory=list)  # quantizers that ran but have no Q/DQ in the graph
    static_sequence: bool = False  # axis 1 of token inputs keeps the sample's length
    captured: list[str] = field(default_factory=list)  # what torch logged and printed while exporting
    # more inputs parity is checked on (positional, keyword), and their rows' inputs by label (for the diagnosis)
    extra: list[tuple[tuple, dict]] = field(default_factory=list)
    checked_inputs: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    # given each parity batch's index (in ``extra``) and the model's own output on it, as the parity check computed
    # it (ONNX's rounding): the caller's headline reuses those forwards (export_qdq_onnx's ``parity_outputs``)
    parity_outputs: Callable[[int, Any], None] | None = None
    # the block-by-block validation's session and findings (workbench.export.blockwise_validation), when it ran
    blockwise: Any = None
    block_outputs: dict[str, torch.Tensor] | None = None  # the sample's blocks' outputs in PyTorch (the same)


@dataclass
class ValidationChecks:
    """onnxruntime against the fake-quant model (:func:`validate`): the named checks, and every row of the
    report's parity table (each check that contributes to the headline, one row each)."""

    parity: list[OutputParity]
    dynamic_check: OutputParity | None
    sequence_check: OutputParity | None
    range_check: OutputParity | None
    optimized_check: OutputParity | None
    started: float
    rows: list[ParityCheck] = field(default_factory=list)

    @property
    def counted(self) -> list[ParityCheck]:
        """The rows the parity thresholds and the headline numbers cover."""
        return [row for row in self.rows if row.in_headline]
