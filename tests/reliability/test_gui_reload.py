"""Item 1 in the GUI: the window notices that another process saved the open project and offers to
reload it; a save from the window keeps the other process's changes."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from workbench.app.main_window import MainWindow  # noqa: E402
from workbench.project import load_project  # noqa: E402
from workbench.session import Session  # noqa: E402
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402


@pytest.fixture
def saved(tmp_path):
    session = Session.create(ModelSpec("demo", "digits"), DataSpec("demo", "digits", split="train", batch_size=64,
                                                                   num_batches=1))
    return session.save(tmp_path / "p.qwb")


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch, saved):
    monkeypatch.setenv("WORKBENCH_NO_WEBENGINE", "1")
    asked: list[str] = []
    reply = {"button": QMessageBox.StandardButton.Yes}

    def question(parent, title, text, *args, **kwargs):
        asked.append(title)
        return reply["button"]

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        window.open_project(saved, confirmed=True)
    window.asked, window.reply = asked, reply
    yield window
    window.shutdown()


def other_process_ignores(path, layer: str) -> None:
    other = Session.open(path)
    other.set_quantize([layer], False)
    other.save()


def test_a_save_by_another_process_is_noticed_and_reloaded(window, qtbot, saved):
    layer = next(iter(window.controller.session.project.layers))
    assert window.controller.session.project.layers[layer].quantize
    with qtbot.waitSignal(window.controller.disk.changed, timeout=10000) as changed:
        other_process_ignores(saved, layer)
    assert changed.args == [str(saved)]
    qtbot.waitUntil(lambda: window.asked == ["Project changed on disk"], timeout=10000)
    # "Yes": the window reopens the file and shows the other process's decision
    qtbot.waitUntil(lambda: not window.controller.session.project.layers[layer].quantize, timeout=60000)
    assert not window.controller.session.changed_on_disk()


def test_own_saves_are_not_reported(window, qtbot, saved):
    session = window.controller.session
    layer = next(iter(session.project.layers))
    window.controller.set_quantize([layer], False)
    assert window.controller.save() is not None
    assert not window.controller.disk.check() and window.asked == []


def test_keep_working_then_save_merges(window, qtbot, saved):
    window.reply["button"] = QMessageBox.StandardButton.No
    session = window.controller.session
    names = list(session.project.layers)
    with qtbot.waitSignal(window.controller.disk.changed, timeout=10000):
        other_process_ignores(saved, names[0])
    qtbot.waitUntil(lambda: window.asked == ["Project changed on disk"], timeout=10000)
    assert window.controller.session is session  # kept
    window.controller.set_quantize([names[1]], False)
    assert window.controller.save() is not None
    stored = load_project(saved)
    assert not stored.layers[names[0]].quantize and not stored.layers[names[1]].quantize
    assert not session.project.layers[names[0]].quantize  # the window's copy took the other change in


def test_conflicting_save_is_refused_and_named(window, qtbot, saved):
    window.reply["button"] = QMessageBox.StandardButton.No
    session = window.controller.session
    layer = next(iter(session.project.layers))
    errors = []
    window.controller.error.connect(lambda title, message, details: errors.append(message))
    other_process_ignores(saved, layer)
    # a real change: histogram is the input's default, and an edit back to a default is no edit
    window.controller.set_descriptor([layer], "input", {"num_bits": 8, "calib_method": "max"})
    before = saved.read_bytes()
    assert window.controller.save() is None
    assert errors and "changed since this window opened it (by another process)" in errors[0]
    assert f"layer {layer}" in errors[0] and saved.read_bytes() == before


def test_export_over_a_file_the_project_did_not_write_asks_first(window, qtbot, tmp_path):
    """Item 2 in the GUI: the window asks before overwriting a foreign file; "No" writes nothing."""
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="max")
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)
    foreign = tmp_path / "foreign.onnx"
    foreign.write_bytes(b"someone else's model")
    window.controller.session.project.settings["export"]["path"] = str(foreign)
    window.reply["button"] = QMessageBox.StandardButton.No
    assert not window.export()
    assert window.asked == ["Overwrite the file?"] and foreign.read_bytes() == b"someone else's model"
    window.reply["button"] = QMessageBox.StandardButton.Yes
    with qtbot.waitSignal(window.controller.export_finished, timeout=120000):
        assert window.export()
    assert foreign.read_bytes() != b"someone else's model"
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)
    window.asked.clear()
    with qtbot.waitSignal(window.controller.export_finished, timeout=120000):
        assert window.export()  # its own file now: no question
    assert window.asked == []
