"""Quantization-aware fine-tuning on the demo digits CNN: recovery at 4 bits, fixed amax, cancel, errors."""
import math
import textwrap
import threading

import pytest
import torch
import torch.nn.functional as F

from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.demo import accuracy, load_digits_split
from workbench.sources.errors import TrustRequired
from workbench.sources.model_source import ModelSpec
from workbench.training import FinetuneError, finetune, recipe


def four_bit_session():
    """The demo with 4-bit weights, calibrated (the case where PTQ loses accuracy)."""
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=4),
                             DataSpec("demo", "digits", split="test", batch_size=256),
                             settings={"metric": {"name": "top1", "direction": None}})
    layers = [layer.name for layer in session.layers() if layer.weight_summary != "-"]
    session.set_descriptor(layers, "weight", num_bits=4)
    session.calibrate(method="max")
    return session


@pytest.fixture(scope="module")
def splits():
    return load_digits_split("train"), load_digits_split("test")


def params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def amaxes(model):
    return {name: q._amax.clone() for name, q in model.named_modules(remove_duplicate=False) if hasattr(q, "_amax")}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_recipe():
    assert recipe(0.1, 90) == {"lr": pytest.approx(1e-3), "schedule": "cosine", "epochs": 9}
    assert recipe(3e-3, 4)["epochs"] == 1 and "epochs" not in recipe(0.1)
    with pytest.raises(ValueError):
        recipe(0)


def test_4bit_fine_tune_recovers_accuracy_with_amax_fixed(splits):
    """PTQ at 4 bits loses accuracy on the test split; three short epochs at the recipe's rate win most of it
    back, amax stays as calibrated, and the user's float model keeps its weights."""
    train, test = splits
    session = four_bit_session()
    model = session.quantized_model()
    fp32 = accuracy(session.float_model, test)
    ptq = accuracy(model, test)
    assert ptq < fp32 - 0.005, (ptq, fp32)  # PTQ does lose here
    with torch.no_grad():
        ptq_loss = float(F.cross_entropy(model(test.images), test.labels))
    float_before, amax_before = params(session.float_model), amaxes(model)

    # the demo was trained with Adam at 3e-3: the recipe starts at 1% of that
    result = finetune(model, train.batches(64), "cross_entropy", epochs=3, optimizer="adam", **recipe(3e-3),
                      eval_batches=test.batches(256), metric="top1")
    tuned = accuracy(model, test)
    with torch.no_grad():
        tuned_loss = float(F.cross_entropy(model(test.images), test.labels))
    print(f"4-bit digits: FP32 {fp32:.4f}, PTQ {ptq:.4f} (loss {ptq_loss:.4f}), "
          f"fine-tuned {tuned:.4f} (loss {tuned_loss:.4f}); {result.summary()}")
    assert tuned - ptq >= 0.4 * (fp32 - ptq)  # a measurable part of the loss comes back
    assert tuned_loss < 0.8 * ptq_loss
    assert result.best.metric == pytest.approx(tuned) and result.baseline.metric == pytest.approx(ptq)
    assert [e.epoch for e in result.history] == [1, 2, 3] and not result.cancelled
    assert same(amax_before, amaxes(model))  # fixed amax: the calibrated representation is kept
    assert same(float_before, params(session.float_model))  # the float model shares nothing trained
    assert model.fc.weight is not session.float_model.fc.weight
    assert all(not q._learn_amax and not hasattr(q, "clip") for q in model.modules() if hasattr(q, "_learn_amax"))
    assert not model.training  # back in the mode it came in


def test_cosine_and_constant_schedules(splits):
    train, _ = splits
    session = four_bit_session()
    steps = []
    finetune(session.quantized_model(), train.batches(128), epochs=2, lr=1e-3, steps_per_epoch=4,
             on_step=steps.append)
    rates = [s.lr for s in steps]
    assert [(s.epoch, s.step, s.global_step) for s in steps][:5] == [(1, 1, 1), (1, 2, 2), (1, 3, 3), (1, 4, 4),
                                                                     (2, 1, 5)]
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == pytest.approx(1e-5)  # down to 1% of the start
    assert all(a > b for a, b in zip(rates, rates[1:])) and all(math.isfinite(s.loss) for s in steps)
    steps.clear()
    result = finetune(session.quantized_model(), train.batches(128), epochs=1, lr=1e-4, schedule="constant",
                      optimizer="adam", steps_per_epoch=3, on_step=steps.append)
    assert [s.lr for s in steps] == [1e-4] * 3
    assert result.criterion == "train_loss" and result.best_epoch == 1  # no evaluation data: the training loss


def test_cancel_before_the_first_epoch_leaves_the_model_untouched(splits):
    train, test = splits
    session = four_bit_session()
    model = session.quantized_model()
    before, amax_before = params(model), amaxes(model)
    with torch.no_grad():
        output_before = model(test.images[:64])
    cancel = threading.Event()

    def on_step(step):
        if step.step == 5:
            cancel.set()  # mid-epoch: five steps have changed the weights

    result = finetune(model, train.batches(64), epochs=2, lr=1e-3, optimizer="adam", eval_batches=test.batches(256),
                      metric="top1", cancel=cancel, on_step=on_step)
    assert result.cancelled and result.steps == 5 and result.epochs_completed == 0 and result.best_epoch == 0
    assert same(before, params(model)) and same(amax_before, amaxes(model))
    with torch.no_grad():
        assert torch.equal(model(test.images[:64]), output_before)


