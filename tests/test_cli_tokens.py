"""Token-id models end to end from the command line: a local Hugging Face folder (hf:DIR) on an .npz of
input_ids/attention_mask, new -> calibrate -> sensitivity -> export, without --input-shape or --trust-code;
and a model of the user's code on token ids through the session."""
import json
import textwrap

import numpy as np
import onnx
import pytest
import torch

from tests.cli_run import run
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def write_tokens(path, samples=8, length=12, vocab=40):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(samples, length)).astype(np.int64)
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids), labels=rng.integers(0, 2, size=samples))


def test_hf_folder_on_token_ids_new_calibrate_export(tmp_path, capsys, monkeypatch):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=2)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    write_tokens(tmp_path / "tokens.npz")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "new", "bert.qwb", "--model", "hf:bert", "--data", "tokens.npz", "--batch-size", "4",
                         "--json")
    assert code == 0, err
    created = json.loads(out)
    assert created["input"] == "input_ids (12,) int64, attention_mask (12,) int64"
    assert created["layers"] >= 6  # q, k, v, attention output, intermediate, output, pooler, classifier

    code, out, err = run(capsys, "calibrate", "bert.qwb", "--method", "max", "--json")
    assert code == 0, err
    code, out, err = run(capsys, "sensitivity", "bert.qwb", "--metric", "cosine", "--top", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["sensitivity"]["units"]

    code, out, err = run(capsys, "export", "bert.qwb", "-o", "bert.onnx", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["input_names"] == ["input_ids", "attention_mask"] and report["output_names"] == ["logits"]
    graph = onnx.load(str(tmp_path / "bert.onnx")).graph
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]

    code, out, err = run(capsys, "export", "bert.qwb", "-o", "again.onnx", "--outputs", "scores")
    assert code != 0 and "no output named 'scores'; its outputs are: logits" in err
    assert not (tmp_path / "again.onnx").exists()


TOKEN_MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(40, 16)
            self.fc = nn.Linear(16, 16)
            self.head = nn.Linear(16, 3)

        def forward(self, input_ids, attention_mask):
            hidden = torch.relu(self.fc(self.embed(input_ids))) * attention_mask.unsqueeze(-1)
            return {"logits": self.head(hidden), "hidden": hidden}

    def build():
        return Tagger()
''')


def test_session_feeds_token_ids_by_keyword_to_every_job(tmp_path):
    from workbench.session import Session

    (tmp_path / "tagger.py").write_text(TOKEN_MODEL)
    write_tokens(tmp_path / "tokens.npz")
    session = Session.create(ModelSpec("entrypoint", "tagger.py:build"),
                             DataSpec("tensors", "tokens.npz", batch_size=4),
                             trust_code=True, base_dir=tmp_path, settings={"output": "hidden"})
    sample = session.sample_inputs(batch=2)
    assert list(sample) == ["input_ids", "attention_mask"] and sample["input_ids"].dtype == torch.int64
    assert session.layer_shapes()["fc"]["inputs"] == [(1, 12, 16)]
    session.calibrate(method="max")
    evaluation = session.evaluate(metric="cosine")  # on "hidden", the chosen output
    assert evaluation.fp32 == pytest.approx(1.0) and 0.9 < evaluation.int8 < 1.0
    assert 0 < evaluation.output_sqnr_db < float("inf")
    result = session.sensitivity(metric="sqnr")
    assert {u.name for u in result.units} >= {"fc", "head"}
    # the compared output is "hidden": leaving the head in float changes nothing, leaving fc in float does
    assert result.unit("head").delta_vs_quantized == 0 and result.unit("fc").delta_vs_quantized > 0
    # the file holds the whole model; the export picks outputs by name of its own (the output key is the metric's)
    report = session.export(tmp_path / "tagger.onnx")
    assert report.output_names == ["logits", "hidden"] and report.input_names == ["input_ids", "attention_mask"]
    report = session.export(tmp_path / "tagger.onnx", outputs=["hidden"])
    assert report.output_names == ["hidden"] and session.settings.export.outputs == ("hidden",)
    path = session.save(tmp_path / "tagger.qwb")
    reopened = Session.open(path, trust_code=True)
    assert reopened.project.input_spec.named == (("input_ids", (12,), "int64"), ("attention_mask", (12,), "int64"))
    assert reopened.settings.export.outputs == ("hidden",)  # a plain export repeats the choice


SUBCLASSED = textwrap.dedent('''
    import torch
    from torch import nn

    class Linear(nn.Linear):  # timm.layers.Linear: the same computation
        def forward(self, input):
            return super().forward(input)

    class Scaled(nn.Linear):  # a forward of its own
        def forward(self, input):
            return super().forward(input) * 0.5

    def build():
        torch.manual_seed(0)
        return nn.Sequential(Linear(4, 8), nn.ReLU(), Scaled(8, 2))
''')


def test_show_lists_subclassed_layers_quantized_or_why_not(tmp_path, capsys, monkeypatch):
    (tmp_path / "net.py").write_text(SUBCLASSED)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "new", "net.qwb", "--model", "net.py:build", "--data", "x.npy", "--trust-code")
    assert code == 0, err
    code, out, err = run(capsys, "show", "net.qwb", "--trust-code", "--json")
    summary = json.loads(out)
    assert [row["name"] for row in summary["layer_table"]] == ["0"]
    assert [(item["name"], item["type"]) for item in summary["not_quantizable"]] == [("2", "Scaled")]
    assert summary["not_quantizable"][0]["reason"].startswith("not quantizable: custom forward (Scaled replaces")
    code, out, err = run(capsys, "show", "net.qwb", "--trust-code")
    assert "2 (Scaled): not quantizable: custom forward" in out
