"""Item 1 (core): two writers of one project file. Every save that reports success is in the file
afterwards, or the save refuses (ProjectChangedError) and leaves the file as it was."""
import threading

import numpy as np
import pytest

from workbench.project import (
    CalibrationRecord,
    ExportRecord,
    FinetuneRecord,
    LayerDecision,
    Project,
    ProjectChangedError,
    ProjectError,
    QuantizerRecord,
    SensitivityRecord,
    load_project,
    save_project,
)
from workbench.project.store import _revision  # noqa: F401 - the revision as stored
from workbench.sources.model_source import ModelSpec


def small_project() -> Project:
    project = Project(name="p", model=ModelSpec("entrypoint", "net.py:make"))
    for name in ("conv1", "conv2", "fc"):
        project.layers[name] = LayerDecision(name, "Conv2d" if name != "fc" else "Linear")
    project.settings["rules"] = {"concat": True}
    return project


def calibration(project: Project, amax: float) -> CalibrationRecord:
    record = CalibrationRecord(project.next_id(project.calibrations), "t", "max", 99.9, 2, 0.1, "cpu")
    record.quantizers["fc._input_quantizer"] = QuantizerRecord("fc._input_quantizer", np.float32(amax), "max",
                                                               "MaxCalibrator")
    project.calibrations.append(record)
    return record


def amaxes(project: Project) -> list[float]:
    return [float(run.quantizers["fc._input_quantizer"].amax) for run in project.calibrations]


@pytest.fixture
def path(tmp_path):
    target = tmp_path / "p.qwb"
    save_project(small_project(), target)
    return target


def test_revision_is_stored_and_counts_saves(path):
    first = load_project(path)
    assert first.origin.revision == 1
    report = save_project(first, path)
    assert report.revision == 2 and report.merged == []
    assert load_project(path).origin.revision == 2


def test_two_calibrations_at_once_both_land(path):
    a, b = load_project(path), load_project(path)
    calibration(a, 1.0)
    calibration(b, 2.0)
    save_project(a, path)
    report = save_project(b, path)
    assert report.merged == ["calibration run 1"]
    stored = load_project(path)
    assert amaxes(stored) == [1.0, 2.0]
    assert [run.id for run in stored.calibrations] == [1, 2]  # b's run renumbered, and current
    assert stored.current_calibration.quantizers["fc._input_quantizer"].amax == np.float32(2.0)
    assert b.calibrations == stored.calibrations  # the saver's project is what it wrote


def test_ignore_during_calibration_keeps_both(path):
    """`set --ignore fc` while a calibration runs: fc stays ignored and the calibration is kept."""
    calibrating, setting = load_project(path), load_project(path)
    setting.layers["fc"].quantize = False
    save_project(setting, path)
    calibration(calibrating, 3.0)
    report = save_project(calibrating, path)
    assert report.merged == ["layer fc"]
    stored = load_project(path)
    assert stored.layers["fc"].quantize is False
    assert amaxes(stored) == [3.0]
    assert calibrating.layers["fc"].quantize is False  # the saver sees the other writer's change too


def test_both_change_one_layer_refuses_and_saves_nothing(path):
    a, b = load_project(path), load_project(path)
    a.layers["fc"].quantize = False
    save_project(a, path)
    before = path.read_bytes()
    b.layers["fc"].input_desc = {"num_bits": 4}
    calibration(b, 5.0)
    with pytest.raises(ProjectChangedError) as caught:
        save_project(b, path)
    message = str(caught.value)
    assert str(path) in message and "changed since this command opened it (by another process)" in message
    assert "nothing was saved; run it again" in message and "layer fc" in message
    assert isinstance(caught.value, ProjectError)
    assert path.read_bytes() == before
    stored = load_project(path)
    assert stored.layers["fc"].quantize is False and stored.layers["fc"].input_desc is None
    assert stored.calibrations == []


def test_same_change_on_both_sides_is_no_conflict(path):
    a, b = load_project(path), load_project(path)
    a.layers["fc"].quantize = False
    b.layers["fc"].quantize = False
    save_project(a, path)
    save_project(b, path)
    assert load_project(path).layers["fc"].quantize is False


def test_settings_merge_key_by_key(path):
    a, b = load_project(path), load_project(path)
    a.settings["rules"] = {"concat": False}
    b.settings["device"] = "cpu"
    save_project(a, path)
    save_project(b, path)
    stored = load_project(path)
    assert stored.settings["rules"] == {"concat": False} and stored.settings["device"] == "cpu"


def test_changed_setting_on_both_sides_refuses(path):
    a, b = load_project(path), load_project(path)
    a.settings["rules"] = {"concat": False}
    b.settings["rules"] = {"concat": True, "maxpool": True}
    save_project(a, path)
    with pytest.raises(ProjectChangedError, match="setting rules"):
        save_project(b, path)


