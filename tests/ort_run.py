"""onnxruntime sessions for tests that compare a file's numbers with the fake-quant model.

onnxruntime's default (extended) graph optimizations fuse Q/DQ pairs into its integer kernels. On an x86 CPU without
VNNI (AVX2 only, as CI's machine) those kernels compute u8 x s8 products whose int16 pair sums saturate, so the
outputs move by far more than rounding, and the amount depends on the CPU. TensorRT builds the graph as written,
and the export's own validation runs onnxruntime with its optimizations off (the default-optimization difference
is reported as information). A test that compares values therefore opens the file with the basic optimizations;
a test that checks the file opens with the defaults keeps them.
"""
import onnxruntime as ort


def value_session(path) -> ort.InferenceSession:
    """A CPU session with the basic graph optimizations (constant folding, no Q/DQ fusion into integer kernels)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
