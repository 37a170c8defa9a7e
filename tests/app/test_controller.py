"""The Qt controller and job runner, driven headlessly with pytest-qt."""
import threading
import time

import pytest

pytest.importorskip("PySide6")

from demo_project import open_demo  # noqa: E402

from workbench.app.jobs import JobRunner  # noqa: E402
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402


def test_job_runner_reports_progress_eta_and_result(qtbot):
    runner = JobRunner()
    seen = []
    runner.progress.connect(seen.append)

    def job(progress, cancel):
        for step in range(1, 4):
            time.sleep(0.01)
            progress(step, 3, f"step {step}")
        return "done"

    with qtbot.waitSignal(runner.finished, timeout=10000) as blocker:
        assert runner.start("counting", job)
        assert not runner.start("second", job)  # one job at a time
    assert blocker.args == ["counting", "done"]
    assert [p.done for p in seen] == [1, 2, 3] and seen[-1].eta_s == 0
    assert not runner.busy


def test_job_runner_cancel_and_failure(qtbot):
    runner = JobRunner(cancelled_types=(KeyboardInterrupt,))
    started = threading.Event()

    def job(progress, cancel):
        started.set()
        while not cancel.is_set():
            time.sleep(0.005)
        raise KeyboardInterrupt("stopped")

    with qtbot.waitSignal(runner.cancelled, timeout=10000):
        runner.start("waiting", job)
        started.wait(5)
        runner.cancel()

    def broken(progress, cancel):
        raise ValueError("bad input")

    with qtbot.waitSignal(runner.failed, timeout=10000) as blocker:
        runner.start("broken", broken)
    name, error, details = blocker.args
    assert name == "broken" and isinstance(error, ValueError) and "ValueError: bad input" in details


def test_controller_calibrates_and_edits(controller, qtbot):
    session = open_demo(controller, qtbot)
    assert [layer.name for layer in session.layers()][:2] == ["stem.0", "block.conv1"]
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        controller.calibrate(method="max")
    assert session.project.current_calibration.method == "max"
    with qtbot.waitSignal(controller.layers_changed):
        assert controller.set_quantize(["fc"], False) == ["fc"]
    with qtbot.waitSignal(controller.error) as blocker:
        controller.set_descriptor(["block.conv1"], "input", {"num_bits": "eight"})
    assert "num_bits" in blocker.args[1]
    with qtbot.waitSignal(controller.error) as blocker:  # the descriptor editor: refused as `set` refuses it
        controller.set_descriptor(["block.conv1"], "weight", {"axis": 2})
    assert "per output channel (axis=0), not axis=2" in blocker.args[1]
    with qtbot.waitSignal(controller.selection_changed) as blocker:
        controller.select(["block.conv2"])
    assert blocker.args == [["block.conv2"]]


def test_controller_turns_job_errors_into_error_signals(controller, qtbot, tmp_path):
    (tmp_path / "bad.qwb").write_text("not a project")
    with qtbot.waitSignal(controller.error, timeout=30000) as blocker:
        controller.open_project(tmp_path / "bad.qwb")
    assert blocker.args[0] == "Opening project failed" and "not a Quant Workbench project" in blocker.args[1]


def test_untrusted_code_asks_for_trust(controller, qtbot, tmp_path):
    (tmp_path / "net.py").write_text("from torch import nn\ndef make():\n    return nn.Conv2d(1, 1, 1)\n")
    with qtbot.waitSignal(controller.trust_needed, timeout=30000) as blocker:
        controller.new_project(ModelSpec("entrypoint", f"{tmp_path}/net.py:make"),
                               DataSpec("demo", "digits", split="train"))
    kind, target, message = blocker.args
    assert kind == "model" and "net.py" in target and "--trust-code" in message


def test_slow_rebuilds_run_in_the_background_and_queue_the_next_job(controller, qtbot):
    session = open_demo(controller, qtbot)
    session.last_build_s = 10.0  # pretend this model takes seconds to rebuild, like one of 10,000 modules
    with qtbot.waitSignal(controller.layers_changed, timeout=60000):
        assert controller.set_quantize(["fc"], False) == ["fc"]
        assert controller.busy and controller.jobs.job_name == "Updating the model"
        assert controller.calibrate(method="max")  # asked for during the rebuild: queued, not refused
    qtbot.waitUntil(lambda: session.project.current_calibration is not None and not controller.busy,
                    timeout=60000)
    assert session.project.current_calibration.method == "max"
    assert "fc._input_quantizer" not in session.project.current_calibration.quantizers


