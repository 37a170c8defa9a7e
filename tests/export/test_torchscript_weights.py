"""The TorchScript exporter's graph is exported without its weights and they are attached from the model's
tensors (streamed to a data file beside the target for a large model): the same file, a fraction of the memory."""
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

from workbench import quant
from workbench.export import export_qdq_onnx, exporters
from workbench.export.qdq import qdq_reference
from workbench.export.torchscript_weights import DATA_ALIGNMENT, attach_weights, weight_inputs
from workbench.export.validation import feeds, model_weights, ort_session, shared_weights
from workbench.quant.algorithms.calibrate import calibrate


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
    nodes = [helper.make_node("MatMul", ["x", weight_inputs[0][0]], ["y"])]
    nodes += [helper.make_node("Add", ["y", name], [f"y{i}"]) for i, (name, _) in enumerate(weight_inputs[1:])]
    return helper.make_model(helper.make_graph(nodes, "g", inputs,
                                               [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]))


def test_weights_are_written_aligned_from_the_tensors(tmp_path):
    w, b = torch.randn(3, 400), torch.arange(3, dtype=torch.float32)
    proto = weightless_graph(("w", [3, 400]), ("b", [3]), ("unread", [5]))
    proto.graph.node.pop()  # nothing reads "unread": it is dropped, not written
    attach_weights(proto, {"w": w, "b": b, "unread": torch.ones(5)}, tmp_path / "m.onnx", stream=True)
    assert [v.name for v in proto.graph.input] == ["x"]
    assert [t.name for t in proto.graph.initializer] == ["w", "b"]
    w_proto, b_proto = proto.graph.initializer
    assert w_proto.data_location == onnx.TensorProto.EXTERNAL and b_proto.data_location != onnx.TensorProto.EXTERNAL
    where = {e.key: e.value for e in w_proto.external_data}
    assert int(where["offset"]) % DATA_ALIGNMENT == 0 and int(where["length"]) == 3 * 400 * 4
    raw = (tmp_path / where["location"]).read_bytes()[int(where["offset"]):][:3 * 400 * 4]
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(3, 400), w.numpy())
    np.testing.assert_array_equal(numpy_helper.to_array(b_proto), [0, 1, 2])


def test_bfloat16_and_integer_tensors_keep_their_bits(tmp_path):
    weights = {"w": torch.randn(3, 2).to(torch.bfloat16), "i": torch.tensor([[-3, 7]], dtype=torch.int8)}
    proto = weightless_graph(("w", [3, 2]), ("i", [1, 2]))
    attach_weights(proto, weights, None, stream=False)
    found = {t.name: t for t in proto.graph.initializer}
    assert found["w"].data_type == onnx.TensorProto.BFLOAT16 and found["i"].data_type == onnx.TensorProto.INT8
    assert found["w"].raw_data == weights["w"].view(torch.int16).numpy().tobytes()
    np.testing.assert_array_equal(numpy_helper.to_array(found["i"]), [[-3, 7]])


def test_a_model_s_tensors_go_into_the_trace_once_and_unchanged():
    model, _ = calibrated_stack()
    found = weight_inputs(model)
    assert "0.weight" in found and "4.bias" in found
    assert all(not t.requires_grad for t in found.values())  # the trace records no autograd graph
    assert found["0.weight"].data_ptr() == model[0].weight.data_ptr()  # the model's memory, no copy


class HalfQuantizedCNN(nn.Module):
    """A float Conv + BatchNorm first (TorchScript's constant folding would fuse them into new tensors), then a
    quantized one."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.head(self.stem(x))


@pytest.mark.parametrize("exporter", ["auto", "torchscript"])
def test_a_float_conv_and_its_batchnorm_export_as_torch_export_writes_them(tmp_path, exporter):
    torch.manual_seed(0)
    model = HalfQuantizedCNN().eval()
    model.stem[1].running_mean.uniform_(-1, 1)
    model.stem[1].running_var.uniform_(0.5, 2)
    quant.replace_to_quantization_module(model)
    model.stem[0].input_quantizer.disable()
    model.stem[0].weight_quantizer.disable()
    x = torch.randn(2, 3, 8, 8)
    calibrate(model, [x], num_batches=None, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx", exporter=exporter)
    assert report.exporter == "torchscript" and report.cosine > 0.999 and report.quantize_nodes == 2
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert [n.op_type for n in graph.node if n.op_type in ("Conv", "BatchNormalization")] == [
        "Conv", "BatchNormalization", "Conv"]
    names = {t.name for t in graph.initializer}
    assert {"stem.0.weight", "stem.1.running_mean", "head.weight"} <= names
    assert not any(name.startswith("onnx::") for name in names)


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


def _large_stack(width: int = 1100, depth: int = 2) -> tuple[nn.Module, torch.Tensor]:
    """Over the 8 MB above which an export streams its weights through a data file."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]).eval()
    quant.replace_to_quantization_module(model)
    sample = torch.randn(2, width)
    calibrate(model, [sample], num_batches=1, method="max", report_sqnr=False)
    return model, sample


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_streamed_export_validates_with_the_weights_read_from_the_model(exporter, tmp_path, monkeypatch):
    model, sample = _large_stack()
    sessions = []
    from workbench.export import file_checks

    def spy(path, weights=None):
        session = ort_session(path, weights)
        sessions.append(session)
        return session

    monkeypatch.setattr(file_checks, "ort_session", spy)
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx", exporter=exporter)
    assert report.exporter == exporter and report.cosine > 0.999 and report.external_data_path is None
    shared = sessions[0].workbench_shared_weights
    assert sorted(shared) == ["0.0.bias", "0.0.weight", "1.0.bias", "1.0.weight"]  # none of them copied
    params = dict(model.named_parameters())
    assert all(shared[name][0].ctypes.data == params[name].data_ptr() for name in shared)
    # the one file written holds the weights (folded in on commit), as a model under 8 MB would
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    assert np.array_equal(written["0.0.weight"], params["0.0.weight"].detach().numpy())


