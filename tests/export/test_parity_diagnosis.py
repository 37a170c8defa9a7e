"""A failed parity check says where and why (issue 34, point 3): the first module whose output parts, a wrong
graph told from rounding, the file written "not validated" unless strict, parity on more than one batch."""
import json

import onnxruntime as ort
import pytest
import torch
from torch import nn

from workbench import quant
from workbench.export import ExportValidationError, export_qdq_onnx, report_json
from workbench.export.parity import VERDICTS, one_ulp_spread
from workbench.quant.algorithms.calibrate import calibrate


class Normalize(nn.Module):
    """Divides by the largest value of its input read into Python: the tracer keeps the sample's as a constant."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / float(x.abs().amax())


class BakedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU()
        self.norm = Normalize()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv2(self.norm(self.act(self.conv1(x)))).mean((2, 3)))


class PlainNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x)))


def calibrated(model):
    torch.manual_seed(0)
    model = model.eval()
    quant.replace_to_quantization_module(model)
    batches = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches


def test_a_wrong_graph_is_written_not_validated_with_the_module_that_parts_named(tmp_path):
    model, batches = calibrated(BakedNet())
    target = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, batches[0][:1], target, exporter="torchscript")
    assert target.is_file()  # the file is there, marked
    assert report.validated is False and report.cosine < 0.999
    diagnosis = report.parity_diagnosis
    assert diagnosis["verdict"] == "operation"
    assert diagnosis["module"] == "norm"  # the module whose output parts while its inputs agree
    assert diagnosis["first"] == "conv2._input_quantizer"  # the first Q/DQ boundary that differs
    assert "norm" in diagnosis["text"] and VERDICTS["operation"] in diagnosis["text"]
    assert any(w.startswith("NOT VALIDATED") and "module 'norm'" in w for w in report.warnings)
    assert report.summary().startswith("NOT VALIDATED")
    assert json.loads(report_json(report))["validated"] is False
    ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])  # a file onnxruntime runs


def test_strict_refuses_the_file_and_the_error_carries_the_diagnosis(tmp_path):
    model, batches = calibrated(BakedNet())
    with pytest.raises(ExportValidationError) as info:
        export_qdq_onnx(model, batches[0][:1], tmp_path / "m.onnx", exporter="torchscript", strict=True)
    assert info.value.stage == "parity"
    assert "module 'norm'" in str(info.value) and "strict" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_right_graph_below_an_impossible_threshold_is_called_rounding_not_a_wrong_graph(tmp_path):
    model, batches = calibrated(PlainNet())
    report = export_qdq_onnx(model, batches[0][:1], tmp_path / "m.onnx", min_cosine=1.5)
    assert report.validated is False
    diagnosis = report.parity_diagnosis
    assert diagnosis["verdict"] == "rounding", diagnosis["text"]
    assert diagnosis["sensitivity_cosine"] is not None  # the model's own 1-ulp spread was measured
    assert "within the model's own sensitivity" in diagnosis["text"]


def test_parity_is_checked_on_every_batch_given(tmp_path):
    model, batches = calibrated(PlainNet())
    report = export_qdq_onnx(model, batches[0][:1], tmp_path / "m.onnx", parity_batches=batches)
    labels = [row.check for row in report.checks]
    assert "parity batch 1 (4 samples)" in labels and "parity batch 2 (4 samples)" in labels
    assert report.validated


def test_a_batch_only_shows_the_defect_the_sample_hides(tmp_path):
    """The sample traces the constant it checks against: only other data shows the baked value."""
    model, batches = calibrated(BakedNet())
    report = export_qdq_onnx(model, batches[0][:1], tmp_path / "m.onnx", exporter="torchscript",
                             parity_batches=[batches[1] * 3])
    batch_row = next(row for row in report.checks if row.check.startswith("parity batch 1"))
    sample_row = next(row for row in report.checks if row.check == "sample inputs")
    assert sample_row.cosine > 0.9999 and batch_row.cosine < 0.999


def test_the_one_ulp_spread_of_a_model_is_small_and_measured_on_float_inputs_only():
    model, batches = calibrated(PlainNet())
    x = batches[0][:1]
    with torch.no_grad():
        reference = [model(x)]
    cosine, diff = one_ulp_spread(model, (x,), reference, [m for m in model.modules()
                                                           if isinstance(m, quant.TensorQuantizer)])
    assert 0.99 < cosine <= 1.0 and diff < 0.1
    assert one_ulp_spread(model, (torch.zeros(1, 3, dtype=torch.long),), reference, []) is None


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.SiLU()
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.bn(self.conv(x))))


def test_batchnorm_keeps_its_statistics_through_the_export_and_every_batch_agrees(tmp_path):
    """EfficientNet's cosine 0.28: torch.onnx.export put the export wrapper (a new module, in training mode) back
    into training mode, recursively, so every reference after the first capture ran BatchNorm on batch statistics
    and moved the running ones. The batches checked after the capture show it."""
    torch.manual_seed(0)
    model = BatchNormNet().train()
    with torch.no_grad():  # statistics set on data unlike the batches below
        for _ in range(5):
            model(torch.randn(8, 3, 8, 8) * 2 + 1)
    model.eval()
    quant.replace_to_quantization_module(model)
    batches = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    running = model.bn.running_var.clone()
    report = export_qdq_onnx(model, batches[0][:1], tmp_path / "m.onnx", exporter="torchscript",
                             parity_batches=batches)
    assert report.validated, report.warnings
    assert all(row.cosine > 0.9999 for row in report.checks if row.check.startswith("parity batch"))
    assert torch.equal(model.bn.running_var, running)  # the model's statistics are what they were
    assert not model.training and not model.bn.training


class FirstRows(nn.Module):
    """Keeps as many positions as the sample had positive means: read into Python, the count is the sample's in
    the traced graph, while PyTorch keeps another count on other data (an output of another shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).flatten(2)
        kept = int((y.mean((0, 1)) > 0).sum())
        return y[:, :, :kept]