def test_deferred_refresh_runs_once_per_burst_and_waits_for_the_job(controller, qtbot):
    from workbench.app.deferred_refresh import DeferredRefresh

    calls = []
    refresh = DeferredRefresh(controller, lambda: calls.append(refresh.begin()))
    for _ in range(3):
        refresh.schedule()
    qtbot.waitUntil(lambda: not refresh.scheduled())
    assert calls == [True]  # three signals, one refresh
    release = threading.Event()
    assert controller.jobs.start("holding the session", lambda progress, cancel: release.wait(10))
    refresh.schedule()
    qtbot.waitUntil(lambda: len(calls) == 2)
    assert calls[-1] is False  # while the job runs the view must not read the session
    refresh.when_idle(lambda: calls.append("now"))
    assert "now" not in calls
    with qtbot.waitSignal(controller.jobs.finished, timeout=10000):
        release.set()
    qtbot.waitUntil(lambda: len(calls) == 3)
    assert calls[-1] is True  # ... and refreshes once the job has ended


def test_the_tree_is_described_once_per_change(controller, qtbot):
    session = open_demo(controller, qtbot)
    tree = controller.tree()
    assert controller.tree() is tree  # the layer panel and the descriptor dialog share it
    assert [q.enabled for q in tree["fc"].quantizers] == [True, True]
    with qtbot.waitSignal(controller.layers_changed):
        controller.set_quantize(["fc"], False)
    after = controller.tree()
    assert after is not tree and not session.project.layers["fc"].quantize
    assert after["fc"].quantizers == ()  # a layer left in float is a plain module again


def test_only_settings_that_change_layers_refresh_the_layer_views(controller, qtbot):
    session = open_demo(controller, qtbot)
    with qtbot.assertNotEmitted(controller.layers_changed, wait=50):
        controller.set_setting("metric", {"name": "top1", "direction": None})
        controller.set_setting("export", {"opset": 13})
    assert session.project.settings["metric"]["name"] == "top1" and session.project.settings["export"]["opset"] == 13
    with qtbot.waitSignal(controller.layers_changed):
        controller.set_setting("rules", {**session.project.settings["rules"], "residual": False})
    assert session.project.settings["rules"]["residual"] is False


def test_the_sessions_events_become_signals_once_after_the_change(controller, qtbot, tmp_path):
    """Views hear of a change from the session's events: a change made on the session itself (not
    through the controller) reaches them too, and a job's changes arrive once it has ended."""
    session = open_demo(controller, qtbot)
    seen = []
    for name in ("layers_changed", "calibration_changed", "sensitivity_changed"):
        getattr(controller, name).connect(lambda name=name: seen.append((name, controller.busy)))
    controller.settings_changed.connect(lambda keys: seen.append(("settings_changed", tuple(keys))))
    controller.project_saved.connect(lambda path: seen.append(("project_saved", path)))

    session.set_quantize(["fc"], False)  # straight on the session: the views still follow
    assert seen == [("layers_changed", False)]
    seen.clear()
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        controller.calibrate(method="max")
    assert seen == [("calibration_changed", False)]  # once, after the job: never while it owns the session
    seen.clear()
    controller.set_settings({"metric": {"name": "top1", "direction": None}, "fold_bn": False})
    # the rebuild may go to the background on a loaded machine: the signals then come after it, still once
    qtbot.waitUntil(lambda: not controller.busy and len(seen) >= 2, timeout=60000)
    assert seen == [("settings_changed", ("fold_bn", "metric")), ("layers_changed", False)]
    seen.clear()
    with qtbot.waitSignal(controller.dirty_changed) as blocker:
        saved = controller.save(tmp_path / "events.qwb")
    assert blocker.args == [False] and seen == [("project_saved", str(saved))]
