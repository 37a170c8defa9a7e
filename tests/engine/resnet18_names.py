"""torchvision's ResNet-18 written out with its exact module names (conv1, bn1, relu, maxpool, layer1.0.conv1, ...,
layer4.0.downsample.0, avgpool, fc), because torchvision does not load with this torch; and the real trtexec
reports NVIDIA ships with TensorRT Engine Explorer for it (../shared/trtexec, read-only)."""
from pathlib import Path

import torch
from torch import nn

TRTEXEC = Path(__file__).resolve().parents[3] / "shared" / "trtexec" / "resnet18-a100"
if not TRTEXEC.is_dir():  # the worktree lives in /work/wt/NAME, the main checkout in /work/main
    TRTEXEC = Path("/work/shared/trtexec/resnet18-a100")
QAT = (TRTEXEC / "qat" / "resnet-qat.onnx.engine.graph.json", TRTEXEC / "qat" / "resnet-qat.onnx.engine.profile.json")
FP16 = (TRTEXEC / "fp16" / "resnet.onnx.engine.graph.json", TRTEXEC / "fp16" / "resnet.onnx.engine.profile.json")


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's layout and names; ``width`` 64 is the real one (smaller for fast exports)."""

    def __init__(self, width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        planes = [width, width * 2, width * 4, width * 8]
        self.layer1 = nn.Sequential(BasicBlock(width, planes[0]), BasicBlock(planes[0], planes[0]))
        self.layer2 = nn.Sequential(BasicBlock(planes[0], planes[1], 2), BasicBlock(planes[1], planes[1]))
        self.layer3 = nn.Sequential(BasicBlock(planes[1], planes[2], 2), BasicBlock(planes[2], planes[2]))
        self.layer4 = nn.Sequential(BasicBlock(planes[2], planes[3], 2), BasicBlock(planes[3], planes[3]))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(planes[3], num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make(width: int = 16, num_classes: int = 10) -> ResNet18:
    """The entry point projects load (small by default: the engine tests need names, not ImageNet's sizes)."""
    torch.manual_seed(0)
    return ResNet18(width, num_classes).eval()
