"""The float type a network computes in (float32, bfloat16, float16), as the exported graph holds it.

A bf16 or fp16 model exports in its own dtype: its float layers and weights keep that type in the file, and
each quantizer is written ``Cast(float32) -> QuantizeLinear -> DequantizeLinear -> Cast(network type)`` with
float32 scales (:class:`workbench.export.qdq.QDQStandIn`), the form TensorRT reads for such networks (Model
Optimizer writes bf16 networks the same way; onnx's QuantizeLinear takes no bf16 input before opset 19).
onnxruntime has no CPU kernels for most bfloat16 operators (``Mul``, ``MatMul``), so a bf16 graph is checked
on onnx's reference evaluator, which computes bfloat16 with ml_dtypes.
"""
from __future__ import annotations

import onnx
import torch
from onnx import TensorProto

from workbench.sources.input_dtype import float_dtype_of

__all__ = ["graph_float_type", "needs_bfloat16_evaluator", "dtype_name", "bf16_opset", "bfloat16_matmul_op",
           "BF16_OPSET"]

# TensorRT reads bfloat16 from TensorRT 9 (8.6, the opset-17 target, has none), and onnx's reference evaluator,
# which checks bf16 graphs, runs QuantizeLinear/DequantizeLinear from opset 19 (where they take bf16)
BF16_OPSET = 19

_NAMES = {TensorProto.FLOAT: "float32", TensorProto.BFLOAT16: "bfloat16", TensorProto.FLOAT16: "float16",
          TensorProto.DOUBLE: "float64"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the name the reports print."""
    return str(dtype).removeprefix("torch.")


def graph_float_type(proto: onnx.ModelProto) -> str:
    """The float type of the graph's float outputs (what the network computes in): ``float32``, ``bfloat16``,
    ``float16``; ``float32`` when no output is a float."""
    for output in proto.graph.output:
        elem = output.type.tensor_type.elem_type
        if elem in _NAMES:
            return _NAMES[elem]
    return "float32"


def needs_bfloat16_evaluator(proto: onnx.ModelProto) -> str | None:
    """Why onnxruntime cannot check this graph on the CPU (bfloat16 operators), or None."""
    if any(init.data_type == TensorProto.BFLOAT16 for init in proto.graph.initializer) or \
            graph_float_type(proto) == "bfloat16":
        return "bfloat16 operators (Mul, MatMul in bfloat16)"
    return None


def bf16_opset(model: torch.nn.Module, opset: int, notes: list[str]) -> int:
    """``opset``, raised to :data:`BF16_OPSET` for a bfloat16 model (with a note saying why)."""
    if opset < BF16_OPSET and float_dtype_of(model) == torch.bfloat16:
        notes.append(f"opset {BF16_OPSET} instead of the requested {opset}: a bfloat16 network (TensorRT 8.6, "
                     f"which stops at opset 17, has no bfloat16; QuantizeLinear takes bfloat16 from opset 19)")
        return BF16_OPSET
    return opset


def bfloat16_matmul_op() -> type:
    """A ``MatMul`` for onnx's reference evaluator that computes a bfloat16 product with float32 BLAS and rounds it
    to bfloat16 once, as the evaluator's own (numpy's ``dot`` of ml_dtypes' bfloat16, a float32 sum element by
    element, over a hundred times slower on a decoder's GEMMs) and TensorRT's bf16 GEMMs do: float32 accumulation,
    one rounding of the result. Other dtypes go through numpy's matmul as before."""
    import ml_dtypes
    import numpy as np
    from onnx.reference.op_run import OpRun

    class MatMul(OpRun):
        def _run(self, a, b):
            if a.dtype == ml_dtypes.bfloat16 and b.dtype == ml_dtypes.bfloat16:
                return (np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(ml_dtypes.bfloat16),)
            result = np.matmul(a, b)
            return (result if result.dtype == a.dtype else result.astype(a.dtype),)

    return MatMul
