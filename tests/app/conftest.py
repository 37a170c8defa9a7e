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
