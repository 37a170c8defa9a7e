"""What "auto" found per quantizer (its pick and reason, the warnings) and the batches behind the output SQNR
round-trip through the project file; a file from before they existed opens and saves."""
import json

import pytest
import sqlite_utils
from test_store import sample_project  # noqa: E402 - tests/project is on sys.path

from workbench.project import ProjectError, load_project, save_project
from workbench.project.tables import content_checksums

CHOICE = {"method": "mse", "reason": "mse: SQNR of layer1's output 38.0 dB over 4 batches (vs entropy 12.0 dB)",
          "amax": {"entropy": 0.9, "mse": 2.0, "percentile": 2.5, "max": 10.0},
          "sqnr_db": {"entropy": 12.0, "mse": 38.0, "percentile": 35.0, "max": 30.0}, "criterion": "layer output",
          "batches": 4, "owner": "layer1", "notes": []}
WARNING = {"quantizer": "layer1._input_quantizer", "kind": "clipped", "message": "layer1._input_quantizer: clips"}


def test_choices_warnings_and_sqnr_batches_round_trip(tmp_path):
    project = sample_project(quantizers=2)
    record = project.calibrations[-1].quantizers["layer1._input_quantizer"]
    record.choice, record.warnings = dict(CHOICE), [dict(WARNING)]
    project.calibrations[-1].sqnr_batches = 8
    path = tmp_path / "p.qwb"
    save_project(project, path)
    loaded = load_project(path)
    again = loaded.calibrations[-1].quantizers["layer1._input_quantizer"]
    assert again.choice == CHOICE and again.warnings == [WARNING] and again.reason == CHOICE["reason"]
    assert loaded.calibrations[-1].sqnr_batches == 8
    other = loaded.calibrations[-1].quantizers["layer0._input_quantizer"]
    assert other.choice is None and other.warnings == [] and other.reason == ""


def test_a_file_from_before_auto_opens_and_saves(tmp_path):
    path = tmp_path / "old.qwb"
    save_project(sample_project(quantizers=2), path)
    db = sqlite_utils.Database(path)  # as an older version wrote it: no such columns, checksums without them
    db.execute("ALTER TABLE quantizer_stats DROP COLUMN findings")
    db.execute("ALTER TABLE calibration_runs DROP COLUMN sqnr_batches")
    db["meta"].upsert({"key": "checksum", "value": json.dumps(content_checksums(db), sort_keys=True)}, pk="key")
    db.conn.commit()
    db.close()
    old = load_project(path)
    assert old.calibrations[-1].sqnr_batches == 0  # shown as "(first batch)": what older versions measured
    record = old.calibrations[-1].quantizers["layer1._input_quantizer"]
    assert record.choice is None and record.method == "entropy"
    record.choice = dict(CHOICE)
    save_project(old, path)  # the columns are added in place
    assert load_project(path).calibrations[-1].quantizers["layer1._input_quantizer"].choice == CHOICE


def test_a_damaged_choice_is_refused_with_the_quantizer_named(tmp_path):
    path = tmp_path / "p.qwb"
    project = sample_project(quantizers=2)
    project.calibrations[-1].quantizers["layer1._input_quantizer"].choice = dict(CHOICE)
    save_project(project, path)
    db = sqlite_utils.Database(path)
    db.execute("UPDATE quantizer_stats SET findings = ? WHERE name = 'layer1._input_quantizer'",
               [json.dumps({"choice": {**CHOICE, "method": "kl"}, "warnings": []})])
    db["meta"].upsert({"key": "checksum", "value": json.dumps(content_checksums(db), sort_keys=True)}, pk="key")
    db.conn.commit()
    db.close()
    with pytest.raises(ProjectError, match=r"quantizer 'layer1\._input_quantizer'.*auto choice"):
        load_project(path)
