"""The pytorch_quantization alias: imports, checkpoints, and a reference script run unchanged."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.quant.compat import ALIASED_MODULES, alias_pytorch_quantization

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def aliased():
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "pytorch_quantization"}
    yield alias_pytorch_quantization()
    for key in [k for k in sys.modules if k.split(".")[0] == "pytorch_quantization"]:
        del sys.modules[key]
    sys.modules.update(saved)


def test_every_submodule_imports(aliased):
    import importlib

    for alias in ALIASED_MODULES:
        module = importlib.import_module(f"pytorch_quantization.{alias}")
        assert module.__name__.startswith("workbench.quant")
    import pytorch_quantization.utils as quant_utils
    from pytorch_quantization import calib, cuda_ext, quant_modules, tensor_quant  # noqa: F401
    from pytorch_quantization import nn as quant_nn
    from pytorch_quantization.nn.modules.tensor_quantizer import TensorQuantizer

    assert quant_nn.TensorQuantizer is TensorQuantizer
    assert callable(quant_utils.reduce_amax)
    assert tensor_quant.QuantDescriptor is tensor_quant.ScaledQuantDescriptor
    assert aliased.__version__.count(".") == 2
    assert callable(aliased.enable_onnx_export) and callable(aliased.initialize)


def test_checkpoint_in_pytorch_quantization_layout_loads(aliased):
    """Keys and shapes as pytorch-quantization saves them: 0-d input amax, (C,1,1,1) weight amax."""
    from pytorch_quantization import nn as quant_nn

    model = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), quant_nn.QuantLinear(4, 2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["0._input_quantizer._amax"] = torch.tensor(2.5)
    state["0._weight_quantizer._amax"] = torch.rand(4, 1, 1, 1)
    state["1._input_quantizer._amax"] = torch.tensor(1.5)
    state["1._weight_quantizer._amax"] = torch.rand(2, 1)
    model.load_state_dict(state)
    assert model[0].input_quantizer.amax.item() == 2.5
    assert torch.equal(model[1].weight_quantizer.amax, state["1._weight_quantizer._amax"])
    assert "amax=2.5000" in repr(model[0].input_quantizer)


def test_cuda_ext_functions_match(aliased):
    from pytorch_quantization import cuda_ext, tensor_quant

    x = torch.randn(4, 6, 5)
    amax = torch.rand(6) + 0.5
    assert torch.equal(cuda_ext.fake_tensor_quant_with_axis(x, amax, 1),
                       tensor_quant.fake_tensor_quant(x, amax.view(1, 6, 1)))
    y = x.clone()
    cuda_ext.fake_tensor_quant_(y, x.abs().max())
    assert torch.equal(y, tensor_quant.fake_tensor_quant(x, x.abs().max()))


def test_refuses_to_shadow_the_real_library():
    fake_real = type(sys)("pytorch_quantization")
    saved = sys.modules.get("pytorch_quantization")
    sys.modules["pytorch_quantization"] = fake_real
    try:
        with pytest.raises(RuntimeError, match="already imported"):
            alias_pytorch_quantization()
    finally:
        if saved is None:
            del sys.modules["pytorch_quantization"]
        else:
            sys.modules["pytorch_quantization"] = saved


def test_reference_script_runs_unchanged_through_the_alias():
    result = subprocess.run([sys.executable, str(SCRIPTS / "manual_qdq_insertion.py")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Quantization: layer2.0.conv2 has ignored." in out
    assert "quantizers 15" in out
    assert "disabled equals float True" in out
    assert "reloaded equal True" in out
    assert "calibrator=HistogramCalibrator" in out
    diff = float(out.split("int8 vs float max diff ")[1].split()[0])
    assert 0 < diff < 0.05
