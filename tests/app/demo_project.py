"""The demo project as the GUI tests open it (imported by name: tests/app is on sys.path)."""
from __future__ import annotations

from typing import Any

from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def open_demo(controller: Any, qtbot: Any, metric: str | None = None, **calibration: Any) -> Any:
    """A new demo project (2 calibration batches) through ``controller``, calibrated with
    ``calibration`` (e.g. ``method="max"``) when given; returns the session."""
    settings = {"metric": {"name": metric, "direction": None}} if metric else None
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        assert controller.new_project(ModelSpec("demo", "digits"),
                                      DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2),
                                      DataSpec("demo", "digits", split="test", batch_size=256), settings=settings)
    if calibration:
        with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
            controller.calibrate(**calibration)
    return controller.session


def shown(widget: Any, qtbot: Any, width: int, height: int) -> Any:
    """``widget`` as a test looks at it: owned by qtbot (closed after the test), sized and shown."""
    qtbot.addWidget(widget)
    widget.resize(width, height)
    widget.show()
    return widget
