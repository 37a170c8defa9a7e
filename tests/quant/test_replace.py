"""replace_to_quantization_module, quant_modules.initialize and the enable/disable switches."""
import re

import pytest
import torch
from torch import nn

from workbench import quant
from workbench.quant import nn as quant_nn
from workbench.quant import quant_modules


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer1 = Block()
        self.layer10 = Block()
        self.head = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))

    def forward(self, x):
        x = self.stem(x)
        return self.head(self.layer1(x) + self.layer10(x))


QUANTIZABLE = ["stem", "layer1.conv", "layer1.pool", "layer1.fc", "layer10.conv", "layer10.pool", "layer10.fc",
               "head.0", "head.2"]


def test_replaces_every_quantizable_layer_in_model_order():
    model = Net()
    report = quant.replace_to_quantization_module(model)
    assert report.replaced_names == ["stem", "layer1.conv", "layer1.pool", "layer1.fc", "layer10.conv",
                                     "layer10.pool", "layer10.fc", "head.0", "head.2"]
    assert report.ignored == []
    assert isinstance(model.layer1.conv, quant_nn.QuantConv2d)
    assert isinstance(model.layer1.bn, nn.BatchNorm2d)
    assert report.replaced[0].float_type == "Conv2d" and report.replaced[0].quant_type == "QuantConv2d"


def test_state_dict_keys_survive():
    model = Net()
    before = set(model.state_dict())
    quant.replace_to_quantization_module(model)
    after = set(model.state_dict())
    assert before <= after
    assert all(".weight_quantizer" not in k for k in after)  # quantizers have no state until calibrated


def test_outputs_unchanged_with_quantizers_disabled():
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    reference = model(x)
    quant.replace_to_quantization_module(model)
    with quant.disable_quantization(model):
        assert torch.equal(model(x), reference)
    assert not torch.equal(model(x), reference)


@pytest.mark.parametrize("policy, ignored", [
    ("layer1", ["layer1.conv", "layer1.pool", "layer1.fc", "layer10.conv", "layer10.pool", "layer10.fc"]),
    (r"layer1\.", ["layer1.conv", "layer1.pool", "layer1.fc"]),
    ([r"stem", r"head\.2"], ["stem", "head.2"]),
    ((r".*\.fc",), ["layer1.fc", "layer10.fc"]),
    (lambda name: name.endswith("pool"), ["layer1.pool", "layer10.pool"]),
])
def test_ignore_policy_forms(policy, ignored):
    model = Net()
    report = quant.replace_to_quantization_module(model, ignore_policy=policy)
    assert report.ignored_names == ignored
    assert sorted(report.replaced_names + report.ignored_names) == sorted(QUANTIZABLE)
    for name in ignored:
        assert not isinstance(model.get_submodule(name), (quant_nn.QuantConv2d, quant_nn.QuantLinear,
                                                          quant_nn.QuantAdaptiveAvgPool2d))


def test_ignore_reason_names_the_pattern():
    report = quant.replace_to_quantization_module(Net(), ignore_policy=["nothing", r"head\.0"])
    assert report.ignored[0].reason == r"head\.0"


def test_bad_ignore_policies():
    with pytest.raises(ValueError, match=re.escape("'conv[' is not a valid regular expression")):
        quant.replace_to_quantization_module(Net(), ignore_policy="conv[")
    with pytest.raises(TypeError, match="ignore_policy"):
        quant.replace_to_quantization_module(Net(), ignore_policy=3)


def test_user_class_is_not_patched_and_subclasses_are_left_alone():
    class MyConv(nn.Conv2d):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(MyConv(3, 3, 1), nn.Conv2d(3, 3, 1))
    report = quant.replace_to_quantization_module(model)
    assert report.replaced_names == ["1"]
    assert type(model[0]) is MyConv
    assert MyConv.forward is not quant_nn.QuantConv2d.forward
    assert [(n.name, n.float_type, n.reason.split(" (")[0]) for n in report.not_quantizable] == [
        ("0", "MyConv", "not quantizable: custom forward")]
    assert "MyConv replaces Conv2d's forward, so it may compute something else" in report.not_quantizable[0].reason
    assert "1 not quantizable" in report.summary()