def test_cancel_mid_epoch_keeps_the_best_checkpoint(splits):
    train, test = splits
    session = four_bit_session()
    model = session.quantized_model()
    cancel = threading.Event()
    best = {}

    def on_epoch(record):
        if record.best:  # the checkpoint finetune keeps: the parameters as this epoch left them
            best["epoch"], best["params"] = record.epoch, params(model)

    def on_step(step):
        if step.epoch == 2 and step.step == 3:
            cancel.set()

    result = finetune(model, train.batches(64), epochs=3, lr=3e-5, optimizer="adam", eval_batches=test.batches(256),
                      metric="top1", cancel=cancel, on_step=on_step, on_epoch=on_epoch)
    # 20 steps in epoch 1, then 3: cancel is seen before step 4
    assert result.cancelled and result.epochs_completed == 1 and result.steps == 23
    assert result.best_epoch == best["epoch"]
    assert same(best["params"], params(model))  # consistent: exactly the best checkpoint, not half of epoch 2
    assert result.best_epoch == 1  # this short fine-tune beats PTQ after one epoch


def test_learnable_amax_for_chosen_quantizers(splits):
    train, test = splits
    session = four_bit_session()
    model = session.quantized_model()
    before = amaxes(model)
    result = finetune(model, train.batches(64), epochs=1, lr=1e-2, optimizer="adam", steps_per_epoch=10,
                      learn_amax=[r"fc\._input_quantizer", r"fc\._weight_quantizer"],
                      eval_batches=test.batches(256), metric="top1")
    assert result.learn_amax_skipped == {"fc._weight_quantizer": "per-channel amax: only a per-tensor range can be "
                                                                 "learned"}
    change = result.learned_amax["fc._input_quantizer"]
    assert change["before"] == pytest.approx(float(before["fc._input_quantizer"]))
    assert float(model.fc._input_quantizer._amax) == pytest.approx(change["after"])
    assert not model.fc._input_quantizer.learn_amax and not hasattr(model.fc._input_quantizer, "clip")
    others = {k: v for k, v in amaxes(model).items() if k != "fc._input_quantizer"}
    assert same(others, {k: before[k] for k in others})
    with pytest.raises(ValueError, match="no quantizer name matches"):
        finetune(model, train.batches(64), epochs=1, lr=1e-4, learn_amax="no_such_quantizer")


def test_a_nan_loss_stops_with_the_best_parameters(splits):
    train, _ = splits
    session = four_bit_session()
    model = session.quantized_model()
    before = params(model)
    calls = []

    def exploding(outputs, targets):
        calls.append(1)
        return F.cross_entropy(outputs, targets) * (math.nan if len(calls) > 3 else 1.0)

    with pytest.raises(FinetuneError, match="loss became nan at epoch 1, step 4"):
        finetune(model, train.batches(64), exploding, epochs=1, lr=1e-3)
    assert same(before, params(model))

    def broken(outputs, targets):
        raise RuntimeError("shape mismatch in my loss")

    with pytest.raises(FinetuneError, match="shape mismatch in my loss"):
        finetune(model, train.batches(64), broken, epochs=1, lr=1e-3)
    assert same(before, params(model))


def test_bad_arguments_change_nothing(splits, tmp_path):
    train, test = splits
    session = four_bit_session()
    model = session.quantized_model()
    before = params(model)
    for kwargs, error in [({"epochs": 0, "lr": 1e-3}, ValueError), ({"epochs": 1, "lr": -1.0}, ValueError),
                          ({"epochs": 1, "lr": 1e-3, "schedule": "linear"}, ValueError),
                          ({"epochs": 1, "lr": 1e-3, "optimizer": "rmsprop"}, ValueError),
                          ({"epochs": 1, "lr": 1e-3, "metric": "top1"}, ValueError),
                          ({"epochs": 1, "lr": 1e-3, "amp": True}, ValueError)]:
        with pytest.raises(error):
            finetune(model, train.batches(64), **kwargs)
    with pytest.raises(TypeError, match="re-iterable"):
        finetune(model, iter(train.batches(64)), epochs=1, lr=1e-3)
    unlabelled = [images for images, _ in train.batches(64)]
    with pytest.raises(FinetuneError, match="needs labelled batches"):
        finetune(model, unlabelled, epochs=1, lr=1e-3)
    (tmp_path / "myloss.py").write_text(textwrap.dedent("""
        import torch.nn.functional as F
        def smooth(outputs, targets):
            return F.cross_entropy(outputs, targets, label_smoothing=0.1)
    """))
    with pytest.raises(TrustRequired, match="trust"):
        finetune(model, train.batches(64), f"{tmp_path}/myloss.py:smooth", epochs=1, lr=1e-3)
    assert same(before, params(model))
    result = finetune(model, train.batches(64), f"{tmp_path}/myloss.py:smooth", epochs=1, lr=1e-4,
                      steps_per_epoch=2, trust_code=True)
    assert result.settings["loss"].endswith("myloss.py:smooth") and result.steps == 2


@pytest.mark.cuda
def test_cuda_trains_with_mixed_precision(splits):
    train, test = splits
    session = four_bit_session()
    session.set_device("cuda")
    model = session.quantized_model()
    float_before, amax_before = params(session.float_model), amaxes(model)
    result = finetune(model, train.batches(64), epochs=2, lr=3e-5, optimizer="adam",
                      eval_batches=test.batches(256), metric="top1")
    assert result.settings["amp"] is True and result.settings["device"].startswith("cuda")
    assert all(math.isfinite(e.train_loss) for e in result.history)
    assert result.history[0].eval_loss < result.baseline.eval_loss  # it learns under float16 autocast
    weight = next(model.parameters())
    assert weight.device.type == "cuda" and weight.dtype == torch.float32  # float32 master weights
    assert same(amax_before, amaxes(model)) and same(float_before, params(session.float_model))
