"""The TorchScript exporter's graph is exported without its weights and they are attached from the model's
tensors (streamed to a data file beside the target for a large model): the same file, a fraction of the memory."""
import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

from workbench import quant
from workbench.export import export_qdq_onnx, exporters
from workbench.export.qdq import qdq_reference
from workbench.export.torchscript_weights import DATA_ALIGNMENT, attach_weights
from workbench.quant.calibrate import calibrate


def calibrated_stack():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    quant.replace_to_quantization_module(model)
    x = torch.randn(4, 64)
    calibrate(model, [x], num_batches=None, method="max", report_sqnr=False)
    return model, x


def initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize("exporter", ["auto", "torchscript"])
def test_streamed_weights_give_the_same_file_in_one_piece(tmp_path, monkeypatch, exporter):
    model, x = calibrated_stack()
    whole = export_qdq_onnx(model, x, tmp_path / "whole.onnx", exporter=exporter)
    monkeypatch.setattr(exporters, "STREAM_THRESHOLD", 1000)  # every weight of this model goes to a data file
    streamed = export_qdq_onnx(model, x, tmp_path / "streamed.onnx", exporter=exporter)
    assert whole.exporter == streamed.exporter == "torchscript"
    # folded into one file on commit, nothing left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed.onnx", "whole.onnx"]
    a, b = initializers(tmp_path / "whole.onnx"), initializers(tmp_path / "streamed.onnx")
    assert a.keys() == b.keys() and "0.weight" in a
    assert all(np.array_equal(a[name], b[name]) and a[name].dtype == b[name].dtype for name in a)
    np.testing.assert_array_equal(a["0.weight"], model[0].weight.detach().numpy())
    assert streamed.cosine == whole.cosine and streamed.max_abs_diff == whole.max_abs_diff


def test_a_graph_over_the_limit_keeps_its_weights_beside_it(tmp_path, monkeypatch):
    model, x = calibrated_stack()
    monkeypatch.setattr(exporters, "STREAM_THRESHOLD", 1000)
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx", external_data_threshold=1000)
    assert report.exporter == "torchscript" and report.external_data_path == str(tmp_path / "m.onnx.data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    graph = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in external} >= {"0.weight", "2.weight"}
    np.testing.assert_array_equal(initializers(tmp_path / "m.onnx")["2.weight"], model[2].weight.detach().numpy())


def weightless_graph(*weight_inputs):
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])]
    inputs += [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name, shape in weight_inputs]
    node = helper.make_node("MatMul", ["x", weight_inputs[0][0]], ["y"])
    return helper.make_model(helper.make_graph([node], "g", inputs,
                                               [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]))


def test_weights_are_written_aligned_from_the_tensors(tmp_path):
    module = nn.Module()
    module.w = nn.Parameter(torch.randn(3, 400))
    module.register_buffer("b", torch.arange(3, dtype=torch.float32))
    proto = weightless_graph(("w", [3, 400]), ("b", [3]))
    assert attach_weights(proto, module, ["x"], tmp_path / "m.onnx", stream=True)
    assert [v.name for v in proto.graph.input] == ["x"]
    w, b = proto.graph.initializer
    assert w.data_location == onnx.TensorProto.EXTERNAL and b.data_location != onnx.TensorProto.EXTERNAL
    where = {e.key: e.value for e in w.external_data}
    assert int(where["offset"]) % DATA_ALIGNMENT == 0 and int(where["length"]) == 3 * 400 * 4
    raw = (tmp_path / where["location"]).read_bytes()[int(where["offset"]):][:3 * 400 * 4]
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(3, 400), module.w.detach().numpy())
    np.testing.assert_array_equal(numpy_helper.to_array(b), [0, 1, 2])


def test_an_input_that_is_no_tensor_of_the_model_leaves_the_graph_alone(tmp_path):
    module = nn.Module()
    module.w = nn.Parameter(torch.randn(3, 400))
    proto = weightless_graph(("w", [3, 400]), ("onnx::Mul_7", [3]))  # a constant the exporter folded
    before = proto.SerializeToString()
    assert not attach_weights(proto, module, ["x"], tmp_path / "m.onnx", stream=True)
    assert proto.SerializeToString() == before and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("axis, qmin", [(0, -128), (1, -127), (0, 0)])
def test_the_one_temporary_qdq_computes_the_same_bits(axis, qmin):
    torch.manual_seed(1)
    x = torch.randn(6, 5, 4) * 3
    scale = torch.rand(x.shape[axis]) * 0.05 + 1e-3
    zero = torch.zeros(x.shape[axis], dtype=torch.int8 if qmin < 0 else torch.uint8)
    qmax = 127 if qmin < 0 else 255
    fast = qdq_reference(x, scale, zero, axis, qmin, qmax)
    graded = qdq_reference(x.clone().requires_grad_(), scale, zero, axis, qmin, qmax)  # the out-of-place form
    assert torch.equal(fast, graded.detach())
    assert fast.unique().numel() > 20  # a real quantization, not a constant