class WarnsWhileTracing(nn.Module):
    """Over 8 MB, and a trace the fast path turns down (the tracer warns): torch.export exports it instead."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(1100, 1100), nn.ReLU(), nn.Linear(1100, 1100))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():
            warnings.warn("Converting a tensor to a Python boolean might cause the trace to be incorrect.",
                          torch.jit.TracerWarning, stacklevel=2)
        return self.layers(x)


def test_a_streamed_graph_the_fast_path_turns_down_leaves_no_weights_file(tmp_path):
    torch.manual_seed(0)
    model = WarnsWhileTracing().eval()
    quant.replace_to_quantization_module(model)
    sample = torch.randn(2, 1100)
    calibrate(model, [sample], num_batches=1, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx")
    assert report.exporter == "dynamo" and report.cosine > 0.999
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # the TorchScript trace's data file is gone
    # and the path the fast path takes for the same weights without the warning streams them as well
    plain = nn.Sequential(*list(model.layers)).eval()
    report = export_qdq_onnx(plain, sample, tmp_path / "p.onnx")
    assert report.exporter == "torchscript" and report.cosine > 0.999
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "p.onnx"]


def _staged(tmp_path) -> tuple[nn.Module, torch.Tensor, str]:
    model, sample = _large_stack(width=300, depth=2)
    path = tmp_path / "g.onnx"
    export_qdq_onnx(model, sample, tmp_path / "m.onnx")
    graph = onnx.load(str(tmp_path / "m.onnx"))
    onnx.save_model(graph, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="g.data", size_threshold=2048)
    return model, sample, str(path)


def test_only_tensors_equal_to_the_file_are_shared_and_the_outputs_stay_bit_identical(tmp_path):
    model, sample, path = _staged(tmp_path)
    weights = model_weights(model)
    assert sorted(shared_weights(path, weights)) == ["0.0.weight", "1.0.weight"]  # biases: inside the graph
    plain = ort_session(path)
    expected = plain.run(None, feeds(plain, (sample,)))[0]
    shared = ort_session(path, weights)
    assert np.array_equal(shared.run(None, feeds(shared, (sample,)))[0], expected)
    # a tensor that no longer holds what the file holds is read from the file: the session runs the file
    with torch.no_grad():
        model[1][0].weight[0, 0] += 1.0
    assert sorted(shared_weights(path, weights)) == ["0.0.weight"]
    again = ort_session(path, weights)
    assert np.array_equal(again.run(None, feeds(again, (sample,)))[0], expected)
    # nor is one of another type or shape under the same name
    odd = {"0.0.weight": weights["0.0.weight"].double(), "1.0.weight": weights["1.0.weight"].t().contiguous()}
    assert shared_weights(path, odd) == {}

class TiedLM(nn.Module):
    """An embedding table and an output layer sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.mix = nn.Linear(64, 64)
        self.head = nn.Linear(64, 100, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mix(self.embed(ids))))


def test_a_weight_shared_by_two_layers_is_one_initializer(tmp_path):
    torch.manual_seed(0)
    model = TiedLM().eval()
    ids = torch.randint(0, 100, (2, 6))
    quant.replace_to_quantization_module(model)
    calibrate(model, [ids], num_batches=1, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, ids, tmp_path / "m.onnx", exporter="torchscript")
    assert report.cosine > 0.999
    names = [i.name for i in onnx.load(str(tmp_path / "m.onnx")).graph.initializer]
    assert names.count("embed.weight") == 1 and "head.weight" not in names
