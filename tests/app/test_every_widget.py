"""Every widget of the app, mechanically: no attribute shadows a Qt method or property (Qt calls ``metric()``,
``size()``, ``close()``... on the Python object, so ``self.metric = QComboBox()`` makes painting call a combo box),
and every dialog, wizard page and tab opens and paints on a real project (the demo, and a tiny BERT)."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QObject, SignalInstance  # noqa: E402
from PySide6.QtWidgets import QApplication, QMessageBox, QTabWidget, QWidget  # noqa: E402

import workbench.app  # noqa: E402

Buttons = QMessageBox.StandardButton


def _app_modules() -> list:
    return [importlib.import_module(f"workbench.app.{info.name}")
            for info in pkgutil.iter_modules(workbench.app.__path__)]


def _qt_bases(cls: type) -> list[type]:
    return [base for base in cls.__mro__ if base.__module__.split(".")[0] in ("PySide6", "Shiboken", "shiboken6")]


def qt_names(cls: type) -> set[str]:
    """Every name Qt may look up on an instance of ``cls``: the methods and attributes of its Qt bases and the
    Qt properties of its meta-object."""
    names: set[str] = set()
    for base in _qt_bases(cls):
        names |= set(dir(base))
    meta = cls.staticMetaObject
    names |= {meta.property(i).name() for i in range(meta.propertyCount())}
    return names - {"__dict__", "__weakref__", "__module__", "__doc__", "__init__", "__annotations__"}


def assigned_names(cls: type) -> dict[str, int]:
    """``self.X = ...`` anywhere in the app's own classes of ``cls``'s MRO (mixins included), and class-level
    names: {name: line}."""
    found: dict[str, int] = {}
    for owner in cls.__mro__:
        if not owner.__module__.startswith("workbench.app"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(owner)))
        cls_node = tree.body[0]
        for node in ast.walk(cls_node):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name)
                            and element.value.id == "self"):
                        found.setdefault(element.attr, node.lineno)
                    elif isinstance(element, ast.Name) and node in cls_node.body:
                        found.setdefault(element.id, node.lineno)
    return found


def app_qt_classes() -> list[type]:
    classes = {}
    for module in _app_modules():
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, QObject):
                classes[cls.__qualname__] = cls
    return list(classes.values())


def test_no_attribute_of_an_app_widget_shadows_a_qt_method_or_property():
    classes = app_qt_classes()
    assert len(classes) > 30  # every module was found (a broken import would leave classes out)
    shadowing = [f"{cls.__module__}.{cls.__qualname__}.{name} (line {line} of its class)"
                 for cls in classes for name, line in assigned_names(cls).items() if name in qt_names(cls)]
    assert not shadowing, "attributes hide Qt's own:\n" + "\n".join(shadowing)


def instance_shadowing(widget: QObject) -> list[str]:
    """The live instance's own attributes (``vars``) that hide a Qt name, for it and every app object under it."""
    found = []
    objects = [widget, *widget.findChildren(QObject)]
    for obj in objects:
        cls = type(obj)
        if not cls.__module__.startswith("workbench.app"):
            continue
        try:  # PySide keeps the signals it has bound in the instance's dict: those are Qt's own
            attributes = {name for name, value in vars(obj).items() if not isinstance(value, SignalInstance)}
        except TypeError:
            continue
        for name in attributes & qt_names(cls):
            found.append(f"{cls.__qualname__}.{name}")
    return found


# ----- open and paint everything on a real project -------------------------------------------------------------

def idle(window, qtbot, timeout=60000):
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=timeout)
    QApplication.processEvents()


def painted(widget: QWidget, what: str) -> None:
    """``widget`` paints (Qt calls the widget's own methods there: a shadowing attribute crashes or raises)."""
    widget.show()
    QApplication.processEvents()
    image = widget.grab()
    assert not image.isNull() and image.width() > 10 and image.height() > 10, what
    assert not instance_shadowing(widget), f"{what}: {instance_shadowing(widget)}"


def no_errors(window) -> None:
    shown = [d for d in window.error_dialogs if d.isVisible()]
    assert not shown, f"{shown[-1].title}: {shown[-1].message}"


def open_and_paint_everything(window, qtbot, tmp_path) -> None:
    controller = window.controller
    with qtbot.waitSignal(controller.busy_changed, timeout=120000, check_params_cb=lambda busy: not busy):
        assert controller.calibrate(method="max")
    idle(window, qtbot)
    assert window.tree.select_row(next(iter(controller.session.project.layers)))
    idle(window, qtbot)
    painted(window, "main window")
    # every tab of every tab widget (the main tabs, the layer panel's input/weight tabs, the sensitivity views)
    for tabs in window.findChildren(QTabWidget):
        for index in range(tabs.count()):
            tabs.setCurrentIndex(index)
            painted(tabs.widget(index), f"tab {tabs.tabText(index)}")
    window.tabs.setCurrentIndex(0)
    no_errors(window)
    for open_dialog in (window.settings_dialog, window.calibrate_dialog, window.export_dialog,
                        window.tree.set_descriptor_dialog, window.tree.ignore_pattern_dialog):
        dialog = open_dialog()
        assert dialog is not None, open_dialog.__name__
        painted(dialog, open_dialog.__name__)
        dialog.reject()
        QApplication.processEvents()
        no_errors(window)  # a dialog's close repaints the window: no error comes back after it
    error = window.show_error("A test error", "what went wrong", "details")
    painted(error, "error dialog")
    error.close()
    wizard = window.new_project()
    for page_id in wizard.pageIds():
        painted(wizard.page(page_id), f"wizard page {page_id}")
    wizard.reject()
    # the export report, then the comparison with the saved project
    controller.session.project.settings["export"]["path"] = str(tmp_path / "model.qdq.onnx")
    with qtbot.waitSignal(controller.export_finished, timeout=300000):
        window.export_action.trigger()
    qtbot.waitUntil(lambda: window.export_report_dialog is not None and window.export_report_dialog.isVisible())
    painted(window.export_report_dialog, "export report")
    window.export_report_dialog.close()
    assert controller.save(str(tmp_path / "saved.qwb")) is not None
    assert window.compare_with_project(str(tmp_path / "saved.qwb"))
    qtbot.waitUntil(lambda: window.dialog is not None and type(window.dialog).__name__ == "CompareDialog",
                    timeout=60000)
    painted(window.dialog, "compare dialog")
    window.dialog.close()
    idle(window, qtbot)
    no_errors(window)
    assert not instance_shadowing(window)


def test_every_dialog_page_and_tab_paints_on_the_demo(window, qtbot, tmp_path):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    idle(window, qtbot)
    open_and_paint_everything(window, qtbot, tmp_path)


def test_every_dialog_page_and_tab_paints_on_a_bert(window, qtbot, tmp_path):
    pytest.importorskip("transformers")
    from bert_project import bert_specs

    model, data = bert_specs(tmp_path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.new_project(model, data, base_dir=tmp_path)
    idle(window, qtbot)
    open_and_paint_everything(window, qtbot, tmp_path)
