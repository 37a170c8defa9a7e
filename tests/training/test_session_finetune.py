"""Fine-tuning through the session: stored in the project, restored on reopening, exported, migrated."""
import sqlite3
import threading

import numpy as np
import pytest
import torch

from workbench.project import load_project
from workbench.project import store as project_store
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.demo import load_digits_split
from workbench.sources.model_source import ModelSpec


def demo_session(**settings):
    return Session.create(ModelSpec("demo", "digits"),
                          DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2),
                          DataSpec("demo", "digits", split="test", batch_size=256),
                          settings={"metric": {"name": "top1", "direction": None}, **settings})


def outputs(session, images):
    with torch.no_grad():
        return session.quantized_model()(images)


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """An 8-bit demo project calibrated to lose accuracy (activations clipped at the 95th percentile),
    fine-tuned with one learned range, saved."""
    folder = tmp_path_factory.mktemp("tuned")
    session = demo_session()
    session.calibrate(method="percentile", percentile=95.0)
    calibrated = outputs(session, load_digits_split("test").images[:64])
    float_state = state(session.float_model)
    result = session.finetune(epochs=2, lr=1e-3, optimizer="adam", steps_per_epoch=8,
                              learn_amax=[r"head_pool\._input_quantizer"])
    assert result.best_epoch > 0 and result.best.metric > result.baseline.metric
    path = session.save(folder / "tuned.qwb")
    return session, result, path, calibrated, float_state


def test_the_fine_tune_is_stored_and_restored_on_reopening(tuned):
    session, result, path, calibrated, float_state = tuned
    images = load_digits_split("test").images[:64]
    assert same(float_state, state(session.float_model))  # the user's weights never change
    assert not torch.equal(outputs(session, images), calibrated)  # the quantized model did
    record = session.project.current_finetune
    assert record.data == result.to_dict() and record.calibration_id == session.project.current_calibration.id
    assert record.folded == ["block.conv1", "block.conv2", "expand.0", "stem.0"]
    assert set(record.amax) == {"head_pool._input_quantizer"}
    assert session.project.settings["finetune"]["lr"] == 1e-3  # the options used are the project's now

    reopened = Session.open(path)
    assert reopened.build_report.finetune == "fine-tuned weights of run 1 in use, 1 learned amax"
    assert reopened.build_report.stale == []
    assert torch.equal(outputs(reopened, images), outputs(session, images))  # same weights, same learned range
    assert float(reopened.quantized_model().head_pool._input_quantizer._amax) == \
        pytest.approx(result.learned_amax["head_pool._input_quantizer"]["after"])
    history = reopened.finetune_history()
    assert [h.to_dict() for h in history] == [result.to_dict()]
    assert [e.epoch for e in history[0].history] == [1, 2] and history[0].history[0].train_loss > 0
    assert reopened.evaluate("top1").int8 == session.evaluate("top1").int8
    summary = reopened.summary()
    assert summary["finetune"]["id"] == 1 and summary["finetune_runs"] == 1
    assert [p["bn"] for p in summary["folding"]["folded"]] == ["stem.1", "block.bn1", "block.bn2", "expand.1"]
    with sqlite3.connect(path) as connection:  # weights as raw bytes with dtype and shape, never a pickle
        row = connection.execute("SELECT data, dtype, shape FROM finetune_tensors WHERE name = 'fc.weight'").fetchone()
    assert row[1] == "float32" and row[2] == "[10, 32]" and len(row[0]) == 10 * 32 * 4


def test_an_exported_fine_tuned_model_validates_and_holds_the_new_weights(tuned, tmp_path):
    import onnxruntime as ort

    session, _, path, calibrated, _ = tuned
    reopened = Session.open(path)
    report = reopened.export(tmp_path / "tuned.onnx")
    assert report.cosine > 0.999 and report.quantize_nodes > 0  # validated like any export
    images = load_digits_split("test").images[:64]
    run = ort.InferenceSession(str(tmp_path / "tuned.onnx"), providers=["CPUExecutionProvider"])
    onnx_out = torch.from_numpy(run.run(None, {run.get_inputs()[0].name: images.numpy()})[0])
    tuned_out = outputs(reopened, images)
    # the file computes the fine-tuned model, not the calibrated one it started from
    assert (onnx_out - tuned_out).abs().max() < 0.1 * (onnx_out - calibrated).abs().max()


