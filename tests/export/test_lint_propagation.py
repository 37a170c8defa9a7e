"""Lint knows what TensorRT's Q/DQ propagation moves: a Quantize crosses a MaxPool when every reader of the pool is
quantized, so conv-pool-conv is not isolation; an average pool left in float between INT8 layers is flagged."""
import torch
from test_lint import by_kind, lint
from torch import nn

from workbench.export.lint import LINT_KINDS, PROPAGATION_OPS
from workbench.quant.algorithms.tensorrt_rules import misaligned_channels
from workbench.quant.nn import QuantConv2d, QuantLinear
from workbench.quant.nn.modules.quant_ops import QuantAdd


class ConvPoolConv(nn.Module):
    """conv -> relu -> maxpool -> conv, the chain CREPE is made of."""

    def __init__(self, float_reader=False):
        super().__init__()
        self.conv1 = QuantConv2d(16, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = QuantConv2d(16, 16, 3, padding=1)
        self.add = QuantAdd()
        self.float_reader = float_reader
        if float_reader:  # the pool's output is also read in float (a residual add's float identity)
            self.add._input0_quantizer.disable()
            self.add._input1_quantizer.disable()

    def forward(self, x):
        pooled = self.pool(torch.relu(self.conv1(x)))
        out = torch.relu(self.conv2(pooled))
        return self.add(out, pooled) if self.float_reader else out


def test_conv_pool_conv_is_not_isolated(tmp_path):
    assert "MaxPool" in PROPAGATION_OPS
    assert by_kind(lint(ConvPoolConv(), tmp_path), "isolated_quantized_layer") == []


def test_a_float_reader_of_the_pool_keeps_the_quantize_after_it(tmp_path):
    """TensorRT can move the Quantize before the pool only when every reader of the pool wants it (the qat ResNet
    engine: conv1 writes FP32, MaxPool runs in FP32, because the first block's add reads the pool in float)."""
    warnings = lint(ConvPoolConv(float_reader=True), tmp_path)
    isolated = [w.modules for w in by_kind(warnings, "isolated_quantized_layer")]
    assert ["conv1"] in isolated  # (conv2, read only by the float add, is isolated too)


class PoolHead(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv = QuantConv2d(16, 32, 3, padding=1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = QuantLinear(32, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(torch.relu(self.conv(x))), 1))


def test_a_float_average_pool_between_int8_layers_is_flagged_with_its_fix(tmp_path):
    warnings = lint(PoolHead(), tmp_path)
    [pool] = by_kind(warnings, "float_pool_requantized")
    assert pool.kind in LINT_KINDS and pool.modules == ["avgpool"]
    assert "conv write its output in float" in pool.message
    assert (pool.fix.action, pool.fix.targets) == ("quantize", ("avgpool",))
    # fc reads the pool: the pool's warning covers it, fc is not "isolated" on top
    assert by_kind(warnings, "isolated_quantized_layer") == []


class ConvHead(nn.Module):
    """A 1x1 convolution to 1000 classes writing the network's output: its count is the task's, not a hazard."""

    def __init__(self):
        super().__init__()
        self.conv = QuantConv2d(16, 32, 3, padding=1)
        self.head = QuantConv2d(32, 1000, 1)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)))


def test_a_classifier_head_is_not_misaligned(tmp_path):
    assert misaligned_channels(32, 1000) is not None  # inside a network it would be
    assert misaligned_channels(32, 1000, output_is_result=True) is None
    assert by_kind(lint(ConvHead(), tmp_path, shape=(1, 16, 4, 4)), "misaligned_channels") == []
