"""The reference scripts' manual QDQ insertion and calibration workflow (000 and 004 in
../shared/reference/), run against Quant Workbench through the pytorch_quantization alias.

Changes from the reference: the alias line below; torchvision's resnet50 replaced by a small
ResNet-style network built here (no torchvision, no downloads); CPU instead of CUDA; random
calibration data. Everything between the markers is the reference code as published.
"""
import sys

import torch
from torch import nn

from workbench.quant.compat import alias_pytorch_quantization  # the only import change

alias_pytorch_quantization()

# ---- reference code (000_60a6190932dc4930.txt, 004_07c476eb5c14d94f.txt) ----
import re  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Union

from pytorch_quantization import (
    calib,  # noqa: E402
    quant_modules,  # noqa: E402
)
from pytorch_quantization import nn as quant_nn  # noqa: E402
from pytorch_quantization.nn.modules import _utils as quant_nn_utils  # noqa: E402
from pytorch_quantization.tensor_quant import QuantDescriptor  # noqa: E402


class disable_quantization:
    def __init__(self, model):
        self.model = model

    def apply(self, disabled=True):
        for name, module in self.model.named_modules():
            if isinstance(module, quant_nn.TensorQuantizer):
                module._disabled = disabled

    def __enter__(self):
        self.apply(True)

    def __exit__(self, *args, **kwargs):
        self.apply(False)


class enable_quantization:
    def __init__(self, model):
        self.model = model

    def apply(self, enabled=True):
        for name, module in self.model.named_modules():
            if isinstance(module, quant_nn.TensorQuantizer):
                module._disabled = not enabled

    def __enter__(self):
        self.apply(True)
        return self

    def __exit__(self, *args, **kwargs):
        self.apply(False)


def transfer_torch_to_quantization(nninstance: torch.nn.Module, quantmodule):
    quant_instance = quantmodule.__new__(quantmodule)
    for k, val in vars(nninstance).items():
        setattr(quant_instance, k, val)

    def __init__(self):
        if isinstance(self, quant_nn_utils.QuantInputMixin):
            quant_desc_input = quant_nn_utils.pop_quant_desc_in_kwargs(self.__class__, input_only=True)
            self.init_quantizer(quant_desc_input)
            if isinstance(self._input_quantizer._calibrator, calib.HistogramCalibrator):
                self._input_quantizer._calibrator._torch_hist = True
        else:
            quant_desc_input, quant_desc_weight = quant_nn_utils.pop_quant_desc_in_kwargs(self.__class__)
            self.init_quantizer(quant_desc_input, quant_desc_weight)
            if isinstance(self._input_quantizer._calibrator, calib.HistogramCalibrator):
                self._input_quantizer._calibrator._torch_hist = True
                self._weight_quantizer._calibrator._torch_hist = True

    __init__(quant_instance)
    return quant_instance


def quantization_ignore_match(ignore_policy: Union[str, list[str], Callable], path: str) -> bool:
    if ignore_policy is None:
        return False
    if isinstance(ignore_policy, Callable):
        return ignore_policy(path)
    if isinstance(ignore_policy, str) or isinstance(ignore_policy, list):
        if isinstance(ignore_policy, str):
            ignore_policy = [ignore_policy]
        if path in ignore_policy:
            return True
        for item in ignore_policy:
            if re.match(item, path):
                return True
    return False


def replace_to_quantization_module(model: torch.nn.Module, ignore_policy: Union[str, list[str], Callable] = None):
    module_dict = {}
    for entry in quant_modules._DEFAULT_QUANT_MAP:
        module = getattr(entry.orig_mod, entry.mod_name)
        module_dict[id(module)] = entry.replace_mod

    def recursive_and_replace_module(module, prefix=""):
        for name in module._modules:
            submodule = module._modules[name]
            path = name if prefix == "" else prefix + "." + name
            recursive_and_replace_module(submodule, path)

            submodule_id = id(type(submodule))
            if submodule_id in module_dict:
                ignored = quantization_ignore_match(ignore_policy, path)
                if ignored:
                    print(f"Quantization: {path} has ignored.")
                    continue
                module._modules[name] = transfer_torch_to_quantization(submodule, module_dict[submodule_id])

    recursive_and_replace_module(model)


def calibrate_model(model: torch.nn.Module, dataloader, device, num_batch=25):

    def compute_amax(model, **kwargs):
        for name, module in model.named_modules():
            if isinstance(module, quant_nn.TensorQuantizer):
                if module._calibrator is not None:
                    if isinstance(module._calibrator, calib.MaxCalibrator):
                        module.load_calib_amax()
                    else:
                        module.load_calib_amax(**kwargs)

                    module._amax = module._amax.to(device)

    def collect_stats(model, data_loader, device, num_batch=200):
        model.eval()
        for name, module in model.named_modules():
            if isinstance(module, quant_nn.TensorQuantizer):
                if module._calibrator is not None:
                    module.disable_quant()
                    module.enable_calib()
                else:
                    module.disable()

        with torch.no_grad():
            for i, datas in enumerate(data_loader):
                imgs = datas[0].to(device, non_blocking=True).float() / 255.0
                model(imgs)

                if i >= num_batch:
                    break

        for name, module in model.named_modules():
            if isinstance(module, quant_nn.TensorQuantizer):
                if module._calibrator is not None:
                    module.enable_quant()
                    module.disable_calib()
                else:
                    module.enable()

    collect_stats(model, dataloader, device, num_batch=num_batch)
    compute_amax(model, method="mse")
# ---- end of reference code ----


class BasicBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.layer2 = nn.Sequential(BasicBlock(8))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(torch.relu(self.conv1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def main() -> int:
    torch.manual_seed(0)
    quant_nn.QuantConv2d.set_default_quant_desc_input(QuantDescriptor(calib_method="histogram"))
    model = SmallResNet().eval()
    images = [(torch.randint(0, 256, (4, 3, 16, 16)),) for _ in range(4)]
    reference = model(images[0][0].float() / 255.0)

    replace_to_quantization_module(model, ignore_policy=[r"layer2\.0\.conv2"])
    quantized = [n for n, m in model.named_modules() if isinstance(m, quant_nn.TensorQuantizer)]
    print("quantizers", len(quantized))

    with disable_quantization(model):
        same = torch.equal(model(images[0][0].float() / 255.0), reference)
    print("disabled equals float", same)

    calibrate_model(model, images, "cpu", num_batch=3)
    amax = model.layer1[0].conv1._input_quantizer.amax
    print("conv1 input amax", float(amax))
    output = model(images[0][0].float() / 255.0)
    print("int8 vs float max diff", float((output - reference).abs().max()))

    # the calibrated state_dict loads into a freshly converted model
    fresh = SmallResNet().eval()
    replace_to_quantization_module(fresh, ignore_policy=[r"layer2\.0\.conv2"])
    fresh.load_state_dict(model.state_dict())
    print("reloaded equal", torch.equal(fresh(images[0][0].float() / 255.0), output))
    print(model.layer1[0].conv1._input_quantizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
