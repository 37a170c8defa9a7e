"""A real main window on a project, for the engine tests' GUI checks (pytest-qt, offscreen)."""
from PySide6.QtCore import QSettings

from workbench.app.main_window import MainWindow


def open_window(qtbot, tmp_path, project):
    """A shown MainWindow with ``project`` opened and its tree built; settings kept in ``tmp_path``."""
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_project(project)
    qtbot.waitUntil(lambda: window.tree.model.node_count() > 0 and not window.controller.busy, timeout=20000)
    return window