class TimmLinear(nn.Linear):
    """timm.layers.Linear's shape: a forward that only hands on to nn.Linear's."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Same computation as nn.Linear."""
        return super().forward(input)


class KeywordLinear(nn.Linear):
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


class PlainSubclass(nn.Linear):
    pass


class OwnConvForward(nn.Conv2d):
    def _conv_forward(self, input, weight, bias):
        return super()._conv_forward(input, weight.flip(-1), bias)


class Other(nn.Linear):
    def forward(self, input):
        return super().forward(input.relu())


def test_subclasses_that_compute_the_same_are_quantized_and_the_others_listed_with_why():
    mha = nn.MultiheadAttention(8, 2)
    model = nn.ModuleDict({"out_proj": mha.out_proj, "timm": TimmLinear(8, 8), "kw": KeywordLinear(8, 8),
                           "plain": PlainSubclass(8, 8), "conv": OwnConvForward(8, 8, 1), "relu_first": Other(8, 8)})
    x = torch.randn(3, 8)
    before = {k: model[k](x) for k in ("out_proj", "timm", "kw", "plain")}
    report = quant.replace_to_quantization_module(model)
    assert report.replaced_names == ["out_proj", "timm", "kw", "plain"]
    assert report.replaced[0].float_type == "NonDynamicallyQuantizableLinear"
    assert all(type(model[k]) is quant_nn.QuantLinear for k in before)
    assert {n.name: n.reason.split(" (")[0] for n in report.not_quantizable} == {
        "conv": "not quantizable: custom _conv_forward", "relu_first": "not quantizable: custom forward"}
    with quant.disable_quantization(model):  # the same computation as the float subclass
        for k, y in before.items():
            assert torch.equal(model[k](x), y)


