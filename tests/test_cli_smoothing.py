"""`workbench calibrate --smoothquant ALPHA|off` end to end: recorded per layer, shown, saved, exported with
onnxruntime parity, and reversed exactly."""
import json
import textwrap

import numpy as np
import pytest
import torch

from tests.cli_run import run
from workbench.session import Session

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Block(nn.Module):  # three LayerNorm channels ~50x the rest, as LLM activations have
        def __init__(self):
            super().__init__()
            self.ln, self.fc, self.head = nn.LayerNorm(64), nn.Linear(64, 64), nn.Linear(64, 8)

        def forward(self, x):
            return self.head(torch.relu(self.fc(self.ln(x))))

    def make():
        torch.manual_seed(0)
        model = Block()
        with torch.no_grad():
            model.ln.weight[[3, 17, 40]] = 50.0
            model.fc.weight[:, [3, 17, 40]] *= 0.1
        return model
""")


@pytest.fixture
def project(tmp_path, capsys):
    (tmp_path / "block.py").write_text(MODEL)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((32, 16, 64), dtype=np.float32))
    path = tmp_path / "block.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/block.py:make", "--data", tmp_path / "x.npy",
                       "--batch-size", "8", "--trust-code")
    assert code == 0, err
    return path


def test_smoothquant_is_recorded_shown_exported_and_reversed_exactly(project, tmp_path, capsys):
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--json")
    assert code == 0, err
    plain = json.loads(out)["output_sqnr_db"]

    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--smoothquant", "0.5", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(result["smoothing"]) == {"fc", "head"}
    assert result["smoothing"]["fc"]["folded_into"] == "ln"  # the LayerNorm carries 1/s
    assert result["smoothing"]["head"]["folded_into"] is None  # a ReLU in between: a Mul before the Q/DQ
    assert plain < 20 and result["output_sqnr_db"] > plain + 10, (plain, result["output_sqnr_db"])

    # sensitivity measures the smoothed model like any other choice
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--json")
    assert code == 0, err
    assert json.loads(out)["sensitivity"]["quantized"] > plain + 10

    code, out, _ = run(capsys, "show", project, "--json")
    layers = {row["name"]: row for row in json.loads(out)["layer_table"]}
    smoothing = layers["fc"]["smoothing"]
    assert smoothing.startswith("SmoothQuant alpha=0.5") and "folded into ln" in smoothing
    code, out, _ = run(capsys, "show", project)
    assert "SmoothQuant alpha=0.5" in out

    session = Session.open(project, trust_code=True)  # saved: reopened without recomputing
    assert session.project.smoothing["fc"].alpha == 0.5
    model = session.quantized_model()
    assert model.head._input_quantizer.pre_quant_scale is not None
    assert not torch.equal(model.fc.weight, session.float_model.fc.weight)

    onnx_path = tmp_path / "block.onnx"
    code, out, err = run(capsys, "export", project, "-o", onnx_path, "--json")
    assert code == 0, err
    report = json.loads(out)
    import onnx
    graph = onnx.load(str(onnx_path)).graph
    assert any(node.op_type == "Mul" for node in graph.node)  # head's 1/s
    assert report["max_abs_diff"] < 1e-3 and report["cosine"] > 0.9999  # onnxruntime = the fake-quant model

    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--smoothquant", "off", "--json")
    assert code == 0, err
    assert json.loads(out)["smoothing"] == {}
    session = Session.open(project, trust_code=True)
    model = session.quantized_model()
    float_model = session.float_model
    for name in ("fc", "head", "ln"):
        assert torch.equal(getattr(model, name).weight, getattr(float_model, name).weight)
    assert model.head._input_quantizer.pre_quant_scale is None


def test_a_bad_alpha_is_refused_and_changes_nothing(project, capsys):
    code, _, err = run(capsys, "calibrate", project, "--smoothquant", "1.5")
    assert code == 2 and "alpha must be in [0, 1]" in err
    code, _, err = run(capsys, "calibrate", project, "--smoothquant", "lots")
    assert code == 2 and "a number in [0, 1] or 'off'" in err
    assert Session.open(project, trust_code=True).project.smoothing == {}


def test_awq_on_an_int4_weight_only_layer_is_recorded_exported_and_dropped(project, tmp_path, capsys):
    code, _, err = run(capsys, "set", project, "--layer", "fc", "--precision", "int4w")
    assert code == 0, err
    code, out, err = run(capsys, "calibrate", project, "--awq", "on", "--json")
    assert code == 0, err
    smoothed = json.loads(out)["smoothing"]
    assert set(smoothed) == {"fc"} and smoothed["fc"]["method"] == "awq"  # head stays int8: not AWQ's
    session = Session.open(project, trust_code=True)
    record = session.project.smoothing["fc"]
    assert record.error_after <= record.error_before  # the search chose no worse than no scaling
    onnx_path = tmp_path / "awq.onnx"
    code, out, err = run(capsys, "export", project, "-o", onnx_path, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["max_abs_diff"] < 1e-3 and report["cosine"] > 0.9999
    code, out, err = run(capsys, "calibrate", project, "--awq", "off", "--json")
    assert code == 0 and json.loads(out)["smoothing"] == {}


def test_a_version_3_project_opens_without_smoothing_and_saving_upgrades_it(project):
    import sqlite3

    from workbench.project import load_project
    from workbench.project.store import SCHEMA_VERSION

    connection = sqlite3.connect(project)
    connection.execute("DROP TABLE smoothing")
    connection.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    connection.execute("DELETE FROM meta WHERE key = 'checksum'")
    connection.commit()
    connection.close()
    assert load_project(project).smoothing == {}
    session = Session.open(project, trust_code=True)
    session.smooth("smoothquant", 0.5)
    session.save()
    connection = sqlite3.connect(project)
    assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)
    assert connection.execute("SELECT COUNT(*) FROM smoothing").fetchone() == (2,)
    connection.close()
