"""The demo's own export: named after its modules, and clean for TensorRT."""
import onnx

from workbench.export.lint import lint_qdq_graph


def test_demo_export_lints_clean(demo_export):
    _, _, onnx_path, names = demo_export
    assert "stem.0/Conv" in names and "block.add/Add" in names and "fc/Gemm" in names
    # its 1-channel stem is an image layer TensorRT has kernels for: no alignment warning
    assert lint_qdq_graph(onnx.load(str(onnx_path))) == []
