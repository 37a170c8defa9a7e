"""Issue 38, case 1-2 and the crafted-schema family: a project file carries data only.

The hostile user here edits the file with sqlite3 and then recomputes the content checksum (it is no
secret), so only the schema check stands between them and SQL that runs inside the workbench's save.
"""
import json
import sqlite3

import pytest
import sqlite_utils
from cli_helpers import new_project, run

from workbench.project import load_project, save_project
from workbench.project.tables import content_checksums


def craft(path, script: str) -> None:
    """Run ``script`` on the project file, then re-stamp its checksum as a careful attacker would."""
    connection = sqlite3.connect(path)
    connection.executescript(script)
    db = sqlite_utils.Database(connection)
    db.execute("DELETE FROM meta WHERE key = 'checksum'")
    db["meta"].insert({"key": "checksum", "value": json.dumps(content_checksums(db), sort_keys=True)})
    connection.commit()
    connection.close()


def rows(path, sql):
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


TRIGGER = """
CREATE TABLE evil (x);
CREATE TRIGGER t AFTER INSERT ON layers BEGIN
  INSERT INTO evil VALUES (new.name);
  UPDATE model_source SET spec = replace(spec, 'make', 'chatty');
END;
"""

CRAFTED = {
    "trigger": (TRIGGER, "trigger 't' on table 'layers'"),
    "delete trigger": ("CREATE TRIGGER d BEFORE DELETE ON settings BEGIN SELECT 1; END;", "trigger 'd'"),
    "view": ("CREATE VIEW v AS SELECT * FROM layers;", "view 'v'"),
    "index": ("CREATE INDEX i ON layers(name);", "index 'i' on table 'layers'"),
    "table": ("CREATE TABLE notes (x);", "table 'notes'"),
    "column": ("ALTER TABLE layers ADD COLUMN extra TEXT;", "column 'extra' of table 'layers'"),
    "default": ("ALTER TABLE smoothing RENAME TO s_old; CREATE TABLE smoothing (layer TEXT PRIMARY KEY, "
                "method TEXT DEFAULT 'awq', alpha FLOAT, scales BLOB, scales_dtype TEXT, scales_shape TEXT, "
                "folded_into TEXT, error_before FLOAT, error_after FLOAT); DROP TABLE s_old;",
                "column 'method' of table 'smoothing' (computed by SQLite)"),
}


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_a_crafted_schema_object_is_refused_on_open_and_nothing_runs(tmp_path, capsys, kind):
    project = new_project(tmp_path, capsys)
    script, named = CRAFTED[kind]
    craft(project, script)
    before = project.read_bytes()
    code, out, err = run(capsys, "set", project, "--ignore", "fc")
    assert code == 2, out + err
    assert named in err and "internal error" not in err and "neither opened nor changed" in err
    assert project.read_bytes() == before  # the save never began: no trigger ran, no row changed
    if kind == "trigger":
        assert rows(project, "SELECT count(*) FROM evil") == [(0,)]


def test_a_trigger_added_after_load_never_runs_inside_the_save(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    loaded = load_project(project)
    craft(project, TRIGGER)  # another process plants it between this one's load and save
    with pytest.raises(Exception) as caught:
        save_project(loaded, project)
    assert "trigger 't'" in str(caught.value)
    assert rows(project, "SELECT count(*) FROM evil") == [(0,)]
    assert "make" in rows(project, "SELECT spec FROM model_source")[0][0]


def test_dropping_the_object_makes_the_project_open_again(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    craft(project, "CREATE VIEW v AS SELECT 1;")
    assert run(capsys, "show", project)[0] == 2
    craft(project, "DROP VIEW v;")
    assert run(capsys, "show", project)[0] == 0


def test_a_project_without_its_model_row_says_so(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    craft(project, "DELETE FROM model_source;")
    code, out, err = run(capsys, "show", project)
    assert code == 2 and "no model" in err and "model_source" in err and "internal error" not in err


def test_two_model_rows_are_refused(tmp_path, capsys):
    project = new_project(tmp_path, capsys)
    craft(project, "INSERT INTO model_source SELECT 2, spec, digests, input_spec FROM model_source;")
    code, out, err = run(capsys, "show", project)
    assert code == 2 and "model_source holds 2 models" in err
