"""describe_model: rows, parameter counts, quantizable flags and quantizer state."""
import torch
from torch import nn

from workbench import quant
from workbench.graph import describe_model, insert_functional_quantizers
from workbench.quant import QuantDescriptor
from workbench.sources.demo import ResNetLike


def small_resnet():
    torch.manual_seed(0)
    return ResNetLike((1, 1), width=8, num_classes=10).eval()


def test_float_model_rows_types_and_parameters():
    model = small_resnet()
    tree = describe_model(model)
    names = [m.name for m in tree]
    # every module once, in model order, the model itself first
    assert names == [name for name, _ in model.named_modules(remove_duplicate=False)]
    assert tree.root.name == "" and tree.root.type_name == "ResNetLike" and tree.root.parent is None
    assert tree.root.total_params == sum(p.numel() for p in model.parameters())
    conv = tree["layer1.0.conv1"]
    assert conv.type_name == "Conv2d" and conv.parent == "layer1.0" and conv.depth == 3
    assert conv.num_params == model.layer1[0].conv1.weight.numel()
    assert conv.quantizable and not conv.quantized and conv.quant_type == "QuantConv2d"
    assert not tree["layer1.0.bn1"].quantizable
    assert tree["layer1"].children == ("layer1.0",)
    assert tree["layer1.0"].total_params == sum(p.numel() for p in model.layer1[0].parameters())


def test_quantized_model_lists_quantizers_on_their_layer():
    model = small_resnet()
    quant.replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    model.fc._input_quantizer.disable()
    model.conv1._input_quantizer.amax = 2.5
    tree = describe_model(model)
    assert not any(m.name.endswith("_quantizer") for m in tree)  # quantizers are not rows
    conv1 = tree["conv1"]
    assert conv1.quantized and conv1.quant_type == "QuantConv2d"
    inp, weight = conv1.quantizers
    assert (inp.name, inp.attr, inp.owner) == ("conv1._input_quantizer", "_input_quantizer", "conv1")
    assert inp.has_amax and inp.amax == "2.5" and inp.calibrator == "HistogramCalibrator" and inp.active
    assert weight.axis == 0 and weight.amax == "dynamic" and weight.calibrator == "MaxCalibrator"
    fc_input = tree["fc"].quantizers[0]
    assert not fc_input.enabled and not fc_input.active
    assert len(tree.quantizers()) == sum(1 for m in model.modules() if isinstance(m, quant.TensorQuantizer))
    assert tree["avgpool"].quant_type == "QuantAdaptiveAvgPool2d" and len(tree["avgpool"].quantizers) == 1


def test_functional_quantizers_and_shared_quantizers_are_described():
    model = small_resnet()
    quant.replace_to_quantization_module(model)
    model, _ = insert_functional_quantizers(model)
    model.layer1[0].add._input1_quantizer = model.layer1[0].conv1._input_quantizer
    tree = describe_model(model)
    add = tree["layer1.0.add"]
    assert add.type_name == "QuantAdd" and add.quantized
    assert [q.attr for q in add.quantizers] == ["_input0_quantizer", "_input1_quantizer"]
    assert add.quantizers[1].shared_with == ("layer1.0.conv1._input_quantizer",)
    assert tree["layer1.0"].traced and tree["layer1.0"].type_name == "BasicBlock"


def test_lstm_quantizers_per_layer():
    model = nn.Sequential(nn.LSTM(4, 6, num_layers=2))
    quant.replace_to_quantization_module(model)
    row = describe_model(model)["0"]
    assert [q.attr for q in row.quantizers] == ["_input_quantizers.0", "_input_quantizers.1",
                                                "_weight_quantizers.0", "_weight_quantizers.1"]


def test_tied_parameters_counted_once():
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.Sequential(embed, head)
    tree = describe_model(model)
    assert tree.root.total_params == 40
    assert tree["1"].num_params == 40


def test_ten_thousand_modules():
    # the bench (bench/graph_tree.py) times this size; here only the content is checked
    blocks = [nn.Sequential(nn.Conv2d(2, 2, 1), nn.ReLU(), nn.Linear(2, 2), nn.Identity()) for _ in range(2000)]
    model = nn.Sequential(*(nn.Sequential(*blocks[i:i + 100]) for i in range(0, 2000, 100)))
    quant.replace_to_quantization_module(model)
    tree = describe_model(model)
    assert len(tree) == 1 + 20 + 2000 * 5
    assert len(tree.quantizers()) == 2000 * 2 * 2
    assert tree.root.total_params == sum(p.numel() for p in model.parameters())
    assert "quantized" in tree.summary()
