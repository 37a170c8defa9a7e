"""Items 3, 4 and 6 on the export side: zero amax means the same in PyTorch and ONNX; no half-written
files on a full disk; parity messages that say where NaN/Inf comes from."""
import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.quant.algorithms.calibrate import calibrate


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


def test_the_range_check_catches_what_the_sample_hides(tmp_path, monkeypatch):
    """With the old export of a zero amax (scale 1), a sample that leaves the quantizer at 0 hid the
    difference; the check on random inputs of the sample's range finds it."""
    import pytest

    from workbench.export import qdq
    from workbench.export.errors import ExportValidationError

    monkeypatch.setattr(qdq, "ZERO_AMAX_SCALE", 1.0)
    model = model_with_zero_amax()
    with pytest.raises(ExportValidationError) as caught:
        export_qdq_onnx(model, torch.zeros(1, 3, 8, 8), tmp_path / "m.onnx", strict=True)
    assert "on random inputs in the sample's range" in str(caught.value)
    assert not (tmp_path / "m.onnx").exists()


def test_a_clean_export_reports_the_range_check(tmp_path):
    model = model_with_zero_amax()
    report = export_qdq_onnx(model, torch.randn(1, 3, 8, 8), tmp_path / "m.onnx")
    assert report.range_check is not None and report.range_check.cosine > 0.999


def test_nan_in_the_validation_sample_is_named(tmp_path):
    import pytest

    from workbench.export.errors import ExportValidationError

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 2)).eval()
    quant.replace_to_quantization_module(model)
    calibrate(model, [torch.randn(2, 3, 8, 8)], num_batches=1, method="max", report_sqnr=False)
    sample = torch.randn(1, 3, 8, 8)
    sample[0, 0, 0, 0] = float("nan")
    try:
        export_qdq_onnx(model, sample, tmp_path / "m.onnx")
    except ExportValidationError as error:  # the two disagree on NaN: the message says where it came from
        assert "the validation sample itself holds NaN/Inf: input 'input' (1 of 192 values)" in str(error)
    else:  # onnxruntime and PyTorch may also agree on NaN; then nothing needs explaining
        pytest.skip("onnxruntime and PyTorch agreed on this NaN sample")
