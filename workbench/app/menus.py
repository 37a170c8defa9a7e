"""The main window's actions, menus and toolbar, built from one registry.

Every command the window offers is one :class:`ActionSpec` in :data:`ACTIONS`: its text, the window
method it calls, shortcut, tip, icon, and when it is enabled. :data:`MENUS` and :data:`TOOLBAR` say
where each appears by name, so a command is described once and every menu reads the same entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QMenu, QStyle, QToolBar, QWidget

__all__ = ["APP_NAME", "ActionSpec", "ACTIONS", "MENUS", "TOOLBAR", "SEPARATOR", "RECENT", "DEVICE", "RecentMenu",
           "build_actions", "build_menus", "build_toolbar", "MAX_RECENT"]

APP_NAME = "Quant Workbench"
SP = QStyle.StandardPixmap
Keys = QKeySequence.StandardKey
SEPARATOR = "-"
RECENT = "recent"   # the Open Recent submenu
DEVICE = "device"   # the device selector (a widget, toolbar only)
MAX_RECENT = 10


@dataclass(frozen=True)
class ActionSpec:
    """One command: ``window.<name>_action`` calls ``window.<slot>()``.

    ``enabled``: "project" (an open project and no running job), "idle" (no running job), "busy"
    (only while a job runs) or "always".
    """

    name: str
    text: str
    slot: str
    shortcut: Any = None
    tip: str = ""
    icon: QStyle.StandardPixmap | None = None
    enabled: str = "always"


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("new", "&New Project…", "new_project", Keys.New, "Create a project: model, data, metric",
               SP.SP_FileIcon, "idle"),
    ActionSpec("open", "&Open…", "open_project_dialog", Keys.Open, "Open a project file (.qwb)",
               SP.SP_DialogOpenButton, "idle"),
    ActionSpec("demo", "Open &Demo Project", "open_demo", None, "The digits CNN with its data, ready to calibrate",
               enabled="idle"),
    ActionSpec("save", "&Save", "save", Keys.Save, "Save the project", SP.SP_DialogSaveButton, "project"),
    ActionSpec("save_as", "Save &As…", "save_as", Keys.SaveAs, "Save the project to a new file", enabled="project"),
    ActionSpec("quit", "&Quit", "close", Keys.Quit, "Quit Quant Workbench"),
    ActionSpec("calibrate", "Calibrate", "calibrate", "Ctrl+R",
               "Calibrate on the project's data with its calibration settings", SP.SP_MediaPlay, "project"),
    ActionSpec("calibrate_dialog", "&Calibrate…", "calibrate_dialog", "Ctrl+Shift+R",
               "Choose the amax method and batches, then calibrate", enabled="project"),
    ActionSpec("export", "Export", "export", "Ctrl+E", "Write and validate QDQ ONNX with the last export settings",
               SP.SP_DialogApplyButton, "project"),
    ActionSpec("export_dialog", "&Export…", "export_dialog", "Ctrl+Shift+E",
               "Choose the ONNX path and opset, then export", enabled="project"),
    ActionSpec("evaluate", "E&valuate", "evaluate", None, "FP32 against INT8 on the evaluation data",
               enabled="project"),
    ActionSpec("settings", "&Settings…", "settings_dialog", None,
               "Default descriptors, placement rules, calibration, metric, export", enabled="project"),
    ActionSpec("cancel", "Cancel", "cancel_job", "Esc", "Stop the running job", SP.SP_BrowserStop, "busy"),
    ActionSpec("engine", "Import &TensorRT Report…", "import_engine_report", None,
               "Read trtexec's --exportLayerInfo (and --exportProfile) files: what ran in INT8, FP16, FP32, "
               "and the hazards", enabled="project"),
    ActionSpec("about", "&About", "about"),
)

# entries: an action's name, SEPARATOR, RECENT, a dotted attribute of the window (an action another
# widget owns), or the name of a dock (its show/hide toggle)
MENUS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("&File", ("new", "open", "demo", RECENT, SEPARATOR, "save", "save_as", SEPARATOR, "quit")),
    ("&Project", ("calibrate_dialog", "evaluate", "export_dialog", "engine", SEPARATOR,
                  "tree.descriptor_action", "tree.pattern_action", SEPARATOR, "settings")),
    ("&View", ("tree_dock", "log_dock")),
    ("&Help", ("about",)),
)
TOOLBAR: tuple[str, ...] = ("new", "open", "save", SEPARATOR, "calibrate", "export", SEPARATOR, DEVICE, SEPARATOR,
                            "cancel")


def build_actions(window: QMainWindow) -> dict[str, list[QAction]]:
    """Make every action of :data:`ACTIONS` as ``window.<name>_action``; returns them by ``enabled`` state."""
    groups: dict[str, list[QAction]] = {}
    for spec in ACTIONS:
        action = QAction(spec.text, window)
        if spec.icon is not None:
            action.setIcon(window.style().standardIcon(spec.icon))
        if spec.shortcut is not None:
            action.setShortcut(QKeySequence(spec.shortcut))
        if spec.tip:
            action.setToolTip(spec.tip)
            action.setStatusTip(spec.tip)
        slot = getattr(window, spec.slot)
        action.triggered.connect(lambda _checked=False, slot=slot: slot())
        setattr(window, f"{spec.name}_action", action)
        groups.setdefault(spec.enabled, []).append(action)
    return groups


def _entry(window: QMainWindow, name: str) -> QAction:
    if "." in name:
        owner, attribute = name.split(".", 1)
        return getattr(getattr(window, owner), attribute)
    target = getattr(window, f"{name}_action", None) or getattr(window, name)
    return target.toggleViewAction() if isinstance(target, QDockWidget) else target


def build_menus(window: QMainWindow, recent_menu: QMenu) -> None:
    """The menu bar, as :data:`MENUS` lays it out."""
    bar = window.menuBar()
    for title, entries in MENUS:
        menu = bar.addMenu(title)
        for name in entries:
            if name == SEPARATOR:
                menu.addSeparator()
            elif name == RECENT:
                menu.addMenu(recent_menu)
            else:
                menu.addAction(_entry(window, name))


def build_toolbar(window: QMainWindow, device_selector: QWidget) -> QToolBar:
    """The main toolbar, as :data:`TOOLBAR` lays it out."""
    toolbar = window.addToolBar("Main")
    toolbar.setObjectName("mainToolbar")
    toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    toolbar.setMovable(False)
    for name in TOOLBAR:
        if name == SEPARATOR:
            toolbar.addSeparator()
        elif name == DEVICE:
            toolbar.addWidget(QLabel(" Device "))
            toolbar.addWidget(device_selector)
        else:
            toolbar.addAction(_entry(window, name))
    return toolbar


class RecentMenu(QMenu):
    """File ▸ Open Recent: the last :data:`MAX_RECENT` project files, kept in ``settings``."""

    def __init__(self, settings: QSettings, open_project: Any, parent: QWidget | None = None) -> None:
        super().__init__("Open &Recent", parent)
        self.settings = settings
        self._open = open_project
        self.aboutToShow.connect(self.fill)
        self.fill()

    def paths(self) -> list[str]:
        value = self.settings.value("recent_projects", [])
        if isinstance(value, str):
            value = [value] if value else []
        return [str(v) for v in (value or [])]

    def add(self, path: str | Path) -> None:
        path = str(Path(path).expanduser().resolve())
        recent = [path] + [p for p in self.paths() if p != path]
        self.settings.setValue("recent_projects", recent[:MAX_RECENT])
        self.settings.setValue("last_dir", str(Path(path).parent))
        self.fill()

    def remove(self, path: str | Path) -> None:
        path = str(Path(path).expanduser().resolve())
        self.settings.setValue("recent_projects", [p for p in self.paths() if p != path])
        self.fill()

    def fill(self) -> None:
        self.clear()
        recent = self.paths()
        for number, path in enumerate(recent, 1):
            action = self.addAction(f"&{number % 10} {Path(path).name}  —  {Path(path).parent}")
            action.setData(path)
            action.triggered.connect(lambda _checked=False, p=path: self._open(p))
        if not recent:
            self.addAction("No recent projects").setEnabled(False)
        else:
            self.addSeparator()
            self.addAction("Clear list", lambda: (self.settings.setValue("recent_projects", []), self.fill()))

