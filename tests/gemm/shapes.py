"""Model shapes from real code that nobody here wrote, rebuilt small (issue 23).

Each is written the way its library writes it: a transformers-style ``Conv1D`` (a Linear with a
transposed weight), GPT-2's GELU written out with tanh, an encoder-decoder taking two token inputs of
different lengths, a YOLOv5-style detector whose layers live in ``self.model`` with a forward holding
flags and a loop, a MobileNetV2 inverted residual, a UNet skip with ConvTranspose and an LSTM head.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class Conv1D(nn.Module):
    """As ``transformers.pytorch_utils.Conv1D`` writes it: weight [nx, nf], ``addmm(bias, x, W)``."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


# recognised by its qualified class name, as the real one is: transformers is not needed to test it
Conv1D.__module__ = "transformers.pytorch_utils"


class NewGELUActivation(nn.Module):
    """GPT-2's activation: the tanh approximation written out."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class HardSwishWritten(nn.Module):
    def forward(self, x):
        return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


class SiLUWritten(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class GPTMlp(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.c_fc = Conv1D(4 * dim, dim)
        self.act = NewGELUActivation()
        self.c_proj = Conv1D(dim, 4 * dim)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPTBlockish(nn.Module):
    """Conv1D projections, a tanh GELU, a SiLU and a hard-swish written out, and one real residual add."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.mlp = GPTMlp(dim)
        self.silu = SiLUWritten()
        self.hswish = HardSwishWritten()
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        h = self.silu(x)
        h = self.hswish(h)
        return self.head(h + self.mlp(h))


class Bilinearish(nn.Module):
    """A weight GEMM of a class nothing recognises (its own forward over a weight matrix)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) * 0.1)

    def forward(self, x):
        return x @ self.weight


class WithUnknownGemm(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.odd = Bilinearish(dim)

    def forward(self, x):
        return self.odd(self.fc(x))


class EncoderDecoder(nn.Module):
    """Two token inputs whose lengths are independent: source ids (encoder) and target ids (decoder)."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.Linear(dim, dim)
        self.decoder = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, decoder_input_ids):
        memory = self.encoder(self.embed(input_ids))                    # [B, S, D]
        target = self.decoder(self.embed(decoder_input_ids))            # [B, T, D]
        scores = torch.softmax(target @ memory.transpose(1, 2), -1)     # [B, T, S]
        return self.head(scores @ memory)                               # [B, T, vocab]


class ConvBnAct(nn.Module):
    """YOLOv5's Conv: conv, BatchNorm, SiLU."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Concat(nn.Module):
    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class Detector(nn.Module):
    """YOLOv5's DetectionModel: layers in ``self.model`` (a Sequential), each with ``f`` (where its input comes
    from) and ``i`` (its index); the forward loops over them with flags (``augment``, ``profile``) and keeps
    the outputs a later layer reads."""

    def __init__(self) -> None:
        super().__init__()
        layers = [ConvBnAct(3, 8, 3, 2),    # 0
                  ConvBnAct(8, 8, 3, 1),    # 1: read by conv 2 and by the Concat 3 (one scale, NVIDIA's recipe)
                  ConvBnAct(8, 8, 1, 1),    # 2
                  Concat(1),                # 3: cat([2, 1])
                  ConvBnAct(16, 8, 1, 1)]   # 4
        froms = [-1, -1, -1, [-1, 1], -1]
        for i, (m, f) in enumerate(zip(layers, froms)):
            m.i, m.f = i, f
        self.model = nn.Sequential(*layers)
        self.save = [1]

    def forward(self, x, augment: bool = False, profile: bool = False):
        if augment:
            x = torch.flip(x, (-1,))
        y = []
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 block: conv->bn->relu6 inside nn.Sequential, a residual add."""

    def __init__(self, channels: int = 8, expand: int = 2) -> None:
        super().__init__()
        hidden = channels * expand
        self.conv = nn.Sequential(
            nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)),
            nn.Sequential(nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                          nn.ReLU6(inplace=True)),
            nn.Conv2d(hidden, channels, 1, bias=False),
            nn.BatchNorm2d(channels))

    def forward(self, x):
        return x + self.conv(x)


class MobileNetish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True)),
            InvertedResidual(8), InvertedResidual(8))
        self.classifier = nn.Linear(8, 4)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class UNetish(nn.Module):
    """A UNet level: down conv, ConvTranspose up, concatenated with the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, 1, 1)
        self.down = nn.Conv2d(8, 16, 3, 2, 1)
        self.up = nn.ConvTranspose2d(16, 8, 2, 2)
        self.dec = nn.Conv2d(16, 8, 3, 1, 1)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        skip = torch.relu(self.enc(x))
        h = torch.relu(self.down(skip))
        h = self.up(h)
        return self.out(torch.relu(self.dec(torch.cat([h, skip], 1))))


class LSTMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.lstm(self.proj(x))
        return self.head(out[:, -1])


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.misc.Conv2dNormActivation: an nn.Sequential subclass of conv, norm, activation."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 activation: bool = True) -> None:
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        if activation:
            layers.append(nn.ReLU6(inplace=True))
        super().__init__(*layers)


Conv2dNormActivation.__module__ = "torchvision.ops.misc"


class TVInvertedResidual(nn.Module):
    """torchvision.models.mobilenetv2.InvertedResidual, as written there (a flag picks the residual)."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden, kernel=1))
        layers.extend([Conv2dNormActivation(hidden, hidden, stride=stride, groups=hidden),
                       nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)])
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup
        self._is_cn = stride > 1

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2ish(nn.Module):
    """torchvision's MobileNetV2 layout, small: features (stem, inverted residuals, last conv), classifier."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        features: list[nn.Module] = [Conv2dNormActivation(3, 8, stride=2)]
        features += [TVInvertedResidual(8, 8, 1, 1), TVInvertedResidual(8, 16, 2, 4), TVInvertedResidual(16, 16, 1, 4)]
        features.append(Conv2dNormActivation(16, 32, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)
