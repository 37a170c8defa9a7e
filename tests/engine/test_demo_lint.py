"""The demo's own export: named after its modules, and clean for TensorRT but for its 1-channel stem."""
import onnx

from workbench.export.lint import lint_qdq_graph


def test_demo_export_lints_clean_but_for_the_one_channel_stem(demo_export):
    _, _, onnx_path, names = demo_export
    assert "stem.0/Conv" in names and "block.add/Add" in names and "fc/Gemm" in names
    warnings = lint_qdq_graph(onnx.load(str(onnx_path)))
    assert [(w.kind, w.modules, w.severity) for w in warnings] == [("misaligned_channels", ["stem.0"], "info")]
