"""Items 3, 4 and 6 on the export side: zero amax means the same in PyTorch and ONNX; no half-written
files on a full disk; parity messages that say where NaN/Inf comes from."""
import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.quant.calibrate import calibrate


def model_with_zero_amax():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)).eval()
    quant.replace_to_quantization_module(model)
    calibrate(model, [torch.randn(2, 3, 8, 8)], num_batches=1, method="max", report_sqnr=False)
    model[2]._input_quantizer.amax = torch.tensor(0.0)  # as if calibration saw only zeros
    return model


def onnx_rounding_output(model, x):
    quantizers = [m for m in model.modules() if isinstance(m, quant.TensorQuantizer)]
    for q in quantizers:
        q.rounding = "onnx"
    try:
        with torch.no_grad():
            return model(x).numpy()
    finally:
        for q in quantizers:
            q.rounding = "pytorch_quantization"


def test_zero_amax_quantizes_to_zero_in_pytorch_and_in_onnx(tmp_path):
    model = model_with_zero_amax()
    report = export_qdq_onnx(model, torch.zeros(1, 3, 8, 8), tmp_path / "m.onnx")
    assert any("2._input_quantizer" in w and "every input to 0" in w for w in report.warnings)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    real = torch.randn(2, 3, 8, 8) * 3
    expected = onnx_rounding_output(model, real)
    actual = session.run(None, {session.get_inputs()[0].name: real.numpy()})[0]
    # conv2 sees only zeros through its input quantizer: its output is its bias, in both
    bias = model[2].bias.detach().numpy().reshape(1, -1, 1, 1)
    assert np.allclose(expected, np.broadcast_to(bias, expected.shape), atol=1e-6)
    assert np.abs(expected - actual).max() < 1e-5
