"""The built-in demo: a small CNN trained on scikit-learn's 8x8 digits, and ResNet-style networks.

The digits weights and data ship in ``resources/demo`` (made by ``scripts/make_demo_assets.py``, which
anyone can re-run); nothing is downloaded. The ResNet-style networks are built in code with random
weights, for structure and speed work.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from workbench.resources import RESOURCES
from workbench.sources.weights_file import load_weights  # the same checks as a user's weights file

DEMO_DIR = RESOURCES / "demo"
DIGITS_WEIGHTS = DEMO_DIR / "digits_cnn.safetensors"
DIGITS_DATA = DEMO_DIR / "digits.npz"
DIGITS_CLASSES = 10
DIGITS_INPUT_SHAPE = (1, 8, 8)
# the demo project's choices (`workbench demo`, the GUI's demo): 8 calibration batches of 64 train images, the test
# split in batches of 256, mse calibration
DEMO_CALIB_BATCHES = 8
DEMO_BATCH_SIZE = 64
DEMO_EVAL_BATCH_SIZE = 256
DEMO_METHOD = "mse"


class ResidualBlock(nn.Module):
    """conv-bn-relu-conv-bn plus the identity, then relu (the add is what TensorRT fuses into the conv)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class DigitsCNN(nn.Module):
    """About 10k parameters; 8x8 grey images in [0, 1] to 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.block = ResidualBlock(16)
        self.pool = nn.MaxPool2d(2)
        self.expand = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.head_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, DIGITS_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.block(self.stem(x)))
        x = self.head_pool(self.expand(x)).flatten(1)
        return self.fc(x)


@dataclass(frozen=True)
class DigitsSplit:
    """Images as float32 (N, 1, 8, 8) in [0, 1] and integer labels (N,)."""

    images: torch.Tensor
    labels: torch.Tensor

    def batches(self, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.images[i:i + batch_size], self.labels[i:i + batch_size])
                for i in range(0, len(self.labels), batch_size)]


def load_digits_split(split: str, path: Path = DIGITS_DATA) -> DigitsSplit:
    """The ``"train"`` (calibration) or ``"test"`` (evaluation) split of the shipped digits data."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    if not path.is_file():
        raise FileNotFoundError(f"demo data not found at {path}; run scripts/make_demo_assets.py to create it.")
    with np.load(path, allow_pickle=False) as data:
        images = data[f"{split}_images"].astype(np.float32) / 16.0
        labels = data[f"{split}_labels"].astype(np.int64)
    return DigitsSplit(torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels))


def load_digits_cnn(path: Path = DIGITS_WEIGHTS) -> DigitsCNN:
    """The trained demo CNN, in eval mode."""
    if not path.is_file():
        raise FileNotFoundError(f"demo weights not found at {path}; run scripts/make_demo_assets.py to create them.")
    model = DigitsCNN()
    load_weights(model, path)
    return model.eval()


def accuracy(model: nn.Module, split: DigitsSplit, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``model`` on ``split``."""
    correct = 0
    model.eval()
    with torch.no_grad():
        for images, labels in split.batches(batch_size):
            correct += int((model(images).argmax(1) == labels).sum())
    return correct / len(split.labels)


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module | None:
    """The strided 1x1 projection a residual block needs when its shape changes (else None)."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))


class BasicBlock(nn.Module):
    """ResNet-18's 3x3-3x3 block (expansion 1)."""

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = _shortcut(in_channels, channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """ResNet-50's 1x1-3x3-1x1 bottleneck block (expansion 4)."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1 = nn.Conv2d(in_channels, channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNetLike(nn.Module):
    """ResNet's layout (ResNet-18 by default; ResNet-50 with ``Bottleneck`` and (3, 4, 6, 3)) with
    configurable width, for structure and speed work."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), width: int = 64, num_classes: int = 1000,
                 block: type[BasicBlock] | type[Bottleneck] = BasicBlock) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = []
        in_channels = width
        for index, count in enumerate(blocks):
            channels = width * 2 ** index
            stage = [block(in_channels, channels, 1 if index == 0 else 2)]
            in_channels = channels * block.expansion
            stage += [block(in_channels, channels) for _ in range(count - 1)]
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = (stages + [nn.Identity()] * 4)[:4]
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50_like(num_classes: int = 1000, width: int = 64) -> ResNetLike:
    """ResNet-50 topology with random weights (no torchvision, nothing downloaded)."""
    torch.manual_seed(0)
    model = ResNetLike((3, 4, 6, 3), width, num_classes, block=Bottleneck)
    randomize_batchnorm(model)
    return model.eval()


def resnet18_like(num_classes: int = 1000, width: int = 64) -> ResNetLike:
    """ResNet-18 topology with random weights (no torchvision, nothing downloaded)."""
    torch.manual_seed(0)
    model = ResNetLike((2, 2, 2, 2), width, num_classes)
    randomize_batchnorm(model)
    return model.eval()


def randomize_batchnorm(model: nn.Module) -> None:
    """Give every BatchNorm2d of ``model`` non-trivial statistics and affine parameters (fixed seed), so
    that activations look like a trained network's; in place."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            with torch.no_grad():
                module.running_mean.uniform_(-0.2, 0.2, generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.uniform_(-0.1, 0.1, generator=generator)
