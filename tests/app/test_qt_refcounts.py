"""The Qt binding must not drain Python's reference counts: PySide6 6.12.0 drops a reference to ``True`` at every
``Signal.emit`` and to ``None`` when widgets resize, and the app (or a long test run) then died at exit with "Fatal
Python error: none_dealloc". pyproject.toml keeps PySide6 below 6.12; this fails on a binding with the bug."""
from __future__ import annotations

import gc
import sys

import pytest

pytest.importorskip("PySide6")


# references held while measuring, so that a binding with the bug fails the assertion instead of aborting the run
_MARGIN = [True, False, None] * 20000


def _counts() -> tuple[int, int, int]:
    gc.collect()
    return sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)


def test_emitting_signals_keeps_the_reference_counts_of_true_false_and_none(qapp):
    from PySide6.QtCore import QObject, Signal

    class Emitter(QObject):
        changed = Signal(int)
        done = Signal()

    received: list[int] = []
    emitter = Emitter()
    emitter.changed.connect(received.append)
    emitter.done.connect(lambda: None)
    before = _counts()
    for value in range(2000):
        emitter.changed.emit(value)
        emitter.done.emit()
    after = _counts()
    assert len(received) == 2000
    drained = [b - a for a, b in zip(after, before)]
    assert max(drained) < 100, f"2000 emits took {drained} references from True, False, None"


def test_resizing_widgets_keeps_the_reference_count_of_none(qapp):
    from PySide6.QtCore import QSize
    from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

    parent = QWidget()
    layout = QVBoxLayout(parent)
    for index in range(5):
        layout.addWidget(QLabel(f"label {index}"))
    parent.show()
    before = _counts()
    for step in range(300):
        parent.resize(QSize(200 + step % 50, 150 + step % 30))
        qapp.processEvents()
    after = _counts()
    drained = [b - a for a, b in zip(after, before)]
    assert max(drained) < 100, f"300 resizes took {drained} references from True, False, None"
    parent.close()
