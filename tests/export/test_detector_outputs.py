"""Detector-shaped models (torchvision's Faster R-CNN and SSD, found by the sweep): one result per image, so the
number of output tensors follows the batch size, and TorchScript-scripted post-processing whose If branches read
the outer graph's values by name."""
import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.export.exporters import unwrap_names
from workbench.quant.algorithms.calibrate import calibrate


@torch.jit.script
def _best(scores: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    # scripted: the trace keeps this as an If whose branches read `boxes` from the outer graph
    if scores.max() > 0:
        return boxes * scores.max()
    return boxes


class PerImage(nn.Module):
    """Returns a list with one {"boxes", "scores"} dict per image, as torchvision's detectors do."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 8)

    def forward(self, images):
        features = self.conv(images).mean((2, 3))
        out = []
        for i in range(images.shape[0]):
            boxes = self.head(features[i]).reshape(2, 4)
            scores = boxes.sigmoid().mean(1)
            out.append({"boxes": _best(scores, boxes), "scores": scores})
        return out


def test_outputs_per_image_fix_the_batch_and_keep_the_samples_names(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(1, 3, 16, 16) for _ in range(2)]
    model = PerImage().eval()
    quant.replace_to_quantization_module(model)
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    path = tmp_path / "det.onnx"
    report = export_qdq_onnx(model, batches[0], path, exporter="torchscript")
    # named after the sample's one image, not the two of the other batch size tried for a dynamic batch
    assert report.output_names == ["output_0.boxes", "output_0.scores"]
    assert any("outputs per sample" in warning for warning in report.warnings)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)  # the If's branches still find the values they read
    assert [o.name for o in proto.graph.output] == ["output_0.boxes", "output_0.scores"]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1  # the batch is the sample's
    assert report.cosine > 0.999


def test_unwrap_names_renames_the_values_a_subgraph_reads():
    then_out = helper.make_tensor_value_info("/model/out_then", TensorProto.FLOAT, [1, 2])
    branch = helper.make_graph([helper.make_node("Identity", ["/model/fc/Gemm_output_0"], ["/model/out_then"])],
                               "then", [], [then_out])
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "model.fc.weight"], ["/model/fc/Gemm_output_0"], name="/model/fc/Gemm"),
         helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor("model.fc.weight", TensorProto.FLOAT, [2, 2], np.ones(4, np.float32))])
    proto = helper.make_model(graph)
    unwrap_names(proto)
    then = proto.graph.node[1].attribute[0].g
    assert proto.graph.node[0].output[0] == "/fc/Gemm_output_0"
    assert then.node[0].input[0] == "/fc/Gemm_output_0"  # the branch reads the renamed value
    assert proto.graph.initializer[0].name == "fc.weight"
    onnx.checker.check_model(proto)