def test_an_output_of_another_shape_is_a_parity_failure_diagnosed_not_an_error_without_a_file(tmp_path):
    """SSD kept 128 boxes in onnxruntime and 136 in PyTorch: the export stopped with "onnxruntime shape (128, 4),
    PyTorch (136, 4)" and no file. An output of another shape parts entirely (cosine 0): the file is written
    "not validated" and the diagnosis names the output and both shapes (a size the trace fixed: "shape"); strict
    refuses it with the same words."""
    model, batches = calibrated(FirstRows())
    sample, other = batches[0][:1], -batches[1][:1]  # the sign flips which means are positive
    with torch.no_grad():
        assert model(sample).shape != model(other).shape
    target = tmp_path / "m.onnx"
    report = export_qdq_onnx(model, sample, target, exporter="torchscript", parity_batches=[other])
    assert target.is_file() and report.validated is False
    row = next(row for row in report.checks if row.check.startswith("parity batch 1"))
    assert row.cosine == 0.0
    assert report.parity_diagnosis["verdict"] == "shape"
    text = report.parity_diagnosis["text"]
    assert "computes output 'output' at shape (" in text and "where PyTorch's is (" in text, text
    with pytest.raises(ExportValidationError) as info:
        export_qdq_onnx(model, sample, tmp_path / "strict.onnx", exporter="torchscript", parity_batches=[other],
                        strict=True)
    assert "at shape (" in str(info.value) and not (tmp_path / "strict.onnx").exists()


class RoutedSplit(nn.Module):
    """Keeps the rows the data routes here and splits them by a count read into Python (as switch_transformers'
    experts split their tokens): the traced graph holds the sample's count."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.conv(x).flatten(1)  # [batch, 8 * 64]
        positive = x.flatten(1).mean(1) > 0
        kept = rows[positive]  # as many rows as the data routes here (NonZero: computed in the graph)
        first, second = torch.split(kept, [1, int(positive.sum()) - 1])  # the sample's count, read into Python
        return torch.cat([first * 2.0, second])


def test_a_graph_that_holds_the_samples_routing_is_refused_with_the_module_named_not_an_onnxruntime_error(tmp_path):
    """switch_transformers: "the graph does not run on parity batch 1: [ONNXRuntimeError] ... Split" and nothing
    else. The refusal says the graph holds a size the sample's data fixed, where, and what to do."""
    model, batches = calibrated(RoutedSplit())
    signs = torch.tensor([1.0, 1.0, -1.0, -1.0]).view(4, 1, 1, 1)
    sample = batches[0].abs() * signs  # two rows routed each way
    other = batches[1].abs() * signs.abs()  # all four routed the first way: a batch of the sample's shape
    with pytest.raises(ExportValidationError) as info:
        export_qdq_onnx(model, sample, tmp_path / "m.onnx", exporter="torchscript", parity_batches=[other],
                        dynamic_batch=False)  # the batch fixed, as switch_transformers' was: only the data differs
    text = str(info.value)
    assert "runs on the sample but not on parity batch 1" in text and "a size the sample's data fixed" in text, text
    assert "Split" in text and "not written" in text
    assert not (tmp_path / "m.onnx").exists()
