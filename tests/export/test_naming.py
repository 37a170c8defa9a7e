"""ONNX node names after module paths: what TensorRT's layer names are built from."""
import onnx
import pytest
import torch
from onnx import helper
from zoo import PlainCNN

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.export.naming import (
    MODULE_KEY,
    QUANTIZER_KEY,
    layer_of_quantizer,
    module_of_engine_part,
    module_of_node_name,
    name_nodes_by_module,
    node_module,
    split_engine_layer_name,
)
from workbench.quant.algorithms.calibrate import calibrate


def calibrated_plain_cnn():
    torch.manual_seed(0)
    model = PlainCNN().eval()
    quant.replace_to_quantization_module(model)
    batches = [torch.randn(2, 3, 16, 16) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches[0]


def metadata(node):
    return {p.key: p.value for p in node.metadata_props}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model, x = calibrated_plain_cnn()
    folder = tmp_path_factory.mktemp("naming")
    graphs = {}
    for exporter in ("dynamo", "torchscript"):
        path = folder / f"{exporter}.onnx"
        export_qdq_onnx(model, x, path, exporter=exporter)  # opset 17: the dynamo graph is converted down
        graphs[exporter] = onnx.load(str(path))
    return graphs


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_compute_nodes_are_named_after_their_module(exported, exporter):
    graph = exported[exporter].graph
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert [n.name for n in convs] == ["features.0/Conv", "features.3/Conv"]
    assert [metadata(n)[MODULE_KEY] for n in convs] == ["features.0", "features.3"]
    relus = [n.name for n in graph.node if n.op_type == "Relu"]
    assert relus == ["features.2/Relu", "features.4/Relu"]
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert gemm.name == "fc/Gemm"
    names = [n.name for n in graph.node]
    assert len(names) == len(set(names)) and all(names)
    # only a node an optimiser made up without any scope (TorchScript's flatten, rewritten) keeps its name
    unnamed = [n for n in graph.node if n.name.startswith("node_")]
    assert all("pkg.onnxscript.rewriter.rule_name" in metadata(n) for n in unnamed)
    assert len(unnamed) <= (1 if exporter == "torchscript" else 0)


def test_qdq_nodes_keep_their_quantizer_names(exported):
    graph = exported["dynamo"].graph
    q = next(n for n in graph.node if n.name == "features.3._input_quantizer/QuantizeLinear")
    assert metadata(q)[QUANTIZER_KEY] == "features.3._input_quantizer"
    assert metadata(q)[MODULE_KEY] == "features.3"
    qdq = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert all("_quantizer/" in n.name for n in qdq)


def test_the_pass_is_stable_and_keeps_names_unique():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="node_relu"),
        helper.make_node("Relu", ["a"], ["b"], name="node_relu_1"),
        helper.make_node("Relu", ["b"], ["c"], name="block.act/Relu"),  # taken by a node without scope info
        helper.make_node("Add", ["c", "x"], ["y"], name="node_add"),
    ]
    for node, scopes in zip(nodes[:2], (["", "block.act", "relu"], ["", "block.act", "relu_1"])):
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", repr(scopes)
    entry = nodes[3].metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", repr(["", "add"])
    nodes[2].name = "keep_me"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    name_nodes_by_module(model)
    first = [n.name for n in model.graph.node]
    assert first == ["block.act/Relu", "block.act/Relu_1", "keep_me", "/Add"]
    name_nodes_by_module(model)
    assert [n.name for n in model.graph.node] == first
    assert node_module(model.graph.node[3]) == ""


