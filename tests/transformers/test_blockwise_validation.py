"""Validation block by block (issue 37 point 4): a streamed export's file is run one decoder block at a time, each
piece's weights read from the data file when it runs, with the whole graph's outputs and verdict; a block that
computes differently is named, and a refused file leaves nothing behind."""
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.cli_run import run
from workbench.export import blockwise_validation, file_checks
from workbench.export.blockwise_validation import BLOCKWISE_NOTE, PiecewiseSession
from workbench.export.errors import ExportValidationError
from workbench.export.streamed_export import export_streamed
from workbench.session import Session
from workbench.sources import model_source

pytest.importorskip("accelerate")

BLOCKS = [f"model.layers.{index}" for index in range(3)]


def _project(tmp_path: Path, capsys, dtype: torch.dtype) -> Path:
    """A 3-block LLaMA checkpoint in ``dtype`` (INT4 weights, INT8 activations)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                         attn_implementation="eager")
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().to(dtype).save_pretrained(tmp_path / "llama", safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    path = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"hf:{tmp_path / 'llama'}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits")
    assert code == 0, err
    assert run(capsys, "set", path, "--type", "Linear", "--precision", "int4w")[0] == 0
    code, _, err = run(capsys, "calibrate", path, "--method", "max")
    assert code == 0, err
    return path


@pytest.fixture
def lazily(monkeypatch):
    """Checkpoints this small open eagerly by default (``auto``): open them as large ones open."""
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")


@pytest.fixture
def project(tmp_path: Path, capsys, lazily) -> Path:
    """The bf16 LLaMA, opened lazily."""
    return _project(tmp_path, capsys, torch.bfloat16)


def _route(report) -> str:
    notes = [note for note in report.notes if report.entry_kinds.get(note) == BLOCKWISE_NOTE]
    assert len(notes) == 1, report.notes
    return notes[0]


def _headline_rows(report) -> list[tuple]:
    return [(row.check, row.output, row.shape, row.max_abs_diff, row.cosine) for row in report.checks
            if row.in_headline]


def _only_own_weights(read: dict[str, set[str]]) -> None:
    """No piece read a tensor of another block's but those the graph shares between blocks (the exporter merges
    equal constants: the norms' weights of a random checkpoint, all ones, are one initializer)."""
    for name, initializers in read.items():
        for block in BLOCKS:
            if block != name:
                theirs = {init for init in initializers if init.startswith(f"{block}.")}
                assert theirs <= read[block], (name, theirs - read[block])
                assert not any(init.endswith("proj.weight") for init in theirs), (name, theirs)


def test_block_by_block_gives_the_whole_graphs_outputs_and_verdict(project, tmp_path, monkeypatch):
    session = Session.open(project)
    blockwise = tmp_path / "blockwise" / "m.onnx"
    blockwise.parent.mkdir()
    read = []
    original = PiecewiseSession._run_piece

    def run_piece(self, piece, env):  # which initializers each piece held
        read.append((piece.name, set(piece.initializers)))
        return original(self, piece, env)
    monkeypatch.setattr(PiecewiseSession, "_run_piece", run_piece)
    report = session.export(blockwise)
    assert report.validated
    assert _route(report).startswith("validated block by block (a streamed export): 4 pieces")
    # one row per block, each block's output as close to PyTorch's as a rounding apart
    block_rows = [row for row in report.checks if row.check.startswith("block ")]
    assert [row.check for row in block_rows] == [f"block {name} output (sample inputs)" for name in BLOCKS]
    assert all(not row.in_headline and row.cosine > 0.999 and row.shape == (1, 8, 64) for row in block_rows)
    _only_own_weights(dict(read))

    monkeypatch.setattr(blockwise_validation, "STREAMED_BLOCK_BY_BLOCK", False)
    whole = tmp_path / "whole" / "m.onnx"
    whole.parent.mkdir()
    whole_report = Session.open(project).export(whole)
    assert _route(whole_report).startswith("validated as a whole graph on onnx's reference evaluator")
    assert not any(row.check.startswith("block ") for row in whole_report.checks)
    # the same file, the same figures to the last bit, the same verdict
    assert whole.read_bytes() == blockwise.read_bytes()
    assert _headline_rows(whole_report) == _headline_rows(report)
    assert whole_report.validated == report.validated


