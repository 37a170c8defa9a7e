"""The quantizer enumeration helpers every package uses (workbench.quant.algorithms.snapshot)."""
from __future__ import annotations

from torch import nn

from workbench.quant import nn as quant_nn
from workbench.quant.algorithms.snapshot import (
    all_quantizers,
    holds_quantizers,
    is_quantizing,
    owned_quantizers,
    quantizer_names,
)


def _shared_model() -> nn.Sequential:
    """Two convs whose input quantizers are one object, as a TensorRT scale-sharing rule leaves them."""
    model = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), nn.ReLU(), quant_nn.QuantConv2d(4, 4, 3))
    model[2]._modules["_input_quantizer"] = model[0]._input_quantizer
    return model


def test_quantizer_names_lists_a_shared_quantizer_under_each_name_first_name_first():
    model = _shared_model()
    names = quantizer_names(model)
    assert list(names) == ["0._input_quantizer", "0._weight_quantizer", "2._input_quantizer",
                           "2._weight_quantizer"]
    assert names["2._input_quantizer"] is names["0._input_quantizer"]
    assert len(all_quantizers(model)) == 3  # the objects, each once


def test_is_quantizing_is_false_when_disabled_or_quantization_is_off():
    conv = quant_nn.QuantConv2d(3, 4, 3)
    assert is_quantizing(conv._input_quantizer)
    conv._input_quantizer.disable()
    assert not is_quantizing(conv._input_quantizer)
    conv._weight_quantizer.disable_quant()  # calibrating only: passes values through
    assert not is_quantizing(conv._weight_quantizer)


def test_owned_quantizers_include_a_list_of_quantizers_but_not_deeper_ones():
    lstm = quant_nn.QuantLSTM(4, 4, num_layers=2)
    assert [name for name, _ in owned_quantizers(lstm)] == [
        "_input_quantizers.0", "_input_quantizers.1", "_weight_quantizers.0", "_weight_quantizers.1"]
    add = quant_nn.QuantAdd()
    assert [name for name, _ in owned_quantizers(add)] == ["_input0_quantizer", "_input1_quantizer"]
    block = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3))
    assert owned_quantizers(block) == []  # the conv's quantizers are the conv's, not the block's
    assert holds_quantizers(lstm) and holds_quantizers(block[0])
    assert not holds_quantizers(block) and not holds_quantizers(nn.Conv2d(3, 4, 3))
    assert not holds_quantizers(nn.Sequential())  # an empty container is no quantizer list
