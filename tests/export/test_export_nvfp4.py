"""NVFP4 written as TensorRT 10.8+ reads it (FLOAT4E2M1 weights, two-level DequantizeLinear, TensorRT's dynamic FP4
quantizer, opset 23) and validated on onnx's reference evaluator; FP8 weights stored as FP8 initializers; INT4,
FP4 and FP8 initializers packed in raw_data (so the external-data save moves them)."""
import json
import textwrap

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.cli_run import run
from tests.export.test_export_precisions import initializer_types, quantized
from workbench.export import export_qdq_onnx
from workbench.export.fp4 import fold_low_precision_casts, pack_raw_data, reference_session
from workbench.quant.algorithms.precision import Precision


def _nodes(proto, op_type):
    return [n for n in proto.graph.node if n.op_type == op_type]


def _attributes(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_nvfp4_gemms_export_fp4_weights_fp8_block_scales_and_dynamic_activations(tmp_path):
    model, x = quantized({"conv": Precision.INT8, "fc1": Precision.NVFP4, "fc2": Precision.NVFP4})
    path = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, x, path)
    assert report.opset == 23 and report.formats == {"int8": 2, "nvfp4": 4}
    assert report.qdq_by_format == {"int8": 2, "fp8": 0, "int4": 0, "nvfp4": 8}  # two DequantizeLinear each
    assert any("reference evaluator" in n for n in report.notes)
    assert report.cosine > 0.99999 and report.max_abs_diff < 1e-5
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    inits = {i.name: i for i in proto.graph.initializer}
    assert "fc1.weight" not in inits and "fc2.weight" not in inits  # the float weights are gone
    fp4 = [i for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT4E2M1]
    assert sorted(tuple(i.dims) for i in fp4) == [(10, 40), (40, 288)]
    assert all(len(i.raw_data) == np.prod(i.dims) // 2 and not i.int32_data for i in fp4)  # two values a byte
    for weight in fp4:
        (dq,) = [n for n in _nodes(proto, "DequantizeLinear") if n.input[0] == weight.name]
        assert _attributes(dq)["block_size"] == 16 and _attributes(dq)["axis"] == 1
        scale_dq = next(n for n in proto.graph.node if dq.input[1] in n.output)
        assert scale_dq.op_type == "DequantizeLinear" and len(scale_dq.input) == 2
        scales = inits[scale_dq.input[0]]
        assert scales.data_type == TensorProto.FLOAT8E4M3FN and tuple(scales.dims) == (weight.dims[0], -(
            -weight.dims[1] // 16))
        assert inits[scale_dq.input[1]].dims == [] and inits[scale_dq.input[1]].data_type == TensorProto.FLOAT
        values = numpy_helper.to_array(weight).astype(np.float32)
        assert set(np.unique(np.abs(values))) <= {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}
    dynamic = _nodes(proto, "TRT_FP4DynamicQuantize")
    assert len(dynamic) == 2 and all(n.domain == "trt" for n in dynamic)
    assert all(_attributes(n) == {"axis": -1, "block_size": 16, "scale_type": TensorProto.FLOAT8E4M3FN}
               for n in dynamic)
    assert {e.domain: e.version for e in proto.opset_import}["trt"] == 1
    # the reference evaluator (with this project's TRT_FP4DynamicQuantize) runs the file as the fake-quant model
    session = reference_session(str(path))
    with torch.no_grad():
        expected = model(x).numpy()
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert np.abs(out - expected).max() < 1e-5


def test_nvfp4_on_a_convolution_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="nvfp4 is for weight GEMMs"):
        quantized({"conv": Precision.NVFP4})


def test_fp8_weights_are_fp8_initializers_with_no_quantize_linear(tmp_path):
    model, x = quantized({"conv": Precision.FP8, "fc1": Precision.FP8, "fc2": Precision.FP8})
    path = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, x, path)
    assert report.cosine > 0.99999
    proto = onnx.load(str(path))
    types = initializer_types(proto)
    assert not {"conv.weight", "fc1.weight", "fc2.weight"} & set(types)
    weights = [i for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT8E4M3FN and len(i.dims) >= 2]
    assert sorted(tuple(i.dims) for i in weights) == [(8, 3, 3, 3), (10, 40), (40, 288)]
    assert all(len(i.raw_data) == np.prod(i.dims) for i in weights)  # one byte a weight
    assert report.quantize_nodes == 3  # the activations' only
    # a quarter of the float weights' bytes, plus the scales and biases
    float_bytes = 4 * sum(p.numel() for p in model.parameters())
    stored = sum(len(i.raw_data) for i in proto.graph.initializer)
    assert stored < 0.3 * float_bytes


def test_int4_weights_are_packed_in_raw_data_and_move_to_the_external_data(tmp_path):
    model, x = quantized({"fc1": Precision.INT4W, "fc2": Precision.INT4W})
    path = tmp_path / "m.onnx"
    export_qdq_onnx(model, x, path)
    proto = onnx.load(str(path))
    int4 = [i for i in proto.graph.initializer if i.data_type == TensorProto.INT4]
    assert sorted(tuple(i.dims) for i in int4) == [(10, 40), (40, 288)]
    assert all(len(i.raw_data) == np.prod(i.dims) // 2 and not i.int32_data for i in int4)
    # over the threshold the weights go to the data file, the INT4 ones too (fc2's 200 bytes are below the size
    # that the external-data save leaves inside the graph)
    big = tmp_path / "big.onnx"
    report = export_qdq_onnx(model, x, big, external_data_threshold=1024)
    graph = onnx.load(str(big), load_external_data=False)
    moved = {i.name: i for i in graph.graph.initializer if i.data_location == TensorProto.EXTERNAL}
    int4 = moved["fc1._weight_quantizer.int4_weight"]
    assert int4.data_type == TensorProto.INT4
    assert {e.key: e.value for e in int4.external_data}["length"] == str(40 * 288 // 2)
    assert report.cosine > 0.99999  # validated from the data file
    # the data file holds the tensors that point to it and nothing else (the first, unpacked INT4 bytes the
    # exporter streamed are dropped), so its size is the sum of their lengths
    lengths = [int({e.key: e.value for e in i.external_data}["length"]) for i in moved.values()]
    assert (tmp_path / "big.onnx.data").stat().st_size == sum(lengths)
    loaded = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(big)).graph.initializer}
    small = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    assert np.array_equal(loaded["fc1._weight_quantizer.int4_weight"], small["fc1._weight_quantizer.int4_weight"])


def test_pack_raw_data_and_fold_casts_keep_the_values():
    values = np.array([[-8, 7, 0], [3, -1, 2]], dtype=np.int8)
    legacy = helper.make_tensor("w", TensorProto.INT4, values.shape, values.reshape(-1))  # int32_data
    grid = np.array([[0.5, -6.0, 3.0, 1.5]], dtype=np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["g"], ["g4"], to=TensorProto.FLOAT4E2M1),
         helper.make_node("DequantizeLinear", ["g4", "s"], ["y"], axis=1, block_size=4),
         helper.make_node("DequantizeLinear", ["w", "z"], ["v"])],
        "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                  helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
        [legacy, numpy_helper.from_array(grid, "g"), numpy_helper.from_array(np.ones((1, 1), np.float32), "s"),
         numpy_helper.from_array(np.array(2.0, np.float32), "z")]))
    assert len(model.graph.initializer[0].int32_data) == 3  # packed, but 4 bytes per pair
    assert fold_low_precision_casts(model) == 1 and pack_raw_data(model) == 1
    inits = {i.name: i for i in model.graph.initializer}
    assert "g" not in inits and inits["g4"].data_type == TensorProto.FLOAT4E2M1 and len(inits["g4"].raw_data) == 2
    assert np.array_equal(numpy_helper.to_array(inits["g4"]).astype(np.float32), grid)
    assert len(inits["w"].raw_data) == 3 and not inits["w"].int32_data
    assert np.array_equal(numpy_helper.to_array(inits["w"]).astype(np.int8), values)
    assert numpy_helper.to_array(inits["w"]).dtype == ml_dtypes.int4


