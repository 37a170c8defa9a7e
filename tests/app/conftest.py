"""Fixtures shared by the GUI tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def controller(qtbot):
    """A controller with no project; its job thread is stopped at the end."""
    from workbench.app.controller import Controller  # here, so that a machine without Qt skips, not errors

    controller = Controller()
    yield controller
    controller.shutdown()


@pytest.fixture(autouse=True)
def controllers_are_shut_down():
    """Every test shuts its controllers down, so that the rest of the suite collects garbage as usual
    (a live controller keeps Python's automatic collection off, see workbench/app/main_thread_gc.py)."""
    yield
    from workbench.app import main_thread_gc

    leaked = main_thread_gc._users
    while main_thread_gc._users:  # give collection back, so that only the leaking test fails
        main_thread_gc.release()
    assert leaked == 0, "a Controller was not shut down (call shutdown() or use a fixture)"


@pytest.fixture(autouse=True)
def no_graph_preload(monkeypatch):
    """A shown main window does not start Chromium to draw a graph in the background (only the test of that
    preload turns it back on): most window tests never open the Graph tab."""
    try:
        from workbench.app import graph_tab
    except ImportError:  # no Qt: those tests skip
        return
    monkeypatch.setattr(graph_tab, "PRELOAD", False)


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """A shown main window at a desktop size, with settings of its own, no Chromium, and no dialog that can block
    a test: closing with unsaved changes discards, a warning's question is answered No. Modules that need other
    answers (test_main_window.py) define their own."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QMessageBox

    from workbench.app.main_window import MainWindow

    monkeypatch.setenv("WORKBENCH_NO_WEBENGINE", "1")
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.StandardButton.Discard))
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(lambda *a, **k: QMessageBox.StandardButton.No))
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    yield window
    window.shutdown()


@pytest.fixture
def calibrated_block_project(tmp_path):
    """A project on the outlier block of tests/test_cli_smoothing.py (trusted code), calibrated with max: what the
    sensitivity, fallback and ladder tests search on."""
    import numpy as np

    from tests.test_cli_smoothing import MODEL
    from workbench import cli

    (tmp_path / "block.py").write_text(MODEL)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 16, 64), dtype=np.float32))
    path = tmp_path / "block.qwb"
    assert cli.main(["new", str(path), "--model", f"{tmp_path}/block.py:make", "--data", str(tmp_path / "x.npy"),
                     "--batch-size", "8", "--trust-code"]) == 0
    assert cli.main(["calibrate", str(path), "--method", "max"]) == 0
    return path
