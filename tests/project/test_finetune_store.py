"""Format 2 of the project file: fine-tune runs and their tensors, the fold state of calibrations, migration."""

import numpy as np
import pytest
from fuzzing import STRANGE_VALUES, load_with_every_column_set, tamper  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.project import (
    CalibrationRecord,
    FinetuneRecord,
    Project,
    ProjectError,
    QuantizerRecord,
    load_project,
    save_project,
    store,
)
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def project_with_finetunes():
    rng = np.random.default_rng(0)
    project = Project(name="tuned", model=ModelSpec("demo", "digits"), data={"calibration": DataSpec("demo", "digits",
                                                                                                     split="train")},
                      settings={"fold_bn": True})
    project.calibrations.append(CalibrationRecord(
        1, "t", "max", 99.99, 2, 0.5, "cpu", quantizers={"fc._input_quantizer": QuantizerRecord(
            "fc._input_quantizer", np.float32(4.5), "max", "MaxCalibrator")}, folded=["stem.0", "block.conv1"]))
    history = {"settings": {"epochs": 2, "lr": 1e-4}, "baseline": {"epoch": 0, "metric": 0.9},
               "history": [{"epoch": 1, "train_loss": 0.3, "metric": 0.95}], "best_epoch": 1}
    project.finetunes.append(FinetuneRecord(1, "t1", history, calibration_id=1, folded=["stem.0"], active=False))
    project.finetunes.append(FinetuneRecord(
        2, "t2", history, calibration_id=1, folded=["stem.0", "block.conv1"],
        weights={"fc.weight": rng.normal(size=(10, 32)).astype(np.float32),
                 "fc.bias": rng.normal(size=10).astype(np.float16),
                 "stem.0.weight": rng.normal(size=(16, 1, 3, 3)).astype(np.float32)},
        amax={"fc._input_quantizer": np.array(4.25, dtype=np.float32)}))
    return project


def test_fine_tunes_round_trip(tmp_path):
    project = project_with_finetunes()
    path = tmp_path / "p.qwb"
    save_project(project, path)
    loaded = load_project(path)
    assert loaded.calibrations[0].folded == ["stem.0", "block.conv1"]
    assert [(r.id, r.created, r.data, r.calibration_id, r.folded, r.active) for r in loaded.finetunes] == \
        [(r.id, r.created, r.data, r.calibration_id, r.folded, r.active) for r in project.finetunes]
    assert loaded.current_finetune.id == 2 and loaded.finetunes[0].weights == {}
    for name, array in project.finetunes[1].weights.items():
        got = loaded.finetunes[1].weights[name]
        assert np.array_equal(got, array) and got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(loaded.finetunes[1].amax["fc._input_quantizer"], np.array(4.25, dtype=np.float32))
    save_project(loaded, path)  # over the existing file: the same again
    assert load_project(path).finetunes[1].weights.keys() == project.finetunes[1].weights.keys()


def test_a_damaged_fine_tuned_tensor_is_a_clean_error(tmp_path):
    path = tmp_path / "p.qwb"
    save_project(project_with_finetunes(), path)
    tamper(path, "UPDATE finetune_tensors SET data = x'00' WHERE name = 'fc.weight'")
    with pytest.raises(ProjectError, match="tensor 'fc.weight': column data: 1 bytes stored, 1280 expected"):
        load_project(path)


def test_version_1_files_get_the_new_tables_and_folding_off(tmp_path):
    path = tmp_path / "p.qwb"
    project = project_with_finetunes()
    project.finetunes = []
    project.settings = {"rules": {"concat": True}}
    save_project(project, path)
    tamper(path, "DROP TABLE finetune_runs", "DROP TABLE finetune_tensors",
           "ALTER TABLE calibration_runs DROP COLUMN folded",
           "UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    before = path.read_bytes()
    loaded = load_project(path)
    assert path.read_bytes() == before  # migrated in memory only
    assert loaded.settings == {"rules": {"concat": True}, "fold_bn": False}
    assert loaded.calibrations[0].folded is None and loaded.finetunes == []
    assert store.MIGRATIONS[1] is store._migrate_1_to_2 and store.SCHEMA_VERSION >= 2
    loaded.finetunes = project_with_finetunes().finetunes
    save_project(loaded, path)  # saving over the version-1 file upgrades its tables first
    again = load_project(path)
    assert again.current_finetune.id == 2 and again.settings["fold_bn"] is False


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["finetune_runs", "finetune_tensors", "calibration_runs"]),
       value=STRANGE_VALUES)
def test_fuzzed_fine_tune_values_give_clean_errors(tmp_path_factory, table, value):
    path = tmp_path_factory.mktemp("values") / "p.qwb"
    save_project(project_with_finetunes(), path)
    load_with_every_column_set(path, table, value)
