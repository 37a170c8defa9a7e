"""Opening a lazily held checkpoint in seconds (issue 37 point 2): ``new``, ``open`` and ``show`` read no weight of
a ``hf:`` safetensors folder (their sample forwards run on meta), give the project, tree and placement the run on
the weights gives, fall back to that run when a forward needs values, and neither hash a large checkpoint again
nor read whole tensors for the weights digest."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_run import run
from tests.transformers.checkpoints import new_project
from workbench.sources import digest_cache, model_source
from workbench.sources.lazy_checkpoint import LazyCheckpoint

pytest.importorskip("accelerate")
HERE = Path(__file__).resolve().parent


@pytest.fixture(params=[False, True], ids=["single-file", "sharded"])
def folder(request, tmp_path, monkeypatch):
    sys.path.insert(0, str(HERE))
    import models

    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")  # tiny checkpoints open eagerly by default
    torch.manual_seed(0)
    folder = tmp_path / "llama"
    extra = {"max_shard_size": "20KB"} if request.param else {}
    models.hf_llama().to(torch.bfloat16).save_pretrained(folder, safe_serialization=True, **extra)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    return folder



def _show(capsys, project) -> dict:
    code, out, err = run(capsys, "show", project, "--json")
    assert code == 0, err
    data = json.loads(out)
    for key in ("name", "path", "file_revision"):
        data.pop(key, None)
    return data


def test_new_and_show_read_no_weight_and_give_the_run_on_the_weights(folder, tmp_path, capsys, monkeypatch):
    import workbench.session.reading as reading
    from workbench.session import Session

    with monkeypatch.context() as patch:  # as before: the sample forwards page the real weights through
        patch.setattr(reading.SessionReading, "_on_shapes", lambda self: False)
        weights_run = new_project(capsys, tmp_path, folder, "weights.qwb")
        weights_shown = _show(capsys, weights_run)
        reference = Session.open(weights_run)
        weights_shapes = reference.layer_shapes()

    keys: list[str] = []
    real_read, real_load = LazyCheckpoint.read, LazyCheckpoint._load
    monkeypatch.setattr(LazyCheckpoint, "read", lambda self, key, dtype=None: keys.append(key) or
                        real_read(self, key, dtype))

    def load(self, parameters):
        assert not any(p.is_meta for p in parameters), "a weight was read into memory"
        return real_load(self, parameters)
    monkeypatch.setattr(LazyCheckpoint, "_load", load)
    shapes_run = new_project(capsys, tmp_path, folder, "shapes.qwb")
    assert _show(capsys, shapes_run) == weights_shown  # the same tree, layers, functional report and placement
    session = Session.open(shapes_run)
    assert all(p.is_meta for p in session.float_model.parameters())
    assert all(p.is_meta for p in session.quantized_model().parameters())
    assert session.layer_shapes() == weights_shapes
    # whole tensors read: the persistent buffers at open, never a weight (the digest samples them)
    assert not any(key.endswith("weight") for key in keys)
    assert session.project.layers == reference.project.layers
    assert session.weights_digest == reference.weights_digest
    assert session.build_report.functional.inserted_names == reference.build_report.functional.inserted_names
    assert session.build_report.functional.inserted_names  # the attention's products, found on meta


def test_a_forward_that_fails_on_meta_runs_on_the_weights(folder, tmp_path, capsys, monkeypatch, caplog):
    import workbench.session.reading as reading

    reference = _show(capsys, new_project(capsys, tmp_path, folder, "reference.qwb"))

    def needs_values(inputs):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")
    monkeypatch.setattr(reading, "on_meta", needs_values)
    loaded = []
    real_load = LazyCheckpoint._load
    monkeypatch.setattr(LazyCheckpoint, "_load", lambda self, ps: loaded.extend(ps) or real_load(self, ps))
    with caplog.at_level("INFO", logger="workbench.sources.shapes_only"):
        project = new_project(capsys, tmp_path, folder, "fallback.qwb")
    assert loaded  # streamed through the weights instead
    assert "on shapes only (fake tensors) failed (RuntimeError: Tensor.item()" in caplog.text
    assert "running it on the weights" in caplog.text
    assert _show(capsys, project) == reference


def test_a_sample_that_does_not_fit_is_refused_as_before(folder, tmp_path, capsys):
    np.save(tmp_path / "floats.npy", np.zeros((4, 3, 5, 5), np.float32))  # images for a decoder
    code, _, err = run(capsys, "new", tmp_path / "bad.qwb", "--model", f"hf:{folder}", "--data",
                       tmp_path / "floats.npy", "--batch-size", "2", "--output-key", "logits")
    assert code != 0
    assert "failed on a sample input of shape (2, 3, 5, 5) float32" in err
    assert "Traceback" not in err and not (tmp_path / "bad.qwb").exists()


def test_strided_reads_give_the_values_of_whole_reads(folder):
    checkpoint = LazyCheckpoint(folder)
    for key in checkpoint.keys():
        whole = checkpoint.read(key).reshape(-1)
        for step, count in ((1, 4096), (3, 5), (7, 4096), (whole.numel() + 1, 4096)):
            part = checkpoint.read_strided(key, torch.float32, step, count)
            assert torch.equal(part, whole[::step][:count].float()), (key, step)
        assert checkpoint.read_strided(key, whole.dtype, 1, 4096).dtype == whole.dtype


def test_a_large_checkpoint_is_hashed_once_per_version(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(digest_cache, "CACHED_FROM_BYTES", 1)
    hashed: list[str] = []
    real = model_source.sha256_of
    monkeypatch.setattr(model_source, "sha256_of", lambda path: hashed.append(Path(path).name) or real(path))
    project = new_project(capsys, tmp_path, folder)
    files = sorted(hashed)
    assert any(name.endswith(".safetensors") for name in files)
    hashed.clear()
    assert _show(capsys, project)["file_changes"] == []
    assert hashed == []  # every file unchanged since: nothing read again
    assert digest_cache.cache_file().is_file()

    # a shard rewritten in place with its size and modification time kept: its change time moved, it is hashed
    shard = sorted(folder.glob("*.safetensors"))[-1]
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    import os
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changes = _show(capsys, project)["file_changes"]
    assert hashed == [shard.name]
    assert len(changes) == 1 and shard.name in changes[0] and "changed since the project was saved" in changes[0]


def test_an_unreadable_digest_table_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setattr(digest_cache, "CACHED_FROM_BYTES", 1)
    table = digest_cache.cache_file()
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text("{not json")
    target = tmp_path / "weights.bin"
    target.write_bytes(b"abc" * 100)
    calls = []
    digest = digest_cache.cached_sha256(target, lambda p: calls.append(p) or "d1")
    assert digest == "d1" and calls == [target]
    assert digest_cache.cached_sha256(target, lambda p: calls.append(p) or "d2") == "d1" and len(calls) == 1
    assert json.loads(table.read_text())[str(target.resolve())]["sha256"] == "d1"


def test_a_decoder_with_its_cache_runs_on_plain_meta_tensors(tmp_path, capsys, monkeypatch):
    """With a cache (transformers' default) the forward needs no fake tensors, whose per-operation dispatch costs
    tens of seconds on a real-sized model: the plain meta run is taken, and still no weight is read."""
    sys.path.insert(0, str(HERE))
    import models
    from torch._subclasses import fake_tensor

    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    model = models.hf_llama()
    model.config.use_cache = True
    model.to(torch.bfloat16).save_pretrained(tmp_path / "llama", safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    fakes, loads = [], []
    real_init = fake_tensor.FakeTensorMode.__init__
    monkeypatch.setattr(fake_tensor.FakeTensorMode, "__init__", lambda self, *a, **k: fakes.append(1) or
                        real_init(self, *a, **k))
    real_load = LazyCheckpoint._load
    monkeypatch.setattr(LazyCheckpoint, "_load", lambda self, ps: loads.extend(p for p in ps if p.is_meta)
                        or real_load(self, ps))
    project = new_project(capsys, tmp_path, tmp_path / "llama")
    shown = _show(capsys, project)
    assert fakes == [] and loads == []
    assert shown["layer_table"] and shown["functional"]
