"""The layer panel's histogram says only what is true: no method in its title once the histogram is dropped (a
Bits change), and every amax method can be picked from the legend, also one whose line lies under another's
(pytest-qt, offscreen, on the demo project)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")


from window_waits import settle  # noqa: E402


def test_title_and_legend_follow_the_histogram(window, qtbot):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.controller.calibrate(method="auto")
    settle(window, qtbot)
    window.tree.select_row("block.conv1")
    settle(window, qtbot)
    panel = window.layer_panel
    assert panel.histogram is not None and "auto:" in panel.histogram_title.text()
    # every method is a link in the legend: the user can pick one whose line another hides
    legend = panel.amax_legend.text()
    for method in ("max", "entropy", "mse", "percentile"):
        assert f"href='method:{method}'" in legend
    quantizer = panel.quantizer_name
    method = next(m for m in ("entropy", "percentile", "max") if f"▶ {m}" not in legend)  # one not in use
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        panel.amax_legend.linkActivated.emit(f"method:{method}")  # what a click on its name in the legend sends
    settle(window, qtbot)
    record = window.controller.session.project.current_calibration.quantizers[quantizer]
    assert record.method == method
    assert max(line.zValue() for line in panel.amax_lines.values()) == panel.amax_lines[method].zValue()
    # a Bits change drops the histogram: the title no longer names a method
    panel.role_tabs.setCurrentIndex(0)
    settle(window, qtbot)
    panel.editor.num_bits.setValue(6)
    assert panel.apply()
    settle(window, qtbot)
    assert panel.histogram is None
    assert panel.histogram_title.text() == "Calibration histogram"
