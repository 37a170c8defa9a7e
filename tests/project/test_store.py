"""The project file: round trips, atomic saves under SIGKILL, refusal of bad files, fuzzing."""
import os
import random
import signal
import sqlite3
import time

import numpy as np
import pytest
from fuzzing import STRANGE_VALUES, load_with_every_column_set, mutate, tamper  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.project import (
    CalibrationRecord,
    ExportRecord,
    FallbackRecord,
    LayerDecision,
    Project,
    ProjectError,
    QuantizerRecord,
    SensitivityRecord,
    load_project,
    save_project,
    store,
)
from workbench.sources.data_source import DataSpec, ImageOptions, InputSpec
from workbench.sources.model_source import FileDigest, ModelSpec


def sample_project(seed=0, quantizers=6):
    rng = np.random.default_rng(seed)
    project = Project(name=f"sample {seed}", model=ModelSpec("entrypoint", "models/net.py:make", {"width": 8},
                                                             weights="w.safetensors"),
                      model_digests=[FileDigest("models/net.py", "ab" * 32, 123)],
                      input_spec=InputSpec((3, 32, 32)),
                      data={"calibration": DataSpec("images", "calib", batch_size=16, shuffle=True, seed=4,
                                                    image=ImageOptions(resize=36, crop=32)),
                            "evaluation": DataSpec("demo", "digits", split="test")},
                      settings={"rules": {"concat": True, "maxpool": False}, "pins": [["a", "b"]],
                                "metric": {"name": "sqnr", "direction": None}, "export": {"opset": 17}})
    for i in range(quantizers):
        project.layers[f"layer{i}"] = LayerDecision(f"layer{i}", "Conv2d", i % 3 != 0,
                                                    {"num_bits": 8, "calib_method": "histogram"} if i % 2 else None,
                                                    {"num_bits": 4, "axis": 0})
    for run_id in (1, 2):
        records = {}
        for i in range(quantizers):
            counts = rng.integers(0, 1000, size=4096).astype(np.int64)
            state = {"kind": "histogram", "num_bins": 2048, "width_exponent": -9, "counts": counts,
                     "max_value": 3.5, "skip_zeros": False, "batches_seen": 4, "values_seen": int(counts.sum()),
                     "nonfinite_count": 2}
            records[f"layer{i}._input_quantizer"] = QuantizerRecord(
                f"layer{i}._input_quantizer", rng.random(()).astype(np.float32), "entropy", "HistogramCalibrator",
                int(counts.sum()), 2, 3.5, state, {"num_bits": 8})
            records[f"layer{i}._weight_quantizer"] = QuantizerRecord(
                f"layer{i}._weight_quantizer", rng.random((16, 1, 1, 1)).astype(np.float32), "max", "MaxCalibrator",
                432, 0, 1.0, {"kind": "max", "calib_amax": rng.random((16, 1, 1, 1)).astype(np.float32),
                              "batches_seen": 4, "values_seen": 432, "nonfinite_count": 0})
        project.calibrations.append(CalibrationRecord(run_id, "2026-11-21T10:00:00+00:00", "entropy", 99.99, 8, 1.5,
                                                      "cpu", 31.5, ["a warning"], ["unused.q"], records))
    project.sensitivity.append(SensitivityRecord(1, "t", {"scheme": "one-off", "results": [{"unit": "layer1",
                                                                                            "metric": 30.1}]}))
    project.fallbacks.append(FallbackRecord(1, "t", {"chosen": ["layer1"], "curve": [[0, 28.0], [1, 33.0]]}, True))
    project.exports.append(ExportRecord(1, "t", "out.onnx", {"opset": 17}, {"max_abs_diff": 1e-6, "qdq": 12}))
    return project


