"""Round 2, item 6: each pass gets its own copy of the batch. A model that changes its input in place got a
false score: the FP32 pass changed the batch, and the INT8 pass (or the export's onnxruntime run) read the
changed one (4 dB reported against 41 dB)."""
import copy

import pytest
import torch
from torch import nn

from workbench import quant
from workbench.analysis import evaluate_models, sensitivity
from workbench.export import export_qdq_onnx
from workbench.quant.algorithms.calibrate import calibrate


class Net(nn.Module):
    def __init__(self, in_place: bool):
        super().__init__()
        self.in_place = in_place
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        if self.in_place:
            x.mul_(4.0).add_(1.0)  # normalisation done in place on the caller's tensor
        else:
            x = x * 4.0 + 1.0
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def pair():
    """The same calibrated model twice: one edits its input in place, the other does not."""
    torch.manual_seed(0)
    pure = Net(in_place=False).eval()
    quant.replace_to_quantization_module(pure)
    calibrate(pure, [torch.randn(4, 3, 8, 8) for _ in range(2)], num_batches=2, method="max", report_sqnr=False)
    editing = copy.deepcopy(pure)
    editing.in_place = True
    return pure, editing


def batches():
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(4, 3, 8, 8, generator=generator) for _ in range(3)]


def test_evaluation_scores_a_model_that_edits_its_input_truly():
    pure, editing = pair()
    data = batches()
    kept = [b.clone() for b in data]
    expected = evaluate_models(pure, pure, batches(), "sqnr")
    found = evaluate_models(editing, editing, data, "sqnr")
    assert found.output_sqnr_db == pytest.approx(expected.output_sqnr_db, rel=1e-6)
    assert expected.output_sqnr_db > 20  # a true INT8 figure, not the few dB of a doubly-scaled input
    assert all(torch.equal(a, b) for a, b in zip(data, kept))  # the caller's batches are untouched


def test_calibration_sqnr_and_sensitivity_see_the_same_batch_in_every_pass():
    pure, editing = pair()
    first = [calibrate(m, batches(), num_batches=3, method="max").output_sqnr_db for m in (pure, editing)]
    assert first[1] == pytest.approx(first[0], rel=1e-6)
    ranks = [sensitivity(m, batches(), metric="sqnr", cache=False) for m in (pure, editing)]
    assert [u.value for u in ranks[1].units] == pytest.approx([u.value for u in ranks[0].units], rel=1e-6)


def test_export_validates_a_model_that_edits_its_input(tmp_path):
    _, editing = pair()
    sample = torch.randn(1, 3, 8, 8)
    report = export_qdq_onnx(editing, sample, tmp_path / "m.onnx")
    assert report.cosine > 0.999
