"""The fold of a streamed export's weights into one file: the file protobuf itself writes, one ``graph`` field.

netron's reader keeps only the last ``graph`` field of a ModelProto, so a file made of concatenated fragments
(valid protobuf, which onnxruntime and TensorRT merge) drew an empty canvas for every export over
STREAM_THRESHOLD.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.export.onnx_file import fold_external_data


def _top_level_fields(data: bytes) -> list[int]:
    """The field numbers of a serialised ModelProto's top level, in file order (onnx.proto: 7 is ``graph``)."""
    from google.protobuf.internal.decoder import _DecodeVarint

    numbers, position = [], 0
    while position < len(data):
        key, position = _DecodeVarint(data, position)
        numbers.append(key >> 3)
        wire = key & 7
        if wire == 0:
            _, position = _DecodeVarint(data, position)
        elif wire == 2:
            length, position = _DecodeVarint(data, position)
            position += length
        else:
            position += 8 if wire == 1 else 4
    return numbers


def _model() -> onnx.ModelProto:
    """y = ((x @ big_a) + small) @ big_b, weights of several sizes (a 130 KB one needs a 3-byte length)."""
    rng = np.random.default_rng(0)
    big_a = rng.standard_normal((16, 2048)).astype(np.float32)
    big_b = rng.standard_normal((2048, 4)).astype(np.float32)
    small = np.arange(2048, dtype=np.float32)[:8].repeat(256)
    nodes = [helper.make_node("MatMul", ["x", "big_a"], ["h"], name="fc1/MatMul"),
             helper.make_node("Add", ["h", "small"], ["h2"], name="fc1/Add"),
             helper.make_node("MatMul", ["h2", "big_b"], ["y"], name="fc2/MatMul")]
    graph = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(small, "small"), numpy_helper.from_array(big_a, "big_a"),
                               numpy_helper.from_array(big_b, "big_b")],
                              value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 2048])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")
    helper.set_model_props(model, {"workbench.writer": "test"})
    return model


def _streamed(model: onnx.ModelProto, folder) -> tuple:
    graph, data = folder / "g.onnx", folder / "g.onnx.data"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_model moves the weights of the model it is given out to the data file
    onnx.save_model(copy, str(graph), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=9000)  # "small" (8 KB) stays in the graph
    return graph, data


def test_the_folded_file_is_the_one_onnx_save_model_writes(tmp_path):
    model = _model()
    graph, data = _streamed(model, tmp_path)
    fold_external_data(graph, data, tmp_path / "one.onnx")
    written = (tmp_path / "one.onnx").read_bytes()
    assert _top_level_fields(written).count(7) == 1, "the graph must be one field (netron keeps only the last)"
    folded = onnx.load(str(tmp_path / "one.onnx"))
    assert written == folded.SerializeToString()  # canonical: what protobuf itself writes for this model
    assert [t.name for t in folded.graph.initializer] == ["small", "big_a", "big_b"]
    assert [n.name for n in folded.graph.node] == [n.name for n in model.graph.node]
    assert {p.key: p.value for p in folded.metadata_props} == {"workbench.writer": "test"}
    assert [v.name for v in folded.graph.value_info] == ["h"] and folded.opset_import[0].version == 17
    for mine, theirs in zip(folded.graph.initializer, model.graph.initializer):
        assert mine.data_location == TensorProto.DEFAULT and not mine.external_data
        assert np.array_equal(numpy_helper.to_array(mine), numpy_helper.to_array(theirs))
    onnx.checker.check_model(folded, full_check=True)
    x = np.ones((2, 16), np.float32)
    ours = ort.InferenceSession(str(tmp_path / "one.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    onnx.save_model(model, str(tmp_path / "plain.onnx"))
    plain = ort.InferenceSession(str(tmp_path / "plain.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(ours[0], plain[0])


def test_a_data_file_shorter_than_its_tensors_is_refused_by_name(tmp_path):
    graph, data = _streamed(_model(), tmp_path)
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ValueError, match="'big_b'.*ends .*before"):
        fold_external_data(graph, data, tmp_path / "one.onnx")


def test_a_tensor_in_another_data_file_is_refused_by_name(tmp_path):
    graph, data = _streamed(_model(), tmp_path)
    other = data.with_name("other.data")
    data.rename(other)
    with pytest.raises(ValueError, match="'big_a' is in 'g.onnx.data', expected 'other.data'"):
        fold_external_data(graph, other, tmp_path / "one.onnx")
