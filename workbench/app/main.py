"""``workbench gui``: the application object, its look, and the main window.

``run_gui(demo=True)`` opens the demo project ready to calibrate; ``run_gui(project=path)`` opens a
project file (asking before running its code unless ``trust_code``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from workbench import __version__
from workbench.resources import RESOURCES

__all__ = ["run_gui", "create_application", "RESOURCES", "stylesheet", "app_icon"]

ORGANIZATION = "Quant Workbench"
APP_NAME = "Quant Workbench"


def app_icon() -> QIcon | None:
    """The application icon from ``resources/icons`` (svg preferred), if one is there."""
    folder = RESOURCES / "icons"
    if not folder.is_dir():
        return None
    candidates = sorted(folder.glob("*.svg")) + sorted(folder.glob("*.png"))
    preferred = [p for p in candidates if "workbench" in p.stem] or candidates
    return QIcon(str(preferred[0])) if preferred else None


def stylesheet() -> str:
    """The app's style sheet (``resources/style/workbench.qss``), or empty."""
    path = RESOURCES / "style" / "workbench.qss"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def create_application(argv: list[str] | None = None) -> QApplication:
    """The QApplication (reused if one exists), named, styled and with its icon."""
    app = QApplication.instance()
    if app is None:
        from workbench.app.webengine import prepare_application

        prepare_application()  # the graph tab's pre-app settings (Chromium's sandbox when run as root)
        app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setApplicationDisplayName(APP_NAME)
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("quant-workbench")
    if os.environ.get("QT_STYLE_OVERRIDE") is None:
        app.setStyle("Fusion")  # the same look on every desktop (and under Xvfb)
    icon = app_icon()
    if icon is not None:
        app.setWindowIcon(icon)
    sheet = stylesheet()
    if sheet:
        app.setStyleSheet(sheet)
    return app  # type: ignore[return-value]


def run_gui(project: str | Path | None = None, demo: bool = False, trust_code: bool = False) -> int:
    """Run the desktop app until its window closes; returns the exit code."""
    from workbench.app.main_window import MainWindow, install_excepthook

    app = create_application()
    window = MainWindow()
    undo_hook = install_excepthook(window)
    window.show()
    if demo:
        QTimer.singleShot(0, window.open_demo)
    elif project:
        QTimer.singleShot(0, lambda: window.open_project(project, trust_code=trust_code, confirmed=True))
    try:
        return int(app.exec())
    finally:
        undo_hook()
        window.shutdown()