def test_every_kind_of_run_is_appended(path):
    a, b = load_project(path), load_project(path)
    calibration(a, 1.0)
    a.sensitivity.append(SensitivityRecord(1, "t", {"who": "a"}))
    a.exports.append(ExportRecord(1, "t", "a.onnx", {}, {}))
    save_project(a, path)
    b_run = calibration(b, 2.0)
    b.sensitivity.append(SensitivityRecord(1, "t", {"who": "b"}))
    b.exports.append(ExportRecord(1, "t", "b.onnx", {}, {}))
    b.finetunes.append(FinetuneRecord(1, "t", {"who": "b"}, calibration_id=b_run.id,
                                      weights={"fc.weight": np.ones(3, np.float32)}))
    save_project(b, path)
    stored = load_project(path)
    assert [r.data["who"] for r in stored.sensitivity] == ["a", "b"]
    assert [r.path for r in stored.exports] == ["a.onnx", "b.onnx"]
    assert stored.finetunes[0].calibration_id == 2  # follows the renumbered calibration
    assert np.array_equal(stored.current_finetune.weights["fc.weight"], np.ones(3, np.float32))


def test_newest_finetune_stays_the_only_active_one(path):
    a, b = load_project(path), load_project(path)
    a.finetunes.append(FinetuneRecord(1, "t", {"who": "a"}, weights={"w": np.zeros(2, np.float32)}))
    save_project(a, path)
    b.finetunes.append(FinetuneRecord(1, "t", {"who": "b"}, weights={"w": np.ones(2, np.float32)}))
    save_project(b, path)
    stored = load_project(path)
    assert [(r.data["who"], r.active) for r in stored.finetunes] == [("a", False), ("b", True)]
    assert stored.finetunes[0].weights == {}


def test_run_modified_here_but_dropped_there_refuses(path):
    base = load_project(path)
    calibration(base, 1.0)
    save_project(base, path)
    a, b = load_project(path), load_project(path)
    a.calibrations.clear()
    save_project(a, path)
    b.calibrations[0].method = "entropy"  # e.g. recompute_amax on the current run
    with pytest.raises(ProjectChangedError, match="calibration run 1"):
        save_project(b, path)


def test_a_save_after_a_merge_is_plain(path):
    a, b = load_project(path), load_project(path)
    calibration(a, 1.0)
    save_project(a, path)
    calibration(b, 2.0)
    save_project(b, path)
    b.layers["conv1"].quantize = False
    assert save_project(b, path).merged == []
    assert load_project(path).layers["conv1"].quantize is False


def test_saving_elsewhere_overwrites_without_a_check(path, tmp_path):
    other = tmp_path / "other.qwb"
    save_project(small_project(), other)
    a = load_project(path)
    a.layers["fc"].quantize = False
    save_project(a, other)  # "save as" over another file: the caller chose to replace it
    assert load_project(other).layers["fc"].quantize is False


def test_a_file_without_revision_counts_as_revision_zero(path):
    import sqlite3

    connection = sqlite3.connect(path)
    connection.execute("DELETE FROM meta WHERE key = 'revision'")  # as written before revisions existed
    connection.commit()
    connection.close()
    project = load_project(path)
    assert project.origin.revision == 0
    assert save_project(project, path).revision == 1


def test_racing_threads_lose_nothing(path):
    """Eight writers load the same revision, then save at once: each success is in the file."""
    loaded = [load_project(path) for _ in range(8)]
    for index, project in enumerate(loaded):
        if index % 2:
            calibration(project, float(index))
        else:
            project.sensitivity.append(SensitivityRecord(1, "t", {"who": index}))
    barrier = threading.Barrier(len(loaded))
    outcomes: dict[int, object] = {}

    def save(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = save_project(loaded[index], path)
        except ProjectError as error:  # pragma: no cover - only appends: no conflict expected
            outcomes[index] = error

    threads = [threading.Thread(target=save, args=(i,)) for i in range(len(loaded))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(not isinstance(outcome, Exception) for outcome in outcomes.values()), outcomes
    stored = load_project(path)
    assert sorted(amaxes(stored)) == [1.0, 3.0, 5.0, 7.0][-5:]
    assert sorted(r.data["who"] for r in stored.sensitivity) == [0, 2, 4, 6]
    assert stored.origin.revision == 1 + len(loaded)


def test_engine_reports_are_appended_too(path):
    from workbench.project.model import EngineReportRecord

    a, b = load_project(path), load_project(path)
    a.engine_reports.append(EngineReportRecord(1, "t", {"who": "a"}))
    save_project(a, path)
    b.engine_reports.append(EngineReportRecord(1, "t", {"who": "b"}))
    save_project(b, path)
    assert [r.data["who"] for r in load_project(path).engine_reports] == ["a", "b"]
