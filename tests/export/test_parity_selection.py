"""Detectors' parity is judged before their selections by value (NMS, top-k, a score threshold): what follows a
selection parts on near-equal scores, whatever the graph's quality (workbench.export.parity_selection)."""
from onnx import TensorProto, helper

from workbench.export.parity import VERDICTS, Boundary
from workbench.export.parity_selection import after_selection, selection_verdict


def _detector_graph():
    """backbone conv input (quantized) -> head -> TopK on the scores -> Gather of the boxes -> outputs."""
    nodes = [helper.make_node("Relu", ["image"], ["features"], name="backbone/Relu"),
             helper.make_node("Identity", ["features"], ["scores"], name="head/Identity"),
             helper.make_node("Identity", ["features"], ["boxes"], name="head/Identity_1"),
             helper.make_node("TopK", ["scores", "k"], ["top", "index"], name="/TopK", axis=-1),
             helper.make_node("Gather", ["boxes", "index"], ["kept_boxes"], name="/Gather", axis=-1),
             helper.make_node("Sigmoid", ["top"], ["kept_scores"], name="/Sigmoid")]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("kept_boxes", "kept_scores")],
                              initializer=[helper.make_tensor("k", TensorProto.INT64, [1], [3])])
    return helper.make_model(graph)


def _boundary(name, kind, cosine, local=0.0):
    return Boundary(name, kind, "", (1, 8), 1.0 - cosine, cosine, local)


def test_what_follows_a_selection_is_found_and_what_precedes_it_is_not():
    downstream, ops = after_selection(_detector_graph())
    assert ops == ["TopK"]
    assert {"top", "index", "kept_boxes", "kept_scores"} <= downstream
    assert not {"features", "scores", "boxes"} & downstream


def test_a_detector_that_agrees_before_its_selection_is_validated_there_and_one_that_does_not_is_not():
    downstream, ops = after_selection(_detector_graph())
    tensors = {"head._input_quantizer": "features", "kept_boxes": "kept_boxes", "kept_scores": "kept_scores"}
    agree = [_boundary("head._input_quantizer", "quantizer", 0.99999),
             _boundary("kept_boxes", "output", 0.41), _boundary("kept_scores", "output", 0.97)]
    reason = selection_verdict(agree, tensors, None, downstream, ops, 0.999)
    assert reason is not None and "TopK" in reason and "2 tensors" in reason and "validated there" in reason
    assert "selection" in VERDICTS
    # a boundary before the selection that parts: the graph itself differs, no excuse
    parts_before = [_boundary("head._input_quantizer", "quantizer", 0.95)] + agree[1:]
    assert selection_verdict(parts_before, tensors, None, downstream, ops, 0.999) is None
    # a segment before the selection computes something else from PyTorch's values: a wrong graph
    assert selection_verdict(agree, tensors, "features", downstream, ops, 0.999) is None
    # only after it (ORT's NMS picked other boxes from PyTorch's own values): still the selection's
    assert selection_verdict(agree, tensors, "kept_boxes", downstream, ops, 0.999) is not None
    # no selection in the graph: nothing to excuse
    assert selection_verdict(agree, tensors, None, set(), [], 0.999) is None