def test_weight_normed_layers_are_quantized_on_their_computed_weight_and_keep_their_keys(tmp_path):
    """torch's weight_norm (HF wav2vec2's, HuBERT's and WavLM's pos_conv_embed.conv) makes a ParametrizedConv1d
    whose weight is a property; it was left float ("custom __getstate__"): the last of wav2vec2's 16 GEMMs."""
    import copy

    from torch.nn.utils.parametrizations import weight_norm

    from workbench.quant.algorithms.calibrate import calibrate

    torch.manual_seed(0)
    model = nn.Sequential(weight_norm(nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight", dim=2)).eval()
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        reference = model(x)
    keys = list(model.state_dict())
    report = quant.replace_to_quantization_module(model)
    assert report.replaced_names == ["0"] and report.not_quantizable == []
    layer = model[0]
    assert isinstance(layer, quant_nn.QuantConv1d) and list(model.state_dict())[:len(keys)] == keys
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(x), reference)
    calibrate(model, [x], num_batches=None, method="max", report_sqnr=False)
    # the weight quantizer saw the computed weight (g * v / |v|), per output channel
    computed = layer.weight.detach().abs().amax(dim=(1, 2))
    assert torch.allclose(layer._weight_quantizer.amax.flatten(), computed)
    with torch.no_grad():
        quantized = model(x)
        assert not torch.equal(quantized, reference)
        assert torch.equal(copy.deepcopy(model)(x), quantized)


def test_tree_marks_subclasses_quantizable_or_says_why_not():
    from workbench.graph.tree import describe_model

    tree = describe_model(nn.Sequential(TimmLinear(4, 4), Other(4, 4)))
    assert tree.by_name["0"].quantizable and tree.by_name["0"].quant_type == "QuantLinear"
    assert not tree.by_name["1"].quantizable and len(tree.by_name["1"].notes) == 1
    assert tree.by_name["1"].notes[0].startswith("not quantizable: custom forward (Other replaces Linear's forward")


def test_top_level_layer_is_refused():
    with pytest.raises(ValueError, match="from_float"):
        quant.replace_to_quantization_module(nn.Conv2d(1, 1, 1))


def test_custom_descriptors():
    model = Net()
    quant.replace_to_quantization_module(model, quant_desc_input=quant.QuantDescriptor(calib_method="histogram"))
    assert type(model.stem.input_quantizer._calibrator).__name__ == "HistogramCalibrator"
    assert model.stem.weight_quantizer.axis == 0


def test_per_layer_descriptors():
    model = Net()

    def choose(name, module):
        if name == "stem":
            return quant.QuantDescriptor(num_bits=4), quant.QuantDescriptor(num_bits=6, axis=0)
        return None, None

    quant.replace_to_quantization_module(model, descriptor_for=choose,
                                         quant_desc_input=quant.QuantDescriptor(calib_method="histogram"))
    assert model.stem.input_quantizer.num_bits == 4 and model.stem.weight_quantizer.num_bits == 6
    assert model.layer1.conv.input_quantizer.num_bits == 8
    assert type(model.layer1.conv.input_quantizer._calibrator).__name__ == "HistogramCalibrator"


def test_initialize_and_deactivate():
    quant_modules.initialize(float_module_list=["Linear"])
    try:
        conv, linear = nn.Conv2d(2, 2, 1), nn.Linear(2, 2)
    finally:
        quant_modules.deactivate()
    assert isinstance(conv, quant_nn.QuantConv2d)
    assert type(linear) is quant_modules.FLOAT_CLASSES["Linear"]
    assert nn.Conv2d is quant_modules.FLOAT_CLASSES["Conv2d"]
    with pytest.raises(ValueError, match="not replaced anyway"):
        quant_modules.initialize(float_module_list=["Conv9d"])


class TestSwitches:
    def quantized(self):
        model = Net()
        quant.replace_to_quantization_module(model)
        return model

    def test_context_managers_restore_exact_state(self):
        model = self.quantized()
        model.layer1.conv.input_quantizer.disable()
        model.stem.weight_quantizer.disable_quant()
        before = quant.quantizer_state(model)
        with quant.enable_quantization(model):
            assert all(not disabled for disabled, _, _ in quant.quantizer_state(model).values())
        assert quant.quantizer_state(model) == before
        with quant.disable_quantization(model.layer1):
            state = quant.quantizer_state(model)
            assert all(state[name][0] for name in state if name.startswith("layer1."))
            assert not state["layer10.conv._input_quantizer"][0]
        assert quant.quantizer_state(model) == before

    def test_restores_after_an_exception(self):
        model = self.quantized()
        before = quant.quantizer_state(model)
        with pytest.raises(RuntimeError):
            with quant.disable_quantization(model):
                raise RuntimeError("boom")
        assert quant.quantizer_state(model) == before

    def test_apply_style_of_the_reference_scripts(self):
        model = self.quantized()
        quant.disable_quantization(model.stem).apply()
        assert model.stem.input_quantizer._disabled
        quant.enable_quantization(model.stem).apply()
        assert not model.stem.input_quantizer._disabled
        quant.disable_quantization(model.stem).apply(False)
        assert not model.stem.input_quantizer._disabled


class WrittenOutLinear(nn.Linear):
    """Hugging Face FalconLinear's shape: nn.Linear's formula written out in a forward of its own."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        hidden_states = input @ self.weight.T
        if self.bias is None:
            return hidden_states
        return hidden_states + self.bias


class TransposedLinear(nn.Linear):
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # looks alike, computes something else
        square = self.weight.shape[0] == self.weight.shape[1]
        return (input @ self.weight if square else input @ self.weight.T) + self.bias


def test_a_forward_that_writes_the_linear_formula_out_is_quantized_and_one_that_differs_is_not():
    model = nn.ModuleDict({"falcon": WrittenOutLinear(8, 8), "no_bias": WrittenOutLinear(8, 4, bias=False),
                           "other": TransposedLinear(8, 8)})
    x = torch.randn(3, 8)
    before = {k: model[k](x) for k in ("falcon", "no_bias")}
    report = quant.replace_to_quantization_module(model)
    assert report.replaced_names == ["falcon", "no_bias"]
    assert [(n.name, n.reason.split(" (")[0]) for n in report.not_quantizable] == [
        ("other", "not quantizable: custom forward")]
    with quant.disable_quantization(model):
        for k, y in before.items():
            assert torch.allclose(model[k](x), y, atol=1e-6)
