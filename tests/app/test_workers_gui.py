"""'All GPUs' in the GUI: the device selector offers it, and calibration and sensitivity then run in worker
processes through the launcher (here 2 CPU processes with gloo), with progress summed over the ranks, cancel,
and a failed rank named in an error dialog while the project file stays byte-identical."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

import torch  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from workbench.app.device_selector import ALL_GPUS, DeviceSelector  # noqa: E402
from workbench.app.main_window import MainWindow  # noqa: E402
from workbench.session import Session  # noqa: E402
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from worker_code import write_worker_code  # noqa: E402  (the tiny project the CLI's worker tests use)

REAL_CUDA = torch.cuda.is_available()  # before any test stands in for two GPUs


@pytest.fixture
def two_gpus(monkeypatch):
    """torch sees two CUDA devices (the selector only asks; nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: f"Test GPU {index}")


@pytest.fixture
def workers_env(monkeypatch):
    # a healthy rank waiting for a failed one gives up long before the test's own timeout
    monkeypatch.setenv("WORKBENCH_DIST_TIMEOUT", "60")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("FAIL_ON_RANK", raising=False)


@pytest.fixture
def project(tmp_path) -> Path:
    """A saved project whose model and data are entry points next to it (trusted)."""
    write_worker_code(tmp_path, batches=6)
    session = Session.create(ModelSpec("entrypoint", "net.py:make"), DataSpec("entrypoint", "data.py:batches"),
                             trust_code=True, base_dir=tmp_path,
                             settings={"metric": {"name": "mse", "direction": None}})
    return session.save(tmp_path / "tiny.qwb")


def open_project(controller, qtbot, path):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        assert controller.open_project(path, trust_code=True)
    qtbot.waitUntil(lambda: not controller.busy)
    return controller.session


def test_the_selector_offers_all_gpus_when_there_are_several(controller, qtbot, two_gpus, project):
    selector = DeviceSelector(controller)
    qtbot.addWidget(selector)
    items = [(selector.itemText(i), selector.itemData(i)) for i in range(selector.count())]
    assert items == [("CPU", "cpu"), ("cuda:0 · Test GPU 0", "cuda:0"), ("cuda:1 · Test GPU 1", "cuda:1"),
                     ("all GPUs (2)", ALL_GPUS)]
    session = open_project(controller, qtbot, project)

    # choosing it: the project runs on cuda:0 (here a stand-in move, there is no GPU), the jobs in 2 processes
    moved = []
    controller.set_setting = lambda key, value: (moved.append((key, value)),
                                                 setattr(session, "device", torch.device(value)))
    logged = []
    controller.log.connect(lambda level, message: logged.append(message))
    with qtbot.waitSignal(selector.device_set):
        selector.setCurrentIndex(3)
        selector.activated.emit(3)
    assert moved == [("device", "cuda:0")] and controller.workers == 2
    assert session.project.settings["device"] == "cpu"  # the stand-in did not touch the setting: no "all" stored
    selector.show_session_device()
    assert selector.currentData() == ALL_GPUS
    assert "calibration and analysis run in 2 processes" in logged

    # a job without workers says where it runs instead
    session.device = torch.device("cpu")
    assert controller.evaluate(lambda _evaluation: None)
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    assert any(message.startswith("Evaluating runs in one process on cpu: 'all GPUs' applies to calibrate, "
                                  "sensitivity, fallback only") for message in logged)

    # back to one device: one process again
    with qtbot.waitSignal(selector.device_set):
        selector.setCurrentIndex(0)
        selector.activated.emit(0)
    assert controller.workers == 1 and selector.currentData() == "cpu"


@pytest.mark.skipif(REAL_CUDA, reason="a real cuda:0 is there: the session accepts it")
def test_all_gpus_is_refused_with_the_device(controller, qtbot, two_gpus, project):
    open_project(controller, qtbot, project)
    selector = DeviceSelector(controller)
    qtbot.addWidget(selector)
    with qtbot.waitSignal(controller.error) as blocker:  # cuda:0 is not really there: the session says so
        selector.setCurrentIndex(3)
        selector.activated.emit(3)
    assert blocker.args[0] == "Settings"
    assert controller.workers == 1 and str(controller.session.device) == "cpu"


def test_an_unsaved_project_must_be_saved_first(controller, qtbot):
    from demo_project import open_demo

    open_demo(controller, qtbot)
    controller.use_workers(2)
    with qtbot.waitSignal(controller.error) as blocker:
        assert not controller.calibrate()
    assert "Save the project first" in blocker.args[1] and not controller.busy
    with pytest.raises(ValueError, match="positive integer"):
        controller.use_workers(0)