def assert_projects_equal(a: Project, b: Project):
    assert (a.name, a.model, a.model_digests, a.input_spec, a.data, a.layers, a.settings) == \
           (b.name, b.model, b.model_digests, b.input_spec, b.data, b.layers, b.settings)
    assert (a.sensitivity, a.fallbacks, a.exports) == (b.sensitivity, b.fallbacks, b.exports)
    assert len(a.calibrations) == len(b.calibrations)
    for run_a, run_b in zip(a.calibrations, b.calibrations):
        assert (run_a.id, run_a.method, run_a.output_sqnr_db, run_a.warnings, run_a.unused) == \
               (run_b.id, run_b.method, run_b.output_sqnr_db, run_b.warnings, run_b.unused)
        assert run_a.quantizers.keys() == run_b.quantizers.keys()
        for name, qa in run_a.quantizers.items():
            qb = run_b.quantizers[name]
            assert np.array_equal(qa.amax, qb.amax) and qa.amax.dtype == qb.amax.dtype, name
            assert (qa.method, qa.calibrator, qa.num_samples, qa.nonfinite_count, qa.max_value, qa.descriptor) == \
                   (qb.method, qb.calibrator, qb.num_samples, qb.nonfinite_count, qb.max_value, qb.descriptor)
            assert qa.calibrator_state.keys() == qb.calibrator_state.keys()
            for key, value in qa.calibrator_state.items():
                if isinstance(value, np.ndarray):
                    assert np.array_equal(value, qb.calibrator_state[key]) and \
                        value.dtype == qb.calibrator_state[key].dtype
                else:
                    assert value == qb.calibrator_state[key]


def test_round_trip_restores_everything(tmp_path):
    project = sample_project()
    path = tmp_path / "p.qwb"
    save_project(project, path)
    loaded = load_project(path)
    assert_projects_equal(project, loaded)
    save_project(loaded, path)  # and again over the existing file
    assert_projects_equal(project, load_project(path))


def test_saved_file_is_a_clean_sqlite_database(tmp_path):
    path = tmp_path / "p.qwb"
    save_project(sample_project(), path)
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert connection.execute("PRAGMA application_id").fetchone()[0] == store.APPLICATION_ID
    blob = connection.execute("SELECT amax, amax_dtype FROM quantizer_stats LIMIT 1").fetchone()
    assert blob[1] == "float32" and isinstance(blob[0], bytes)  # raw bytes, not a pickle


def test_only_the_last_calibration_runs_are_kept(tmp_path):
    project = sample_project(quantizers=1)
    for run_id in range(3, 10):
        project.calibrations.append(CalibrationRecord(run_id, "t", "max", 99.9, 1, 0.1, "cpu"))
    save_project(project, tmp_path / "p.qwb")
    assert [r.id for r in load_project(tmp_path / "p.qwb").calibrations] == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("content, message", [
    (b"", "not a Quant Workbench project"),
    (b"hello, I am a text file" * 10, "not a Quant Workbench project"),
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "not a Quant Workbench project"),
])
def test_files_that_are_not_projects(tmp_path, content, message):
    path = tmp_path / "x.qwb"
    path.write_bytes(content)
    with pytest.raises(ProjectError, match=message):
        load_project(path)


def test_other_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE t (x)")
    connection.commit()
    connection.close()
    with pytest.raises(ProjectError, match="not a Quant Workbench project"):
        load_project(path)
    with pytest.raises(ProjectError, match="not a Quant Workbench project"):
        save_project(sample_project(), path)  # and it is not overwritten
    assert sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]


def test_missing_file(tmp_path):
    with pytest.raises(ProjectError, match="no such project file"):
        load_project(tmp_path / "absent.qwb")


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.9])
def test_truncated_files_are_refused(tmp_path, keep):
    path = tmp_path / "p.qwb"
    save_project(sample_project(), path)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ProjectError, match="p.qwb"):
        load_project(path)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "p.qwb"
    save_project(sample_project(), path)
    tamper(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ProjectError, match="newer Quant Workbench .*format 99"):
        load_project(path)