def test_piecewise_outputs_equal_the_whole_graphs_on_onnxruntime(tmp_path, capsys, lazily):
    """A float32 checkpoint's file (its data beside it) runs on onnxruntime: the pieces, run in turn, compute the
    whole graph's outputs bit for bit, each piece holding only its own block's initializers."""
    from workbench.export.validation import ort_session

    session = Session.open(_project(tmp_path, capsys, torch.float32))
    path = tmp_path / "x.onnx"
    report, _ = export_streamed(session.quantized_model(), session._loaded.checkpoint, session.float_model,
                                session.sample_inputs(), path, external_data_threshold=1000)
    assert report.validated and Path(f"{path}.data").exists()
    assert _route(report).startswith("validated block by block (a streamed export): 4 pieces run in turn on "
                                     "onnxruntime")
    ids = np.load(tmp_path / "ids.npy")[:3]
    pieces = PiecewiseSession.open(path, BLOCKS, "onnxruntime")
    assert [piece.name for piece in pieces.pieces] == [*BLOCKS, "after the blocks"]
    _only_own_weights({piece.name: set(piece.initializers) for piece in pieces.pieces})
    expected = ort_session(str(path)).run(None, {"input_ids": ids})
    assert np.array_equal(pieces.run(None, {"input_ids": ids})[0], expected[0])
    assert list(tmp_path.glob(".x.onnx*")) == []  # the pieces' temporary files are gone


def test_a_corrupted_block_is_named_and_nothing_is_left(project, tmp_path, monkeypatch):
    """The INT4 weight scales of block 1's down_proj made 50x too large in the file: the block-by-block validation
    names that block (the first whose output parts, computing differently from PyTorch's own input); strict, no file
    is left."""
    original = file_checks.stage
    corrupted = "model.layers.1.mlp.down_proj._weight_quantizer.scale"

    def stage(proto, target, threshold, **options):
        scales = [init for init in proto.graph.initializer if init.name == corrupted]
        assert len(scales) == 1, [init.name for init in proto.graph.initializer if "layers.1.mlp" in init.name]
        value = onnx.numpy_helper.to_array(scales[0]) * np.float32(50)
        scales[0].CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float32), corrupted))
        return original(proto, target, threshold, **options)
    monkeypatch.setattr(file_checks, "stage", stage)

    session = Session.open(project)
    folder = tmp_path / "out"
    folder.mkdir()
    report = session.export(folder / "m.onnx")
    assert not report.validated
    diagnosis = report.parity_diagnosis
    assert diagnosis["module"] == "model.layers.1" and diagnosis["verdict"] == "operation", diagnosis
    assert "block model.layers.1 is the first whose output" in diagnosis["text"]
    rows = {row.check: row.cosine for row in report.checks}
    assert rows["block model.layers.0 output (sample inputs)"] > 0.999 > rows["block model.layers.1 output "
                                                                              "(sample inputs)"]

    strict = tmp_path / "strict"
    strict.mkdir()
    with pytest.raises(ExportValidationError) as raised:
        export_streamed(session.quantized_model(), session._loaded.checkpoint, session.float_model,
                        session.sample_inputs(), strict / "m.onnx", strict=True, external_data_threshold=1000)
    assert "block model.layers.1" in str(raised.value) and "no file was written" in str(raised.value)
    assert list(strict.iterdir()) == []  # neither the graph, nor its data file, nor a piece's temporary file


def test_a_block_parting_by_rounding_alone_is_called_rounding(project, tmp_path):
    """With a threshold no bf16 rounding can meet, the first block parts on PyTorch's own input too; its
    difference is within what the fake-quant block moves when its inputs change by 1 ulp (the reference
    evaluator's bf16 products round otherwise than torch's and flip INT8 codes at ties), so the diagnosis says
    rounding, not a wrong block; the corrupted block above stays "operation"."""
    session = Session.open(project)
    folder = tmp_path / "out"
    folder.mkdir()
    report = session.export(folder / "m.onnx", min_cosine=0.9999999)
    cosines = {row.check: row.cosine for row in report.checks if row.check.startswith("block ")}
    assert not report.validated
    assert cosines["block model.layers.0 output (sample inputs)"] < 0.9999999, cosines
    diagnosis = report.parity_diagnosis
    assert diagnosis["module"] == "model.layers.0" and diagnosis["verdict"] == "rounding", diagnosis
    assert "rounding flipping quantization codes in that block" in diagnosis["text"], diagnosis["text"]