def test_unsaved_changes_are_saved_for_the_workers_only_when_the_user_says_so(qtbot, tmp_path, project,
                                                                               monkeypatch):
    asked = []
    monkeypatch.setattr(QMessageBox, "question",
                        lambda _parent, title, text, *a, **k: asked.append(text) or QMessageBox.StandardButton.Cancel)
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    try:
        controller = window.controller
        open_project(controller, qtbot, project)
        before = project.read_bytes()
        controller.set_setting("calibration", {"method": "max"})
        controller.use_workers(2)
        assert not controller.calibrate(method="max") and not controller.busy
        assert len(asked) == 1 and "unsaved changes will be saved to" in asked[0]
        assert project.read_bytes() == before and controller.dirty  # nothing written, nothing launched
    finally:
        window.shutdown()


@pytest.mark.slow
def test_calibrate_and_sensitivity_in_two_processes(controller, qtbot, project, workers_env):
    single = Session.open(shutil.copyfile(project, project.with_name("single.qwb")), trust_code=True)
    expected = single.calibrate(method="max")

    session = open_project(controller, qtbot, project)
    controller.select(["0"])
    controller.set_setting("calibration", {"method": "max"})  # an unsaved change: saved before the launch
    assert session.dirty
    controller.use_workers(2)
    seen = []
    controller.jobs.progress.connect(lambda p: seen.append((p.done, p.total, p.message)))
    with qtbot.waitSignal(controller.calibration_changed, timeout=240000):
        assert controller.calibrate(method="max")
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)

    # the project was read back from the file rank 0 wrote, with the amax one process finds
    reloaded = controller.session
    assert reloaded is not session and not reloaded.dirty and controller.workers == 2 and controller.reloaded
    run = reloaded.project.current_calibration
    assert run.method == "max" and run.num_batches == expected.num_batches
    for name, item in expected.quantizers.items():
        assert torch.equal(torch.as_tensor(run.quantizers[name].amax), item.amax.cpu()), name
    assert Session.open(project, trust_code=True).project.settings["calibration"]["method"] == "max"
    assert controller.selection == ["0"]  # the view keeps its place
    # progress came from the ranks' sum (each rank calibrated on 3 of the 6 batches), naming both processes
    ranks = [done for done, _total, message in seen if "(2 processes)" in message]
    assert ranks and ranks[-1] == expected.num_batches == 6 and ranks == sorted(ranks)
    assert seen[0][2] == "starting 2 worker processes"

    start = len(seen)
    with qtbot.waitSignal(controller.sensitivity_changed, timeout=240000):
        assert controller.sensitivity(metric="mse")
    qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
    result = controller.session.latest_sensitivity()
    one = single.sensitivity(metric="mse")
    units = [(done, total) for done, total, message in seen[start:] if "(2 processes)" in message]
    assert units and units[-1][0] == units[-1][1] > len(one.units)  # every unit and the two reference passes
    assert [(u.name, u.rank) for u in result.units] == [(u.name, u.rank) for u in one.units]
    for unit, reference in zip(result.units, one.units):
        assert unit.value == pytest.approx(reference.value, rel=1e-6)


@pytest.mark.slow
def test_a_failed_rank_is_named_and_the_project_is_unchanged(qtbot, tmp_path, project, workers_env, monkeypatch):
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Discard)
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    try:
        controller = window.controller
        session = open_project(controller, qtbot, project)
        before = project.read_bytes()
        controller.use_workers(2)
        monkeypatch.setenv("FAIL_ON_RANK", "1")
        with qtbot.waitSignal(controller.error, timeout=240000):
            assert controller.calibrate(method="max")
        qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
        dialog = window.error_dialogs[-1]
        assert dialog.title == "Calibrating failed"
        assert "rank 1 failed" in dialog.message and "the data disk of this rank is full" in dialog.message
        assert "The project file was not changed" in dialog.message
        assert project.read_bytes() == before
        assert controller.session is session and session.project.current_calibration is None
        assert window.calibrate_action.isEnabled()  # the window goes on

        # cancelled: every rank stops, nothing is written, and it is a cancel, not an error
        monkeypatch.delenv("FAIL_ON_RANK")
        errors = len(window.error_dialogs)
        with qtbot.waitSignal(controller.jobs.cancelled, timeout=240000) as blocker:
            assert controller.calibrate(method="max")
            controller.cancel_job()
        assert "cancelled; the project was not changed" in str(blocker.args[1])
        qtbot.waitUntil(lambda: not controller.busy, timeout=60000)
        assert project.read_bytes() == before and len(window.error_dialogs) == errors
    finally:
        window.shutdown()
