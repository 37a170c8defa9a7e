"""The headless twins: `workbench engine-report`, `lint` and `diff`, and the engine report kept in the project."""
import json
import shutil
import sqlite3

import pytest

from workbench.cli import main
from workbench.project import load_project, store
from workbench.session import Session, SessionError


@pytest.fixture
def project_copy(demo_export, tmp_path):
    _, path, _, _ = demo_export
    copy = tmp_path / "digits.qwb"
    shutil.copy(path, copy)
    return copy


def test_engine_report_command_prints_json_and_keeps_the_report(project_copy, trtexec_files, capsys):
    layer_info, profile, _ = trtexec_files
    assert main(["engine-report", str(project_copy), str(layer_info), "--profile", str(profile), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    stem = next(entry for entry in data["layers"] if entry["module"] == "stem.0")
    assert stem["engine_precision"] == "INT8" and stem["quantized"] is True and stem["time_ms"] > 0
    assert {h["kind"] for h in data["hazards"]} == {"quantized_not_int8", "int8_reformat", "requantize"}
    # saved: the project reopens with the report
    session = Session.open(project_copy)
    report = session.latest_engine_report()
    assert report is not None and report.outcome("block.conv2").engine_precision == "FP32"
    assert main(["engine-report", str(project_copy), str(layer_info)]) == 0
    text = capsys.readouterr().out
    assert "ran FP32" in text and "block.conv2" in text
    assert len(load_project(project_copy).engine_reports) == 2


def test_engine_report_errors_name_the_file(project_copy, trtexec_files, capsys):
    layer_info, profile, _ = trtexec_files
    assert main(["engine-report", str(project_copy), str(profile)]) == 2
    err = capsys.readouterr().err
    assert "profile.json is a trtexec profile" in err and "Traceback" not in err
    assert load_project(project_copy).engine_reports == []  # nothing half-written


def test_lint_command_and_applying_a_fix(project_copy, capsys):
    assert main(["lint", str(project_copy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    # plant a hazard: the residual add left in float, so it cannot fuse into block.conv2
    session = Session.open(project_copy)
    session.set_quantize(["block.add"], False)
    session.save()
    assert main(["lint", str(project_copy), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(w["kind"], w["modules"]) for w in data["warnings"]] == [("residual_not_fusable", ["block", "block.conv2"])]
    # the graph names the add after the block whose forward calls it; the fix names the project's layer
    assert data["warnings"][0]["fix"] == {"action": "quantize", "targets": ["block.add"],
                                          "description": "quantize the identity branch (block.add)"}
    assert main(["lint", str(project_copy), "--apply", "1"]) == 0
    out = capsys.readouterr().out
    assert "applied 1: quantize the identity branch (block.add); changed: block.add" in out
    assert load_project(project_copy).layers["block.add"].quantize is True
    assert main(["lint", str(project_copy), "--apply", "5"]) == 2
    assert "there are 0 warnings" in capsys.readouterr().err


def test_session_applies_each_kind_of_fix(demo_export, project_copy):
    from workbench.export.lint import LintFix

    session = Session.open(project_copy)
    session.set_setting("rules", {**session.project.settings["rules"], "residual": False})
    assert session.apply_fix(LintFix("enable_rule", ("residual",), "")) == ["residual"]
    assert session.project.settings["rules"]["residual"] is True
    session.set_quantize(["block.add"], False)
    assert session.apply_fix(LintFix("quantize", ("block.add",), "")) == ["block.add"]
    assert session.apply_fix(LintFix("pin", ("block.conv1", "block.conv2"), "")) == ["block.conv1 = block.conv2"]
    assert session.project.settings["pins"] == [["block.conv1", "block.conv2"]]
    assert session.apply_fix(LintFix("pin", ("block.conv1", "block.conv2"), "")) == []  # already pinned
    with pytest.raises(SessionError, match="No placement rule named bogus"):
        session.apply_fix(LintFix("enable_rule", ("bogus",), ""))
    with pytest.raises(SessionError, match="Unknown fix"):
        session.apply_fix(LintFix("explode", (), ""))


def test_diff_command(project_copy, tmp_path, capsys):
    other = tmp_path / "other.qwb"
    shutil.copy(project_copy, other)
    assert main(["set", str(other), "--ignore", "fc"]) == 0
    capsys.readouterr()
    assert main(["diff", str(project_copy), str(other), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layers"] == [{"where": "fc.quantize", "a": True, "b": False}]
    assert main(["diff", str(project_copy), str(other)]) == 0
    assert "fc.quantize: True -> False" in capsys.readouterr().out
    assert main(["diff", str(project_copy), str(tmp_path / "missing.qwb")]) == 2


def test_version_2_projects_open_and_gain_the_engine_table(project_copy):
    connection = sqlite3.connect(project_copy)
    connection.execute("DROP TABLE engine_reports")
    connection.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    connection.commit()
    connection.close()
    project = load_project(project_copy)
    assert project.engine_reports == [] and store.SCHEMA_VERSION >= 3
    session = Session.open(project_copy)
    session.save()  # saving over the version-2 file upgrades it
    connection = sqlite3.connect(project_copy)
    assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        str(store.SCHEMA_VERSION),)
    connection.close()
