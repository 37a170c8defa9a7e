"""The descriptor editor says what export will make of the fields while the user edits them (Bits 7 is flagged at
once, not first by Export), and shows an INT4 weight-only layer as it is: its input off, its weight in blocks
(pytest-qt, offscreen)."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")


from window_waits import open_calibrated_bert, settle  # noqa: E402

from workbench.app.tree_model import WEIGHT  # noqa: E402

# the FFN's output GEMM: 64 input features, a size TensorRT builds INT4 blocks for (the intermediate dense
# has 32, under the smallest block)
INT4_LAYER = "bert.encoder.layer.0.output.dense"


def test_bits_export_cannot_write_are_flagged_while_editing(window, qtbot):
    with qtbot.waitSignal(window.controller.session_changed, timeout=60000):
        assert window.open_demo()
    settle(window, qtbot)
    window.controller.select(["block.conv1"])
    settle(window, qtbot)
    panel = window.layer_panel
    editor = panel.editor
    assert not editor.export_note.isVisibleTo(editor)  # INT8: what export writes
    editor.num_bits.stepDown()  # 7 bits, as the arrow key does it
    assert editor.num_bits.value() == 7
    assert editor.export_note.isVisibleTo(editor), "said at once, before Apply"
    assert "Export will refuse this" in editor.export_note.text() and "7-bit" in editor.export_note.text()
    editor.num_bits.stepUp()
    assert not editor.export_note.isVisibleTo(editor)
    # a per-channel axis TensorRT cannot build for a conv weight is said at once too
    panel.role_tabs.setCurrentIndex(1)
    settle(window, qtbot)
    editor.axis.setCurrentIndex(editor.axis.findData(1))
    assert editor.export_note.isVisibleTo(editor) and "axis=1" in editor.export_note.text()
    # the context-menu dialog says the same
    window.tree.select_row("block.conv1")
    dialog = window.tree.set_descriptor_dialog()
    dialog.editor.num_bits.setValue(5)
    assert "5-bit" in dialog.editor.export_problem()
    dialog.reject()


def test_an_int4_weight_only_layer_shows_its_input_off_and_its_weight_in_blocks(window, qtbot, tmp_path):
    pytest.importorskip("transformers")
    from bert_project import bert_specs

    model, data = bert_specs(tmp_path)
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    assert window.controller.set_precision([INT4_LAYER], "int4w")
    settle(window, qtbot)
    window.controller.select([INT4_LAYER])
    settle(window, qtbot)
    panel, editor = window.layer_panel, window.layer_panel.editor
    panel.role_tabs.setCurrentIndex(0)
    settle(window, qtbot)
    assert editor.state_note.isVisibleTo(editor) and editor.state_note.text().startswith("Off")
    assert not editor.num_bits.isEnabled() and not editor.calib_method.isEnabled()
    assert not editor.export_note.isVisibleTo(editor)  # an off quantizer is nothing export refuses
    panel.role_tabs.setCurrentIndex(1)
    settle(window, qtbot)
    assert not editor.state_note.isVisibleTo(editor) and editor.num_bits.isEnabled()
    assert editor.num_bits.value() == 4 and "blocks of 64" in editor.axis.currentText()
    assert "64" in window.tree.model.text(INT4_LAYER, WEIGHT)  # the tree and the editor agree
    assert not editor.export_note.isVisibleTo(editor)  # INT4 in blocks: export writes it


def test_a_full_calibration_with_an_int4_layer_leaves_nothing_to_recalibrate(window, qtbot, tmp_path):
    pytest.importorskip("transformers")
    open_calibrated_bert(window, qtbot, tmp_path)
    assert window.controller.set_precision([INT4_LAYER], "int4w")
    settle(window, qtbot)
    with qtbot.waitSignal(window.controller.calibration_changed, timeout=60000):
        window.calibrate_action.trigger()
    settle(window, qtbot)
    assert "recalibrating" not in window.summary_label.text()  # its input is off: it needs no amax
    assert window.controller.session.build_report.stale == []
    path = tmp_path / "int4.qwb"
    assert window.controller.save(str(path)) is not None
    with qtbot.waitSignal(window.controller.session_changed, timeout=120000):
        assert window.open_project(path, confirmed=True)
    settle(window, qtbot)
    assert "recalibrating" not in window.summary_label.text()  # nor after reopening
