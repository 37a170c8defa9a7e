"""What a batch and a model output mean, for calibration, metrics, losses and export alike."""
from __future__ import annotations

import math

import pytest
import torch

from workbench.quant.batches import batch_targets, class_scores, flat_tensors, model_inputs, sqnr_db


def test_model_inputs_of_each_batch_form():
    x, y = torch.ones(2, 3), torch.tensor([0, 1])
    assert model_inputs(x)[0][0] is x
    assert model_inputs((x, y))[0][0] is x
    args, kwargs = model_inputs(((x, x), y))
    assert len(args) == 2 and kwargs == {}
    assert model_inputs({"input_ids": x}) == ((), {"input_ids": x})
    with pytest.raises(TypeError, match="A batch must be a tensor"):
        model_inputs("images/")


def test_batch_targets_of_pairs_dicts_and_unlabelled_batches():
    x, y = torch.ones(2, 3), torch.tensor([0, 1])
    assert batch_targets((x, y)) is y
    assert batch_targets({"pixels": x, "labels": y}) is y
    assert batch_targets({"pixels": x, "target": y}) is y
    assert batch_targets(x) is None and batch_targets({"pixels": x}) is None and batch_targets((x,)) is None


def test_class_scores_prefers_logits_then_the_first_tensor():
    logits, hidden = torch.randn(2, 10), torch.randn(2, 4)
    assert class_scores({"hidden": hidden, "logits": logits}) is logits
    assert class_scores((logits, hidden)) is logits
    assert flat_tensors({"a": [logits, (hidden,)]}) == [logits, hidden]
    with pytest.raises(ValueError, match="no tensor of class scores"):
        class_scores({"text": "none"})


def test_sqnr_of_equal_and_noisy_outputs():
    ref = torch.ones(100)
    assert math.isinf(sqnr_db(ref, ref.clone()))
    assert sqnr_db(ref, ref + 0.1) == pytest.approx(20.0, abs=1e-3)  # signal 1, noise 0.01: 20 dB
    assert sqnr_db((ref,), (ref, ref)) is None  # different structures cannot be compared
