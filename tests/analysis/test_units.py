"""Which quantizers make up a unit: every quantized layer by default, whatever its class, or groups."""
import pytest
from analysis_models import QuantAddLike
from torch import nn

from workbench import quant
from workbench.analysis import Unit, find_units, resolve_units
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QuantDescriptor


def test_default_units_are_the_quantized_layers_in_model_order(residual_model):
    units = find_units(residual_model)
    assert [u.name for u in units] == ["stem", "conv1", "conv2", "add", "pool", "fc"]
    assert units[0].quantizers == ("stem._input_quantizer", "stem._weight_quantizer")
    # a QuantAdd-style module is found by its quantizer children, not by its class
    assert units[3].quantizers == ("add._input0_quantizer", "add._input1_quantizer")


def test_quantizers_in_a_module_list_belong_to_their_layer():
    model = nn.Sequential(nn.LSTM(4, 6, num_layers=2))
    quant.replace_to_quantization_module(model)
    (unit,) = find_units(model)
    assert unit.name == "0"
    assert set(unit.quantizers) == {"0._input_quantizers.0", "0._input_quantizers.1",
                                    "0._weight_quantizers.0", "0._weight_quantizers.1"}


def test_disabled_quantizers_and_layers_left_in_float_are_not_units(residual_model):
    residual_model.conv1._input_quantizer.disable()
    residual_model.conv1._weight_quantizer.disable()
    residual_model.add._input1_quantizer.disable_quant()
    units = {u.name: u for u in find_units(residual_model)}
    assert "conv1" not in units
    assert units["add"].quantizers == ("add._input0_quantizer",)


def test_a_quantizer_shared_between_layers_belongs_to_both():
    add = QuantAddLike()
    other = QuantAddLike()
    other._input0_quantizer = add._input0_quantizer  # TensorRT scale sharing: one object, two owners
    model = nn.ModuleDict({"a": add, "b": other})
    units = {u.name: u for u in find_units(model)}
    assert units["a"].quantizers == ("a._input0_quantizer", "a._input1_quantizer")
    assert units["b"].quantizers == ("b._input0_quantizer", "b._input1_quantizer")
    assert model.get_submodule("b._input0_quantizer") is model.get_submodule("a._input0_quantizer")


def test_quantizers_held_by_the_model_itself_are_one_unit_each():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant_in = TensorQuantizer(QuantDescriptor())
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(self.quant_in(x))

    model = Net()
    quant.replace_to_quantization_module(model)
    assert [u.name for u in find_units(model)] == ["quant_in", "fc"]


def test_groups_by_subtree_list_and_mapping(residual_model):
    units = resolve_units(residual_model, ["conv1", ["conv2", "add"]])
    assert [u.name for u in units] == ["conv1", "conv2+add"]
    assert units[1].quantizers == ("conv2._input_quantizer", "conv2._weight_quantizer",
                                   "add._input0_quantizer", "add._input1_quantizer")
    (block,) = resolve_units(residual_model, {"block": ["conv1", "conv2"]})
    assert block.name == "block" and len(block.quantizers) == 4
    whole = resolve_units(residual_model, [""])[0]  # the root: every quantizer
    assert len(whole.quantizers) == 11
    explicit = Unit("mine", ("fc._input_quantizer",))
    assert resolve_units(residual_model, [explicit]) == [explicit]


def test_subtree_names_are_exact_not_substrings():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(11)])
    quant.replace_to_quantization_module(model)
    (unit,) = resolve_units(model, ["1"])
    assert unit.quantizers == ("1._input_quantizer", "1._weight_quantizer")  # not "10.*"


def test_bad_units_are_refused_with_a_useful_message(residual_model):
    with pytest.raises(ValueError, match="Did you mean .*'conv1'"):
        resolve_units(residual_model, ["conv"])
    with pytest.raises(ValueError, match="holds no quantizer"):
        resolve_units(residual_model, ["relu"])
    with pytest.raises(ValueError, match="unique"):
        resolve_units(residual_model, ["fc", "fc"])
    with pytest.raises(ValueError, match="no quantized layer"):
        resolve_units(nn.Linear(2, 2), None)
    with pytest.raises(TypeError):
        resolve_units(residual_model, "fc")
    with pytest.raises(ValueError, match="no module"):
        resolve_units(residual_model, [Unit("x", ("nope._input_quantizer",))])


def test_unit_round_trips_through_a_dict():
    unit = Unit("block", ("a._input_quantizer", "b._weight_quantizer"))
    assert Unit.from_dict(unit.to_dict()) == unit