def test_recalibrating_keeps_the_weights_and_drops_the_learned_range(tuned):
    _, _, path, _, _ = tuned
    session = Session.open(path)
    tuned_weight = session.quantized_model().fc.weight.detach().clone()
    session.calibrate(method="max")
    session._invalidate()  # rebuild as on reopening
    model = session.quantized_model()
    assert torch.equal(model.fc.weight, tuned_weight)
    assert session.build_report.finetune == "fine-tuned weights of run 1 in use"
    run = session.project.current_calibration
    assert np.array_equal(model.head_pool._input_quantizer._amax.cpu().numpy(),
                          run.quantizers["head_pool._input_quantizer"].amax)


def test_reset_and_a_changed_fold_setting_give_the_calibrated_weights_back(tuned):
    session, _, path, _, float_state = tuned
    reopened = Session.open(path)
    reopened.set_setting("fold_bn", False)
    model = reopened.quantized_model()
    assert "not used" in reopened.build_report.finetune and "4 BatchNorms folded" in reopened.build_report.finetune
    assert torch.equal(model.fc.weight, reopened.float_model.fc.weight)
    reopened.set_setting("fold_bn", True)
    assert reopened.reset_finetune() and not reopened.reset_finetune()
    assert reopened.quantized_model().fc.weight is reopened.float_model.fc.weight
    assert reopened.project.current_finetune is None and len(reopened.finetune_history()) == 1  # history stays


def test_a_fine_tune_cancelled_before_an_epoch_is_not_stored():
    session = demo_session()
    session.calibrate(method="max")
    images = load_digits_split("test").images[:64]
    before = outputs(session, images)
    cancel = threading.Event()

    def on_step(step):
        cancel.set()

    result = session.finetune(epochs=2, lr=1e-2, optimizer="adam", cancel=cancel, on_step=on_step)
    assert result.cancelled and result.epochs_completed == 0 and result.steps == 1
    assert session.project.finetunes == [] and torch.equal(outputs(session, images), before)
    with pytest.raises(Exception, match="trust"):
        session.finetune(loss="my_losses:focal")


def make_version_1(path):
    """What version 1 of the format held: no fine-tune tables, no folded column, no fold_bn setting."""
    connection = sqlite3.connect(path)
    connection.execute("DROP TABLE finetune_runs")
    connection.execute("DROP TABLE finetune_tensors")
    connection.execute("ALTER TABLE calibration_runs DROP COLUMN folded")
    connection.execute("DELETE FROM settings WHERE key IN ('fold_bn', 'finetune')")
    connection.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    connection.commit()
    connection.close()


def test_a_version_1_project_opens_migrated_and_rebuilds_as_it_was(tmp_path):
    """A project saved before folding existed was calibrated unfolded: it must reopen unfolded, with the
    same amax, the same outputs, and nothing stale; saving writes version 2 over it."""
    session = demo_session(fold_bn=False)  # what the version-1 code built
    session.calibrate(method="max")
    path = session.save(tmp_path / "v1.qwb")
    make_version_1(path)
    tables = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "finetune_runs" not in tables

    project = load_project(path)
    assert project.settings["fold_bn"] is False and project.finetunes == []
    assert all(run.folded is None for run in project.calibrations)
    reopened = Session.open(path)
    assert reopened.build_report.stale == [] and reopened.folded_layers() == {}
    images = load_digits_split("test").images[:64]
    assert torch.equal(outputs(reopened, images), outputs(session, images))

    result = reopened.finetune(epochs=1, lr=1e-4, steps_per_epoch=3)  # the new feature works on it
    reopened.save()
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == \
            str(project_store.SCHEMA_VERSION)
    again = Session.open(path)
    assert [h.to_dict() for h in again.finetune_history()] == [result.to_dict()]
    assert torch.equal(outputs(again, images), outputs(reopened, images))
