"""Round 2, items 1, 3 and 4: an export replaces only what this project wrote in this place. A crafted
export history is no authority to overwrite; the project file, its data and code are never written over
(not even with --force); side files (--amax-json, --calibration-cache) obey the same rule as the .onnx."""
import hashlib
import json

import onnx
import pytest
from cli_helpers import new_project, run
from onnx import TensorProto, helper

from workbench.project import ExportRecord, load_project
from workbench.project.store import save_project


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = new_project(tmp_path, capsys)
    code, _, err = run(capsys, "calibrate", path, "--method", "max")
    assert code == 0, err
    return path


def craft_history(project, victim, *, side_files=None, export_path=None):
    """What a hand-edited project received from someone else can hold: a history naming ``victim``."""
    stored = load_project(project)
    settings = {"opset": 17, "dynamic_batch": True, "sha256": sha(victim), "nodes": []}
    if side_files:
        settings["side_files"] = {str(p): sha(p) for p in side_files}
    stored.exports.append(ExportRecord(stored.next_id(stored.exports), "2026-01-01T00:00:00", str(victim),
                                       settings, {}))
    if export_path is not None:
        stored.settings["export"] = {**stored.settings.get("export", {}), "path": str(export_path)}
    save_project(stored, project)


def plain_onnx(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])), path)
    return path


def test_a_crafted_history_does_not_overwrite_a_victim_file(project, tmp_path, capsys):
    """The issue's case: the history lists the victim with its current sha256; a plain export replaced it."""
    victim = tmp_path / "notes.txt"
    victim.write_text("the user's own file\n")
    craft_history(project, victim, export_path="notes.txt")
    before = project.read_bytes()
    code, out, err = run(capsys, "export", project)
    assert code == 2 and f"{victim} is not an ONNX file Quant Workbench wrote" in err, err
    assert "nothing was exported" in err and "Traceback" not in err
    assert victim.read_text() == "the user's own file\n" and project.read_bytes() == before
    code, out, err = run(capsys, "show", project)
    assert code == 0 and f"suspicious export history: export 1 names {victim}, which is not an ONNX file" in out


def test_another_tools_onnx_listed_in_a_crafted_history_is_not_replaced(project, tmp_path, capsys):
    victim = plain_onnx(tmp_path / "theirs.onnx")
    digest = sha(victim)
    craft_history(project, victim)
    code, out, err = run(capsys, "export", project, "-o", victim)
    assert code == 2 and "not an ONNX file Quant Workbench wrote" in err, err
    assert sha(victim) == digest


def test_a_stored_export_path_outside_the_project_folder_is_refused(project, tmp_path, capsys):
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere" / "autostart.onnx"
    craft_history(project, project, export_path=outside)  # any history; the setting is what sends it there
    code, out, err = run(capsys, "export", project)
    assert code == 2 and "outside the project's folder" in err and f"-o {outside}" in err, err
    assert not outside.exists() and not outside.parent.exists()
    code, out, err = run(capsys, "show", project, "--json")
    notes = json.loads(out)["suspicious_exports"]
    assert notes == [f"export 1 names {project}, which is the project file itself"]


def test_this_projects_own_exports_are_replaced_without_force(project, tmp_path, capsys):
    for _ in range(2):
        code, out, err = run(capsys, "export", project, "--amax-json", "--calibration-cache")
        assert code == 0, err
    target = tmp_path / "p.qdq.onnx"
    marks = {e.key: e.value for e in onnx.load(str(target)).metadata_props}
    assert marks["workbench.writer"].startswith("Quant Workbench")
    record = load_project(project).exports[-1]
    assert set(record.settings["side_files"]) == {"p.qdq.amax.json", "p.qdq.calib.cache"}
    code, out, err = run(capsys, "show", project)
    assert "suspicious" not in out


