"""Export without the whole model (issue 37 point 4): a lazily opened ``hf:`` checkpoint is exported with its graph
traced on FakeTensors and each initializer read from the checkpoint (and quantized) as it is written; the file is
the one the eager export writes, no step held every weight at once, and a shard that goes bad mid-export is named
with no file left behind."""
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.cli_run import run
from workbench.export import exporters
from workbench.export.errors import ExportError
from workbench.export.streamed_export import ROUTE_KIND, export_streamed
from workbench.session import Session
from workbench.sources import lazy_checkpoint, model_source

pytest.importorskip("accelerate")


def _llama(folder: Path, sharded: bool = False) -> None:
    """A LLaMA whose Linear layers take INT4 blocks of 64 (hidden 64), in bf16 as checkpoints ship."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                         attn_implementation="eager")
    torch.manual_seed(0)
    extra = {"max_shard_size": "40KB"} if sharded else {}
    LlamaForCausalLM(config).eval().to(torch.bfloat16).save_pretrained(folder, safe_serialization=True, **extra)


def _project(tmp_path: Path, capsys, precision: str, sharded: bool = False) -> Path:
    folder = tmp_path / "llama"
    _llama(folder, sharded)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits")
    assert code == 0, err
    assert run(capsys, "set", project, "--type", "Linear", "--precision", precision)[0] == 0
    code, _, err = run(capsys, "calibrate", project, "--method", "max")
    assert code == 0, err
    return project


@pytest.fixture
def lazily(monkeypatch):
    """These checkpoints are tiny: by default (``auto``) only large ones open lazily."""
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")


class Residency:
    """Counts, at every read from the checkpoint, the bytes of weights in memory: the model's parameters not on
    meta (paged in by a forward) plus the tensors read for writing that are still alive."""

    def __init__(self, monkeypatch, model: torch.nn.Module) -> None:
        import weakref

        self.model, self.live, self.peak, self.reads = model, 0, 0, []
        original = lazy_checkpoint.LazyCheckpoint.read

        def read(checkpoint, key, dtype=None):
            tensor = original(checkpoint, key, dtype)
            size = tensor.numel() * tensor.element_size()
            self.live += size
            weakref.finalize(tensor, self._freed, size)
            resident = sum(p.numel() * p.element_size() for p in self.model.parameters() if not p.is_meta)
            self.peak = max(self.peak, self.live + resident)
            self.reads.append(key)
            return tensor
        monkeypatch.setattr(lazy_checkpoint.LazyCheckpoint, "read", read)

    def _freed(self, size: int) -> None:
        self.live -= size


def _external_spans(path: Path) -> list[tuple[int, int]]:
    model = onnx.load(str(path), load_external_data=False)
    spans = []
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            spans.append((int(info.get("offset", 0)), int(info["length"])))
    return sorted(spans)


@pytest.mark.parametrize("precision", ["int8", "int4w", "fp8"])
def test_streamed_export_writes_the_eager_file(precision, tmp_path, capsys, monkeypatch, lazily):
    project = _project(tmp_path, capsys, precision)
    # the weights go through the exporter's data file as a large model's do (then folded into one file)
    monkeypatch.setattr(exporters, "STREAM_THRESHOLD", 1000)
    session = Session.open(project)
    model = session.float_model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    residency = Residency(monkeypatch, model)
    files = {"streamed": tmp_path / "streamed" / "m.onnx", "eager": tmp_path / "eager" / "m.onnx"}
    for path in files.values():
        path.parent.mkdir()
    report = session.export(files["streamed"])
    assert residency.peak < 0.6 * total  # never every weight at once: about one block (of three) and one tensor
    assert all(p.is_meta for p in model.parameters())  # and none left in memory
    checkpoint = session._loaded.checkpoint
    assert {key for key in checkpoint.keys() if key.endswith("weight")} <= set(residency.reads)
    route = [note for note in report.notes if report.entry_kinds.get(note) == ROUTE_KIND]
    assert len(route) == 1 and route[0].startswith("streamed from the checkpoint"), report.notes
    assert report.validated
    # over the external-data threshold: the data file beside the graph
    external = {"streamed": tmp_path / "streamed" / "x.onnx", "eager": tmp_path / "eager" / "x.onnx"}
    report, weights = export_streamed(session.quantized_model(), checkpoint, model, session.sample_inputs(),
                                      external["streamed"], external_data_threshold=1000)
    assert report.validated and residency.peak < 0.6 * total

    monkeypatch.undo()  # read as before, and every weight read at once by transformers' eager load
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "never")
    monkeypatch.setattr(exporters, "STREAM_THRESHOLD", 1000)
    eager_session = Session.open(project)
    assert eager_session._loaded.checkpoint is None
    eager_report = eager_session.export(files["eager"])
    assert not [note for note in eager_report.notes if eager_report.entry_kinds.get(note) == ROUTE_KIND]
    assert files["streamed"].read_bytes() == files["eager"].read_bytes()  # graph and initializers, byte for byte
    written = onnx.load(str(files["streamed"]))
    if precision == "int4w":  # the quantized weights are INT4 initializers, two values a byte
        int4 = [t for t in written.graph.initializer if t.data_type == onnx.TensorProto.INT4]
        assert len(int4) == 22 and all(len(t.raw_data) * 2 == int(np.prod(t.dims)) for t in int4)

    from workbench.export import export_qdq_onnx

    export_qdq_onnx(eager_session.quantized_model(), eager_session.sample_inputs(), external["eager"],
                    external_data_threshold=1000)
    data = {route: path.with_name("x.onnx.data") for route, path in external.items()}
    assert data["streamed"].read_bytes() == data["eager"].read_bytes()
    assert onnx.load(str(external["streamed"]), load_external_data=False) == \
        onnx.load(str(external["eager"]), load_external_data=False)
    spans = _external_spans(external["streamed"])
    assert sum(length for _, length in spans) == data["streamed"].stat().st_size  # no byte unreferenced
    assert all(offset + length <= after for (offset, length), (after, _) in zip(spans, spans[1:]))
    assert sorted(p.name for p in external["streamed"].parent.iterdir()) == ["m.onnx", "x.onnx", "x.onnx.data"]


def test_a_shard_gone_bad_while_exporting_is_named(tmp_path, capsys, lazily):
    project = _project(tmp_path, capsys, "int8", sharded=True)
    session = Session.open(project)
    model = session.quantized_model()
    shards = sorted((tmp_path / "llama").glob("model-*.safetensors"))
    assert len(shards) > 2
    shard = shards[-1]  # the last blocks' weights: read after the first ones were
    kept = shard.read_bytes()
    for damage in ("missing", "truncated"):
        if damage == "missing":
            shard.unlink()
        else:
            shard.write_bytes(kept[:200])
        output = tmp_path / damage
        output.mkdir()
        with pytest.raises(ExportError) as raised:
            export_streamed(model, session._loaded.checkpoint, session.float_model, session.sample_inputs(),
                            output / "m.onnx", external_data_threshold=1000)
        message = str(raised.value)
        named = re.search(r"tensor (\S+) cannot be read", message)
        assert str(shard) in message and named and named.group(1) in session._loaded.checkpoint.keys(), message
        assert "Nothing was written" in message
        assert list(output.iterdir()) == []  # no .onnx, no .data, no temporary

