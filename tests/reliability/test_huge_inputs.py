"""Issue 38, cases 8-10 and the family "huge and deep inputs to every file reader".

Every JSON the workbench reads from someone else (an engine's layer information and profile, a project's
JSON columns, a Hugging Face config, the trust store, an export's amax table, a value typed on the command
line) meets nesting deeper than Python's recursion limit as a clear error, never "internal error:
RecursionError"; a file over the size limit is refused at once with its size.
"""
import json

import pytest
from cli_helpers import new_project, run
from test_crafted_schema import craft

from workbench import bounded_json
from workbench.export.provenance import amax_json_written_here
from workbench.session.new_project import parse_value
from workbench.sources.errors import SourceError
from workbench.sources.model_source import ModelSpec, load_model

DEPTH = 100_000  # the case: 200 KB of brackets


def deep(depth: int = DEPTH) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def project(tmp_path, capsys):
    return new_project(tmp_path, capsys)


def test_deep_layer_information_is_a_clear_error(project, tmp_path, capsys):
    layers = tmp_path / "layers.json"
    layers.write_text('{"Layers": ' + deep() + "}")
    code, out, err = run(capsys, "engine-report", project, layers, "--no-save")
    assert code == 2 and "internal error" not in err
    assert str(layers) in err and "nested too deeply" in err


def test_a_deep_profile_is_a_clear_error(project, tmp_path, capsys):
    layers, profile = tmp_path / "layers.json", tmp_path / "profile.json"
    layers.write_text(json.dumps(["conv", "fc"]))
    profile.write_text('[{"count": 1}, ' + deep() + "]")
    code, out, err = run(capsys, "engine-report", project, layers, "--profile", profile, "--no-save", "--force")
    assert code == 2 and "internal error" not in err
    assert str(profile) in err and "nested too deeply" in err


def test_a_layer_entry_just_inside_the_limit_names_the_entry(project, tmp_path, capsys):
    layers = tmp_path / "layers.json"
    layers.write_text('{"Layers": [' + deep(900) + "]}")
    code, out, err = run(capsys, "engine-report", project, layers, "--no-save")
    assert code == 2 and "internal error" not in err and 'entry 0 of "Layers"' in err


def test_an_engine_report_over_the_size_limit_is_refused_with_its_size(project, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bounded_json, "MAX_JSON_BYTES", 1024 * 1024)
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps({"Layers": [f"layer{i}" for i in range(200_000)]}))
    code, out, err = run(capsys, "engine-report", project, layers, "--no-save")
    assert code == 2 and "internal error" not in err
    assert f"{layers.stat().st_size / 2**20:,.1f} MB, over the 1 MB" in err and "WORKBENCH_MAX_JSON_MB" in err


def test_a_deep_json_column_in_a_project_names_table_and_column(project, capsys):
    craft(project, f"UPDATE layers SET input_desc = '{deep()}' WHERE name = 'fc';")
    code, out, err = run(capsys, "show", project)
    assert code == 2 and "internal error" not in err
    assert "table layers" in err and "column input_desc is not valid JSON (nested too deeply" in err


def test_a_deep_hugging_face_config_is_a_source_error(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ' + deep() + "}")
    with pytest.raises(SourceError) as caught:
        load_model(ModelSpec("hf", str(folder)))
    assert "config.json" in str(caught.value) and "nested too deeply" in str(caught.value)


def test_a_deep_trust_store_trusts_nothing_and_asks_again(project, tmp_path, capsys, monkeypatch):
    from workbench.sources import trust

    store = trust.trust_store_path()
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text('{"projects": ' + deep() + "}")
    code, out, err = run(capsys, "calibrate", project)
    assert code == 2 and "internal error" not in err and "--trust-code" in err


def test_a_deep_amax_table_is_not_taken_for_ours(tmp_path):
    table = tmp_path / "m.amax.json"
    table.write_text('{"writer": ' + deep() + "}")
    assert amax_json_written_here(table) is False


def test_a_deep_value_typed_on_the_command_line_stays_text():
    assert parse_value(deep()) == deep()


def test_evaluate_with_the_sqnr_metric_prints_no_nan(project, capsys):
    assert run(capsys, "calibrate", project)[0] == 0
    code, out, err = run(capsys, "evaluate", project)
    assert code == 0, err
    row = next(line for line in out.splitlines() if "SQNR (dB)" in line)
    assert "nan" not in out and row.split()[2:5] == ["inf", row.split()[3], "-"]
    assert "FP32 is the reference" in row
    code, out, err = run(capsys, "evaluate", project, "--json")
    assert json.loads(out)["delta"] is None