def test_older_schema_is_migrated_in_memory(tmp_path, monkeypatch):
    path = tmp_path / "p.qwb"
    save_project(sample_project(), path)
    tamper(path, "UPDATE meta SET value = '0' WHERE key = 'schema_version'",
           "UPDATE meta SET value = 'old name' WHERE key = 'name'")
    before = path.read_bytes()

    def rename(db):  # a stand-in migration: v0 stored names that v1 spells differently
        db.execute("UPDATE meta SET value = 'migrated name' WHERE key = 'name'")

    monkeypatch.setitem(store.MIGRATIONS, 0, rename)
    assert load_project(path).name == "migrated name"
    assert path.read_bytes() == before  # opening never rewrites the user's file
    monkeypatch.delitem(store.MIGRATIONS, 0)
    with pytest.raises(ProjectError, match="cannot be upgraded"):
        load_project(path)


def test_corrupt_tensor_is_a_clean_error(tmp_path):
    path = tmp_path / "p.qwb"
    save_project(sample_project(), path)
    tamper(path, "UPDATE quantizer_stats SET amax = x'0102' WHERE name = 'layer0._weight_quantizer'")
    with pytest.raises(ProjectError,
                       match="quantizer 'layer0._weight_quantizer': column amax: 2 bytes stored, 64 expected"):
        load_project(path)


def _save_forever(path, write_end):
    """Child process: save new generations of a project in a loop, reporting each finished save."""
    seed = 1
    while True:
        project = sample_project(seed=seed, quantizers=40)
        project.name = f"generation {seed}"
        save_project(project, path)
        os.write(write_end, b".")
        seed += 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_sigkill_during_saves_never_loses_the_previous_state(tmp_path):
    """Kill a process that saves in a loop at random moments, 50 times: the file always opens and holds
    one complete generation, never a mix or a damaged file."""
    path = tmp_path / "p.qwb"
    save_project(sample_project(seed=0, quantizers=40), path)
    rng = random.Random(1234)
    generations = set()
    interrupted = 0  # kills that left a hot journal: a save was cut in the middle
    for _ in range(50):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read_end)
            try:
                _save_forever(path, write_end)
            finally:
                os._exit(1)
        os.close(write_end)
        os.read(read_end, 1)  # one save done: the child is now saving in a loop
        for _ in range(rng.randint(0, 2)):  # let 0-2 more saves finish, however long a save takes on this machine
            os.read(read_end, 1)
        time.sleep(rng.uniform(0.0, 0.12))  # a save of this project takes a few tens of milliseconds
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        journal = path.with_name(path.name + "-journal")
        interrupted += journal.exists() and journal.stat().st_size > 0
        connection = sqlite3.connect(path)
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        connection.close()
        loaded = load_project(path)
        generation = 0 if loaded.name == "sample 0" else int(loaded.name.split()[-1])
        generations.add(generation)
        expected = sample_project(seed=generation, quantizers=40)
        expected.name = loaded.name
        assert_projects_equal(expected, loaded)
    assert len(generations) >= 2  # the kills landed after different numbers of finished saves
    assert interrupted >= 5, interrupted  # and often in the middle of one


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_files_give_clean_errors(tmp_path_factory, data):
    """Flip, overwrite, cut or extend bytes of a valid project: loading returns a project or raises
    ProjectError, never anything else."""
    base = tmp_path_factory.mktemp("fuzz")
    path = base / "p.qwb"
    save_project(sample_project(quantizers=2), path)
    path.write_bytes(mutate(path.read_bytes(), data))
    try:
        load_project(path)
    except ProjectError:
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["meta", "layers", "calibration_runs", "quantizer_stats", "arrays", "settings",
                              "data_sources", "model_source"]),
       value=STRANGE_VALUES)
def test_fuzzed_values_give_clean_errors(tmp_path_factory, table, value):
    """Valid SQLite, wrong contents: every column of a table set to a strange value."""
    base = tmp_path_factory.mktemp("values")
    path = base / "p.qwb"
    save_project(sample_project(quantizers=2), path)
    load_with_every_column_set(path, table, value)