CHAIN = textwrap.dedent("""
    import torch
    from torch import nn

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(64, 64), nn.Linear(64, 48), nn.Linear(48, 8)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    def make():
        torch.manual_seed(0)
        return Chain()
""")


def test_cli_set_precision_nvfp4_exports_fp4_weights_that_validate_and_lint_names_blackwell(tmp_path, capsys):
    (tmp_path / "chain.py").write_text(CHAIN)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 64), dtype=np.float32))
    path = tmp_path / "chain.qwb"
    assert run(capsys, "new", path, "--model", f"{tmp_path}/chain.py:make", "--data", tmp_path / "x.npy",
               "--batch-size", "8", "--trust-code")[0] == 0
    code, out, err = run(capsys, "set", path, "--pattern", "a|b", "--precision", "nvfp4")
    assert code == 0, err
    assert "precision nvfp4: a, b" in out
    code, out, err = run(capsys, "show", path, "--json")
    rows = {row["name"]: row for row in json.loads(out)["layer_table"]}
    assert rows["a"]["precision"] == "nvfp4" and rows["c"]["precision"] == "int8"
    assert rows["a"]["weight_summary"].startswith("fp4 block 16")
    assert run(capsys, "calibrate", path, "--method", "max")[0] == 0
    code, out, err = run(capsys, "export", path, "-o", tmp_path / "chain.onnx")
    assert code == 0, err
    proto = onnx.load(str(tmp_path / "chain.onnx"))
    fp4 = {i.name for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT4E2M1}
    assert len(fp4) == 2 and len(_nodes(proto, "TRT_FP4DynamicQuantize")) == 2
    code, out, err = run(capsys, "lint", path, "--json")
    assert code == 0, err
    needs = [w for w in json.loads(out)["warnings"] if w["kind"] == "format_needs"]
    (nvfp4,) = [w for w in needs if "NVFP4" in w["message"]]
    assert nvfp4["modules"] == ["a", "b"] and "10.8" in nvfp4["message"] and "Blackwell" in nvfp4["message"]


def test_a_weight_pre_quantization_scale_is_in_the_stored_fp8_and_fp4_weights(tmp_path):
    """SmoothQuant/AWQ-style per-input scales on a weight quantizer: the stored weight is the scaled one."""
    model, x = quantized({"fc1": Precision.FP8, "fc2": Precision.NVFP4})
    for name in ("fc1", "fc2"):
        layer = getattr(model, name)
        layer._weight_quantizer.pre_quant_scale = torch.linspace(0.5, 2, layer.weight.shape[1])
    report = export_qdq_onnx(model, x, tmp_path / "m.onnx")
    assert report.cosine > 0.99999 and report.max_abs_diff < 1e-5
    types = initializer_types(onnx.load(str(tmp_path / "m.onnx")))
    assert types["fc1._weight_quantizer.values"] == TensorProto.FLOAT8E4M3FN
    assert types["fc2._weight_quantizer.values"] == TensorProto.FLOAT4E2M1
