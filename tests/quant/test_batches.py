"""What a batch and a model output mean, for calibration, metrics, losses and export alike."""
from __future__ import annotations

import math

import pytest
import torch

from workbench.quant.algorithms.batches import (
    batch_targets,
    class_scores,
    first_samples,
    flat_tensors,
    input_shapes,
    model_inputs,
    select_output,
    sqnr_db,
)


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


def test_dict_batches_keep_labels_out_of_the_forward():
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert model_inputs({"input_ids": ids, "labels": torch.ones(2)}) == ((), {"input_ids": ids})
    args, kwargs = model_inputs(({"input_ids": ids, "attention_mask": ids}, torch.ones(2)))
    assert args == () and list(kwargs) == ["input_ids", "attention_mask"]
    assert first_samples({"input_ids": ids, "mask": ids[:, :2]}, 1)["mask"].shape == (1, 2)
    assert input_shapes((), kwargs) == "input_ids (2, 4) int64, attention_mask (2, 4) int64"


class _Output(dict):
    """A dict with attribute access, the way transformers' ModelOutput behaves."""

    def __getattr__(self, name):
        return self[name]


def test_select_output_picks_the_first_tensor_or_the_named_entry():
    logits, hidden = torch.randn(2, 3), torch.randn(2, 4)
    cache = object()  # a DynamicCache is no tensor
    output = _Output(logits=logits, past_key_values=cache, hidden=hidden)
    assert select_output(output) is logits
    assert select_output(output, "hidden") is hidden
    assert select_output(logits) is logits
    plain = (logits, hidden)  # a plain multi-output model keeps every output
    assert select_output(plain) is plain and select_output(plain, "1") is hidden
    assert select_output(((logits, hidden), cache)) is logits
    with pytest.raises(ValueError, match="no tensor under 'score'; it has: logits, past_key_values, hidden"):
        select_output(output, "score")
    with pytest.raises(ValueError, match="no tensor under 'past_key_values'"):
        select_output(output, "past_key_values")
    with pytest.raises(ValueError, match="holds no tensor"):
        select_output({"text": "none"})


def test_sqnr_compares_the_selected_output_only():
    ref = _Output(logits=torch.ones(4), extra=torch.zeros(4))
    noisy = _Output(logits=torch.ones(4) * 1.1, extra=torch.ones(4) * 100)
    assert sqnr_db(ref, noisy) == pytest.approx(20.0)
    assert sqnr_db([ref, ref], [noisy, noisy]) == pytest.approx(20.0)
