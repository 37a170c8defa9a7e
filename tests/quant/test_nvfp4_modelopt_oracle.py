"""Our NVFP4 against NVIDIA Model Optimizer's (``NVFP4QTensor``, the function its export and fake quant build on):
the same FP8 block scales, the same packed E2M1 bytes, the same dequantized weight.

Skipped without Model Optimizer (``pip install nvidia-modelopt``; it runs on the CPU for this). It was checked
here with nvidia-modelopt 0.47.0 installed apart from the project's environment (``pip install --target DIR
--no-deps nvidia-modelopt ninja nvidia-ml-py omegaconf antlr4-python3-runtime==4.9.3 pulp``, then
``PYTHONPATH=DIR``)."""
import pytest
import torch

nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor",
                                   reason="NVIDIA Model Optimizer (nvidia-modelopt) is not installed")

from workbench.export.fp4 import nvfp4_weight_tensors, pack_fp4  # noqa: E402
from workbench.quant.nvfp4 import nvfp4_fake_quant  # noqa: E402


def _weight(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(64, 256, generator=generator)
    weight[:, 7] *= 40  # an outlier input channel: its blocks get large scales, the others small ones
    weight[3, 32:48] = 0  # an all-zero block
    return weight


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_scales_packed_values_and_dequantized_weight_match_model_optimizer(seed):
    weight = _weight(seed)
    qtensor, scales, global_scale = nvfp4_tensor.NVFP4QTensor.quantize(weight.clone(), 16)
    values, our_scales, our_global, axis = nvfp4_weight_tensors(weight, weight.abs().max(), 0)
    assert axis == 1
    assert torch.equal(our_global, global_scale.reshape(()))
    nonzero = weight.reshape(64, 16, 16).abs().amax(-1) > 0
    # the FP8 block scales, bit for bit (Model Optimizer sets an all-zero block's scale to 1; it is 0 here:
    # either way the block dequantizes to zeros)
    assert torch.equal(our_scales[nonzero], scales.to(torch.float32)[nonzero])
    assert torch.equal(pack_fp4(values).view(torch.uint8), qtensor._quantized_data)
    theirs = qtensor.dequantize(torch.float32, scale=scales, double_scale=global_scale, block_sizes={-1: 16})
    assert torch.equal(nvfp4_fake_quant(weight, weight.abs().max(), 16, 1), theirs)
