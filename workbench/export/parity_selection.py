"""Parity of detectors: compare before the graph's data-dependent selections, not after them.

A detector's outputs come out of a selection: torchvision's SSD, RetinaNet, FCOS and Faster R-CNN keep the boxes
that pass a score threshold (``NonZero``) and survive non-maximum suppression (``NonMaxSuppression``), RT-DETR
keeps the top-k encoder queries (``TopK``). Two scores within a rounding step of each other (random-weight models
have many) pick another box or query in onnxruntime than in PyTorch, and every output after the selection moves,
or changes length: the outputs' cosine says nothing about the graph there.

So, as a deployment tool compares a detector's raw head outputs: the parity diagnosis
(:func:`workbench.export.parity.diagnose`) already compares onnxruntime with PyTorch at every Q/DQ boundary (the
full run) and checks that every segment between boundaries computes what PyTorch does from PyTorch's own values
(the cut run). :func:`selection_verdict` reads those: when every boundary *before* the selections agrees to the
parity threshold, no segment before them computes anything else, and only what follows a selection parts, the
file is right and the difference is the selection's: the file is written validated, with that said.
"""
from __future__ import annotations

from collections.abc import Sequence

import onnx

__all__ = ["SELECTION_OPS", "after_selection", "selection_verdict"]

# ONNX ops whose result depends on comparing values: which boxes, queries or anchors go on
SELECTION_OPS = frozenset({"NonMaxSuppression", "TopK", "NonZero"})


def after_selection(proto: onnx.ModelProto) -> tuple[set[str], list[str]]:
    """(every tensor computed from a selection op's result, the selection op types found, in graph order)."""
    downstream: set[str] = set()
    found: list[str] = []
    for node in proto.graph.node:  # graph order is topological
        if node.op_type in SELECTION_OPS:
            found.append(node.op_type)
            downstream.update(node.output)
        elif any(name in downstream for name in node.input if name):
            downstream.update(node.output)
    return downstream, list(dict.fromkeys(found))


def selection_verdict(boundaries: Sequence, tensors: dict[str, str], parting_tensor: str | None,
                      downstream: set[str], ops: Sequence[str], min_cosine: float) -> str | None:
    """The reason the file is right but a selection parts it, or None when that is not what happened.

    Args:
        boundaries: the diagnosis's compared tensors (:class:`workbench.export.parity.Boundary`), graph order.
        tensors: boundary name -> the graph tensor it compares (a quantizer's input, or an output's name).
        parting_tensor: the tensor of the first segment that computes something else from PyTorch's values
            (None: none does).
        downstream, ops: :func:`after_selection` of the graph.
        min_cosine: the parity threshold.
    """
    if not ops or (parting_tensor is not None and parting_tensor not in downstream):
        return None
    before = [b for b in boundaries if b.kind == "quantizer" and tensors.get(b.name) not in downstream]
    after = [b for b in boundaries if tensors.get(b.name) in downstream or b.kind == "output"]
    if not before or not after or any(not b.cosine >= min_cosine for b in before):
        return None
    worst = min(before, key=lambda b: b.cosine)
    parted = [b for b in after if not b.cosine >= min_cosine]
    return (f"The graph selects by value ({', '.join(ops)}): every one of the {len(before)} quantizer inputs before "
            f"the selection agrees with PyTorch (worst cosine {worst.cosine:.6f}, at {worst.name}) and every segment "
            "before it computes what PyTorch does; only what follows the selection parts "
            f"({len(parted)} tensors: near-equal scores keep other boxes or queries in onnxruntime than in "
            "PyTorch). Compared before the selection, the file agrees: it is validated there.")
