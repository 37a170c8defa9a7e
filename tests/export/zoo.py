"""Small models built in code for the export tests: one per family the QDQ export must handle."""
from __future__ import annotations

import torch
from torch import nn

from workbench.sources.demo import ResNetLike


class PlainCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.AvgPool2d(2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(x)).flatten(1))


class ConvBNAct(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """YOLOv5's bottleneck: note the boolean attribute called ``add``."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1 = ConvBNAct(c, c, 1)
        self.cv2 = ConvBNAct(c, c, 3)
        self.add = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C3(nn.Module):
    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        c_ = c2 // 2
        self.cv1 = ConvBNAct(c1, c_)
        self.cv2 = ConvBNAct(c1, c_)
        self.cv3 = ConvBNAct(2 * c_, c2)
        self.m = nn.Sequential(Bottleneck(c_))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = ConvBNAct(c1, c_)
        self.cv2 = ConvBNAct(c_ * 4, c2)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat([x, y1, y2, self.m(y2)], 1))


class YoloBlock(nn.Module):
    """A YOLOv5-style backbone slice: conv, C3 (residual add, concat), SPPF (MaxPool, concat), a head conv."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(ConvBNAct(3, 8, 3, 2), C3(8, 16), SPPF(16, 16), nn.Conv2d(16, 6, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class DepthwiseGrouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pointwise = nn.Conv2d(16, 16, 1)
        self.grouped = nn.Conv2d(16, 8, 3, padding=1, groups=4)
        self.act = nn.ReLU6()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.stem(x))
        x = self.act(self.pointwise(self.act(self.depthwise(x))))
        return self.grouped(x)


class Decoder(nn.Module):
    """ConvTranspose up-sampling (weights quantized per output channel: axis 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 6, 4, stride=2, padding=1)
        self.up1d = nn.ConvTranspose1d(6, 4, 3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.up(torch.relu(self.conv(x))))
        return self.up1d(y.flatten(2))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block: LayerNorm, Linear q/k/v, matmul, softmax, residual adds."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, d = t.shape
        return t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5), dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).flatten(2)
        x = x + self.proj(out)
        return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))


class LSTMTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.lstm = nn.LSTM(8, 12, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(torch.relu(self.embed(x)))
        return self.head(out)


def resnet_like() -> ResNetLike:
    torch.manual_seed(0)
    return ResNetLike((1, 1), width=8, num_classes=10)


ZOO = {
    # name: (builder, sample input shape)
    "plain_cnn": (PlainCNN, (2, 3, 16, 16)),
    "resnet": (resnet_like, (2, 3, 32, 32)),
    "yolo": (YoloBlock, (2, 3, 32, 32)),
    "depthwise_grouped": (DepthwiseGrouped, (2, 3, 16, 16)),
    "conv_transpose": (Decoder, (2, 3, 16, 16)),
    "mlp": (MLP, (4, 20)),
    "transformer": (EncoderBlock, (2, 5, 16)),
    "lstm": (LSTMTagger, (2, 7, 6)),
}