@pytest.mark.parametrize("which", ["project", "data", "model code"])
def test_force_never_writes_over_the_project_its_data_or_code(project, tmp_path, capsys, which):
    """Item 3: `export P.qwb -o P.qwb --force` destroyed the project."""
    target = {"project": project, "data": tmp_path / "x.npy", "model code": tmp_path / "net.py"}[which]
    before, project_before = target.read_bytes(), project.read_bytes()
    code, out, err = run(capsys, "export", project, "-o", target, "--force")
    assert code == 2 and f"{target} is " in err and "never writes over it (not even with --force)" in err, err
    assert target.read_bytes() == before and project.read_bytes() == project_before
    assert load_project(project).calibrations  # still a project, still calibrated


def test_a_side_file_named_like_the_project_is_refused(tmp_path, capsys, monkeypatch, project):
    """-o p.onnx --amax-json writes p.amax.json: refused where that is the project's own file."""
    renamed = tmp_path / "p.amax.json"
    project.rename(renamed)
    before = renamed.read_bytes()
    code, out, err = run(capsys, "export", renamed, "-o", tmp_path / "p.onnx", "--amax-json", "--force",
                         "--trust-code")
    assert code == 2 and f"{renamed} is the project file itself" in err, err
    assert renamed.read_bytes() == before and not (tmp_path / "p.onnx").exists()


@pytest.mark.parametrize("flag, suffix", [("--amax-json", ".amax.json"), ("--calibration-cache", ".calib.cache")])
def test_side_files_never_overwrite_a_users_file(project, tmp_path, capsys, flag, suffix):
    """Item 4: an existing X.amax.json / X.calib.cache the project never wrote was replaced, exit 0."""
    users = tmp_path / f"model{suffix}"
    users.write_text("mine\n")
    code, out, err = run(capsys, "export", project, "-o", tmp_path / "model.onnx", flag)
    assert code == 2 and f"{users} (a" in err, err
    assert "beside the export) exists and this project did not write it" in err
    assert users.read_text() == "mine\n" and not (tmp_path / "model.onnx").exists()
    # --force is the user's word for it
    code, out, err = run(capsys, "export", project, "-o", tmp_path / "model.onnx", flag, "--force")
    assert code == 0, err
    assert users.read_text() != "mine\n"
    # the project now wrote it: a plain export (the flag remembered) replaces it; an edit by the user is kept
    code, out, err = run(capsys, "export", project)
    assert code == 0, err
    users.write_text("edited by hand\n")
    code, out, err = run(capsys, "export", project)
    assert code == 2 and "changed since this project exported it" in err, err
    assert users.read_text() == "edited by hand\n"


def test_a_crafted_side_file_history_is_no_authority(project, tmp_path, capsys):
    users = tmp_path / "model.amax.json"
    users.write_text(json.dumps({"mine": True}))
    onnx_path = tmp_path / "model.onnx"
    code, out, err = run(capsys, "export", project, "-o", onnx_path)
    assert code == 0, err
    craft_history(project, onnx_path, side_files=[users])
    code, out, err = run(capsys, "export", project, "-o", onnx_path, "--amax-json")
    assert code == 2 and "is not an amax table Quant Workbench wrote" in err, err
    assert json.loads(users.read_text()) == {"mine": True}


def test_a_path_the_user_typed_outside_the_folder_is_remembered_on_this_machine(project, tmp_path, capsys):
    """-o outside the project's folder is the user's word: later plain exports go there (the confirmation is
    kept in the user's config folder, which a project file cannot write)."""
    outside = tmp_path.parent / f"{tmp_path.name}-builds" / "model.onnx"
    outside.parent.mkdir()
    code, out, err = run(capsys, "export", project, "-o", outside)
    assert code == 0, err
    code, out, err = run(capsys, "export", project)  # the remembered path, confirmed here
    assert code == 0 and str(outside) in out, err
    confirmations = json.loads((tmp_path / "config" / "quant-workbench" / "export-targets.json").read_text())
    assert confirmations == {str(project.resolve()): [str(outside)]}
    copy = tmp_path / "copy.qwb"  # the same project file elsewhere (received, say): not confirmed for it
    copy.write_bytes(project.read_bytes())
    code, out, err = run(capsys, "export", copy, "--trust-code")
    assert code == 2 and "outside the project's folder" in err, err
