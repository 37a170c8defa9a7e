"""Small quantized models for the analysis tests (one with a deliberately sensitive layer) and state checks."""
from __future__ import annotations

import torch
from torch import nn

from workbench import quant
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QuantDescriptor

SENSITIVE = "5"  # the layer of sensitive_net() whose input has the outlier channel


class OutlierChannel(nn.Module):
    """Multiplies channel 0 by a large factor, as some trained networks do to one channel."""

    def __init__(self, channels: int, factor: float) -> None:
        super().__init__()
        scale = torch.ones(channels)
        scale[0] = factor
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.view(1, -1, 1, 1)


def sensitive_net() -> nn.Sequential:
    """A small CNN whose layer 5 sees a 1000x outlier channel; its weights undo the factor, so the FP32
    output depends on every channel, but a per-tensor max-calibrated input quantizer on layer 5 rounds
    channels 1..7 to zero."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        OutlierChannel(8, 1000.0),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    with torch.no_grad():
        net[5].weight[:, 0] /= 1000.0
    return net.eval()


class QuantAddLike(nn.Module):
    """A residual add with one quantizer per input, held the way QuantAdd holds them (any class will do)."""

    def __init__(self) -> None:
        super().__init__()
        self._input0_quantizer = TensorQuantizer(QuantDescriptor())
        self._input1_quantizer = TensorQuantizer(QuantDescriptor())

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self._input0_quantizer(a) + self._input1_quantizer(b)


class ResidualNet(nn.Module):
    """conv, a residual block whose add is quantized, then a classifier head (traceable with torch.fx)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.add = QuantAddLike()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.stem(x))
        y = self.conv2(self.relu(self.conv1(x)))
        x = self.relu(self.add(y, x))
        return self.fc(torch.flatten(self.pool(x), 1))


def make_batches(count: int = 3, size: int = 4, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(size, 3, 8, 8, generator=generator) for _ in range(count)]


def quantized(model: nn.Module, batches: list) -> nn.Module:
    """``model`` with its layers quantized (inputs per tensor, max calibration) and calibrated."""
    quant.replace_to_quantization_module(model)
    calibrate(model, batches, num_batches=None, method="max", report_sqnr=False)
    return model.eval()


def quantizer_flags(model: nn.Module) -> dict[str, tuple]:
    return {name: (m._disabled, m._if_quant, m._if_calib)
            for name, m in model.named_modules() if isinstance(m, TensorQuantizer)}


def model_state(model: nn.Module) -> tuple[dict, dict, dict]:
    """Everything the analysis must leave untouched: state_dict tensors, quantizer flags, train modes."""
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    modes = {name: m.training for name, m in model.named_modules()}
    return tensors, quantizer_flags(model), modes


def assert_same_state(model: nn.Module, saved: tuple[dict, dict, dict]) -> None:
    tensors, flags, modes = saved
    now = model.state_dict()
    assert now.keys() == tensors.keys()
    for key, value in tensors.items():
        assert torch.equal(now[key], value), key
    assert quantizer_flags(model) == flags
    assert {name: m.training for name, m in model.named_modules()} == modes