def test_names_map_back_to_modules():
    assert module_of_node_name("stem.0/Conv") == "stem.0"
    assert module_of_node_name("blocks.0.attn/MatMul_1") == "blocks.0.attn"
    assert module_of_node_name("/features/features.0/Conv_2") == "features.0"
    assert module_of_node_name("/Reshape") == ""
    # TorchScript writes each module's path from its last non-numeric part on
    assert module_of_node_name("/blocks/blocks.0/attn/qkv/MatMul") == "blocks.0.attn.qkv"
    assert module_of_node_name("/layer1/layer1.0/downsample/downsample.0/Conv") == "layer1.0.downsample.0"
    assert module_of_node_name("/0/0.1/conv/Conv") == "0.1.conv"
    assert module_of_node_name("/a/b/b/Relu") == "a.b.b"
    # an nn.ModuleList is never called, so it has no scope: encoder.layer is a ModuleList of Sequentials
    assert module_of_node_name("/encoder/layer.0/layer.0.0/Gemm") == "encoder.layer.0.0"
    assert module_of_node_name("node_conv2d_2") is None
    assert module_of_node_name("block.add._input1_quantizer/DequantizeLinear") == "block.add"
    assert layer_of_quantizer("lstm._input_quantizers.0") == ("lstm", "input")
    assert layer_of_quantizer("fc._weight_quantizer") == ("fc", "weight")
    known = ["stem.0", "block.conv1", "fc"]
    assert module_of_engine_part("stem.0/Conv", known) == "stem.0"
    assert module_of_engine_part("stem.0.inner/Mul", known) == "stem.0"  # a child maps to its layer
    assert module_of_engine_part("stem.2/Relu", known) is None


def test_engine_layer_names_split_into_onnx_nodes():
    assert split_engine_layer_name("stem.0/Conv + stem.2/Relu") == ["stem.0/Conv", "stem.2/Relu"]
    assert split_engine_layer_name("PWN(PWN(a/Sigmoid, a/Mul), b/Add)") == ["a/Sigmoid", "a/Mul", "b/Add"]
    assert split_engine_layer_name("{ForeignNode[blocks.0.attn/MatMul...blocks.0.attn/Softmax]}") == [
        "blocks.0.attn/MatMul", "blocks.0.attn/Softmax"]
    assert split_engine_layer_name("Reformatting CopyNode for Input Tensor 0 to fc/Gemm") == ["fc/Gemm"]
    assert split_engine_layer_name("stem.0/Conv [profile 1]") == ["stem.0/Conv"]


def test_a_scope_torch_export_adds_itself_is_not_taken_for_a_module():
    """Shape computations torch.export adds sit in a scope of its own: they belong to the top level."""
    from workbench.export.naming import node_module

    node = onnx.helper.make_node("Shape", ["x"], ["s"], name="node_Shape_0")
    entry = node.metadata_props.add()
    entry.key = "pkg.torch.onnx.name_scopes"
    entry.value = "['', '_empty_nn_module_stack_from_metadata_hook', 'sym_size_int']"
    assert node_module(node) == ""


def test_the_file_carries_no_python_stack_traces(exported):
    """The exporter's stack traces name files and lines of the machine that exported; they are not shipped."""
    for graph in exported.values():
        assert not any(p.key == "pkg.torch.onnx.stack_trace" for n in graph.graph.node for p in n.metadata_props)
        assert any(p.key == MODULE_KEY for n in graph.graph.node for p in n.metadata_props)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_operations_of_a_traced_module_are_named_after_it(tmp_path, exporter):
    """The functional rewrite replaces an attention module by a GraphModule, whose forward torch.export would
    inline into its parent without a scope: its softmax must still read blocks.0.attn/Softmax."""
    import sys
    from pathlib import Path

    import torch.fx as fx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
    import models as transformers_zoo

    from workbench.graph import prepare_for_tensorrt

    torch.manual_seed(0)
    images = transformers_zoo.images(2)
    model, _ = prepare_for_tensorrt(transformers_zoo.ViTLike(depth=1).eval(), example_inputs=(images,))
    assert isinstance(model.blocks[0].attn, fx.GraphModule)
    calibrate(model, [images], num_batches=1, method="max", report_sqnr=False)
    export_qdq_onnx(model, images, tmp_path / "vit.onnx", exporter=exporter)
    names = [n.name for n in onnx.load(str(tmp_path / "vit.onnx")).graph.node]
    assert "blocks.0.attn/Softmax" in names and "blocks.0.attn.matmul_1/MatMul" in names
    assert not any(name.startswith("blocks.0/") and "Softmax" in name for name in names)
    assert isinstance(model.blocks[0].attn, fx.GraphModule)  # the model is as it was after the export
