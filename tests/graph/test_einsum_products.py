"""Attention written with ``torch.einsum`` (torchvision's MaxViT): a two-operand einsum that is a batched matrix
product is a product of two activations, quantized on both inputs like ``q @ k^T`` and ``P @ V``, by the torch.fx
route and the run-time route alike, and exported as a MatMul whose inputs come from DequantizeLinear."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench import quant
from workbench.graph import insert_functional_quantizers, prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantMatMul
from workbench.quant.nn.modules.einsum_product import einsum_product

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from zoo_checks import attention_products  # noqa: E402


class EinsumAttention(nn.Module):
    """MaxViT's relative-position attention, shrunk: both products are einsums (with spaces, as torchvision writes
    them), plus einsums that are no product of two activations (with learned memory keys, a Linear-like
    contraction with a weight, a diagonal)."""

    def __init__(self, guarded: bool = False, heads: int = 2, dim: int = 8):
        super().__init__()
        self.guarded, self.heads, self.dim = guarded, heads, dim
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.merge = nn.Linear(dim, dim)
        self.mix = nn.Parameter(torch.randn(dim, dim) / dim)
        self.bias = nn.Parameter(torch.zeros(heads, 1, 1))
        self.memory = nn.Parameter(torch.randn(1, 1, heads, 3, dim // heads))

    def forward(self, x):  # x: (B, G, P, D)
        if self.guarded and float(x.abs().max()) > 1e6:  # a branch on a value: torch.fx cannot trace it
            raise ValueError("input out of range")
        b, g, p, d = x.shape
        q, k, v = torch.chunk(self.to_qkv(x), 3, dim=-1)
        q, k, v = (t.reshape(b, g, p, self.heads, d // self.heads).permute(0, 1, 3, 2, 4) for t in (q, k, v))
        k = k * (d // self.heads) ** -0.5
        scores = torch.einsum("B G H I D, B G H J D -> B G H I J", q, k)
        probabilities = F.softmax(scores + self.bias, dim=-1)
        out = torch.einsum("B G H I J, B G H J D -> B G H I D", probabilities, v)
        out = out.permute(0, 1, 3, 2, 4).reshape(b, g, p, d)
        mixed = torch.einsum("bgpd,de->bgpe", out, self.mix)             # a weight: a Linear-like contraction
        trace = torch.einsum("bghii->bgh", scores).mean()                # a diagonal: no matrix product
        recalled = torch.einsum("B G H I D, B G H J D -> B G H I J", q, self.memory).mean()  # a parameter operand
        return self.merge(mixed) + trace + recalled


def _x(batch=2, seed=0):
    return torch.randn(batch, 3, 4, 8, generator=torch.Generator().manual_seed(seed))


def test_einsum_equations_that_are_batched_matrix_products():
    product = einsum_product("B G H I D, B G H J D -> B G H I J")
    assert product is not None and product.right_transposed
    a, b = torch.randn(2, 3, 2, 4, 5), torch.randn(2, 3, 2, 6, 5)
    left, right = product.operands(a, b)
    assert torch.allclose(product.product(left, right), torch.einsum(product.equation, a, b), atol=1e-6)
    # an output in another order than matmul's, batch indices in any place
    other = einsum_product("ikb,bkj->jbi")
    a, b = torch.randn(4, 5, 3), torch.randn(3, 5, 6)
    assert torch.allclose(other.product(*other.operands(a, b)), torch.einsum("ikb,bkj->jbi", a, b), atol=1e-6)
    for refused in ("bij,bjk", "bij,bjk,bkl->bil", "bii->bi", "bij,bkl->bijkl", "bijk,bjkl->bil", "...ij,...jk->...ik",
                    "bij,bjk->bk", "bij,bj->bi"):
        assert einsum_product(refused) is None, refused


@pytest.mark.parametrize("guarded", [False, True], ids=["traced", "run-time"])
def test_einsum_attention_products_are_quantized_on_both_inputs(guarded):
    model = EinsumAttention(guarded).eval()
    x = _x()
    with torch.no_grad():
        reference = model(x)
    result, report = insert_functional_quantizers(model, example_inputs=(x,))
    assert report.runtime == ([""] if guarded else [])
    products = sorted(i.name for i in report.inserted if i.kind == "matmul")
    assert products == ["matmul", "matmul_1"]
    scores, context = result.matmul, result.matmul_1
    assert isinstance(scores, QuantMatMul) and scores.op == "einsum" and context.op == "einsum"
    assert context.roles == ("probabilities", "value")
    if not guarded:  # the fx route reads the key's transposition off the equation
        assert scores.roles == ("query", "key")
    # the product with learned keys is left float with the rule's reason; the Linear-like contraction and the
    # diagonal are no candidates at all
    (memory,) = [s for s in report.skipped if "einsum" in s.operation]
    assert "not a product of two activations" in memory.reason
    with quant.disable_quantization(result), torch.no_grad():
        assert torch.equal(result(x), reference)  # quantizers off: exactly torch.einsum's result
    calibrate(result, [x], num_batches=None, method="max", report_sqnr=False)
    for module in (scores, context):
        assert module._input0_quantizer.amax is not None and module._input1_quantizer.amax is not None
    with torch.no_grad():
        assert not torch.equal(result(x), reference)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_einsum_attention_exports_as_matmuls_with_dequantized_inputs_and_parity(tmp_path, exporter):
    import onnx
    import onnxruntime as ort

    from workbench.export import export_qdq_onnx

    torch.manual_seed(0)
    model, _ = prepare_for_tensorrt(EinsumAttention().eval(), example_inputs=(_x(),))
    calibrate(model, [_x(4, seed=1)], num_batches=None, method="max", report_sqnr=False)
    path = tmp_path / f"{exporter}.onnx"
    report = export_qdq_onnx(model, (_x(),), path, exporter=exporter, min_cosine=0.999, dynamic_batch=False)
    assert report.exporter == exporter and report.validated
    # the sweep's own check (bench/zoo_checks.py): products of two activations, Q/DQ on both inputs (through
    # Transposes); the einsums with a parameter operand are weight contractions, not counted
    assert attention_products(path) == (2, 2)
    graph = onnx.load(str(path)).graph
    constants = {t.name for t in graph.initializer}
    einsums = [n for n in graph.node if n.op_type == "Einsum"]
    # the quantized products are MatMuls (TensorRT builds those as INT8 GEMMs); the float einsums stay einsums
    assert len(einsums) == 3 and all(len(n.input) == 1 or constants & set(n.input) for n in einsums)
    with torch.no_grad():
        expected = model(_x(seed=3)).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: _x(seed=3).numpy()})
    cosine = float(np.dot(actual.ravel(), expected.ravel()) / np.linalg.norm(actual) / np.linalg.norm(expected))
    assert cosine > 0.999
