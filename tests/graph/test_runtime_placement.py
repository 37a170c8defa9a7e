"""Placement without a traceable forward: functional operations found by running the model, quantized at run
time under the fx route's names, judged by the one rule table, exported by both exporters."""
import copy

import pytest
import torch
from torch import nn

from workbench import quant
from workbench.graph import apply_placement_rules, insert_functional_quantizers, prepare_for_tensorrt
from workbench.graph.runtime_ops import record_functional_ops
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantMatMul
from workbench.quant.nn.modules.quant_ops import QuantAdd, QuantConcat


class Scorer(nn.Module):
    """A child with a product of its own: it must never be counted as its caller's."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        return y @ y.transpose(-2, -1)


class Untraceable(nn.Module):
    """Branches on a value (torch.fx cannot trace it); a residual add, a concatenation and a product of its own,
    an add of a parameter, an add inside GELU's tanh formula and an integer add."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.scorer = Scorer()
        self.head = nn.Linear(16, 8)
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        if float(x.abs().max()) > 1e6:
            raise ValueError("input out of range")
        h = self.a(x)
        r = h + self.b(x)                                    # add 0: two activations: quantized
        s = self.scorer(r)                                   # the child's product is the child's
        c = torch.cat([r, self.b(r)], dim=-1)                # concat 0: quantized
        p = torch.softmax(s, -1) @ self.head(c)              # matmul 0: probabilities x value
        g = 0.5 * p * (1 + torch.tanh(0.79788456 * (p + 0.044715 * p ** 3)))  # add 1: GELU's formula: float
        steps = torch.arange(3) + torch.ones(3, dtype=torch.long)             # add 2: integers: float
        return g + self.bias + steps.sum()                   # add 3: a parameter, add 4: an integer: float


def _x(batch=2, seed=0):
    return torch.randn(batch, 4, 8, generator=torch.Generator().manual_seed(seed))


def test_operations_of_an_untraceable_forward_are_found_with_their_owner_index_and_sources():
    model = Untraceable().eval()
    record = record_functional_ops(model, (_x(),))
    own = {(op.kind, op.index): op for op in record.by_owner("")}
    assert sorted(own) == [("add", i) for i in range(5)] + [("concat", 0), ("matmul", 0)]
    assert [(op.kind, op.index) for op in record.by_owner("scorer")] == [("matmul", 0)]
    assert [o.describe() for o in own[("add", 0)].operands] == ["output of a", "output of b"]
    assert own[("add", 0)].reason() is None and own[("concat", 0)].reason() is None
    assert own[("matmul", 0)].roles == ("probabilities", "value") and own[("matmul", 0)].reason() is None
    assert "elementwise formula" in own[("add", 1)].reason()
    assert "not a floating activation" in own[("add", 2)].reason()
    assert "parameter" in own[("add", 3)].reason()
    assert "not a floating activation" in own[("add", 4)].reason()


class AnchorDecode(nn.Module):
    """ultralytics' Detect head: grids built with ``torch.arange(w).type_as(feature)`` and
    ``feature.new_full(...)`` take only a dtype from the activation; they are constants, and so is their
    concatenation (the exporter folds them: a Q/DQ in PyTorch alone parted YOLOv8's file from its model). And
    as Detect, it builds them only when the input's shape changes (a branch torch.fx cannot trace)."""

    def __init__(self):
        super().__init__()
        self.dist = nn.Conv2d(8, 2, 1)
        self.shape = None

    def forward(self, feature):
        h, w = feature.shape[2:]
        if self.shape != feature.shape:
            grid = torch.arange(w).type_as(feature) + 0.5          # a float grid (x + 0.5: no candidate)
            strides = feature.new_full((h * w, 1), 8.0)
            self.anchors = torch.cat([grid, grid])                 # concat 0: constants: float
            self.strides = torch.cat([strides, strides])           # concat 1: constants: float
            self.shape = feature.shape
        dist = self.dist(feature).flatten(2)[:, 0, : 2 * w]
        boxes = self.anchors + dist                                # add 0: a constant operand: float
        scale = self.strides.squeeze(-1)[: 2 * w]
        return torch.cat([boxes * scale, dist], dim=-1)            # concat 2: activations: quantized


def test_grids_that_take_only_a_dtype_from_an_activation_are_constants_not_activations():
    record = record_functional_ops(AnchorDecode().eval(), (torch.randn(1, 8, 4, 4),))
    own = {(op.kind, op.index): op for op in record.by_owner("")}
    assert [o.describe() for o in own[("concat", 0)].operands] == ["a constant or mask"] * 2
    for key in (("concat", 0), ("concat", 1), ("add", 0)):
        assert "not a floating activation" in own[key].reason(), key
    assert own[("concat", 2)].reason() is None


def test_a_branch_taken_in_one_call_only_does_not_move_the_quantizers_of_the_others():
    """Recorded on the call that builds the anchors (three concatenations), run on calls that reuse them (one):
    the quantizer of the boxes' concatenation is found by its call site in both, never shifted to another."""
    model = AnchorDecode().eval()
    x = torch.randn(2, 8, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(x)
    model.shape = None
    result, report = insert_functional_quantizers(model, example_inputs=(x[:1],))
    assert report.runtime == [""] and report.inserted_names == ["cat"]
    with torch.no_grad():
        result(x)  # a new shape: the anchors are built again, and stay float
    calibrate(result, [x], num_batches=None, method="max", report_sqnr=False)  # the shape seen: anchors reused
    assert result.cat._input_quantizer.amax is not None  # reached on the call without the anchors' branch
    with quant.disable_quantization(result), torch.no_grad():
        assert torch.equal(result(x), reference)
    with torch.no_grad():
        result.shape = None  # the anchors' branch again: its concatenations stay float, the boxes' is quantized
        rebuilt = result(x)
        assert torch.equal(result(x), rebuilt) and not torch.equal(rebuilt, reference)


def test_untraceable_forward_is_quantized_at_run_time_and_computes_the_same_with_quantizers_off():
    model = Untraceable().eval()
    x = _x()
    with torch.no_grad():
        reference = model(x)
    result, report = insert_functional_quantizers(model, example_inputs=(x,))
    assert report.runtime == [""] and report.failures == []
    assert sorted(report.inserted_names) == ["add", "cat", "matmul", "scorer.matmul"]
    assert isinstance(result.add, QuantAdd) and isinstance(result.cat, QuantConcat)
    assert isinstance(result.matmul, QuantMatMul) and result.matmul.roles == ("probabilities", "value")
    reasons = [s.reason for s in report.skipped]
    assert len(reasons) == 4 and any("elementwise formula" in r for r in reasons)
    with quant.disable_quantization(result), torch.no_grad():
        assert torch.equal(result(x), reference)
    calibrate(result, [x], num_batches=None, method="max", report_sqnr=False)
    assert all(result.get_submodule(n)._input0_quantizer.amax is not None for n in ("add", "matmul"))
    assert result.cat._input_quantizer.amax is not None  # calibration reached the run-time quantizers
    with torch.no_grad():
        quantized = result(x)
        assert not torch.equal(quantized, reference)
        # a deep copy carries the quantizers and the plan: it computes the same
        assert torch.equal(copy.deepcopy(result)(x), quantized)
        # the owner's other calls (and another batch) still go through the same quantizers
        assert result(_x(3, seed=1)).shape == (3, 4, 8)


def test_run_time_concat_shares_its_scale_with_its_readers():
    model = Untraceable().eval()
    quant.replace_to_quantization_module(model)
    result, functional = insert_functional_quantizers(model, example_inputs=(_x(),))
    report = apply_placement_rules(result, runtime=functional)
    concat = next(a for a in report.by_rule("concat") if a.anchor == "cat")
    # head reads the concatenation; b and scorer.proj read one of its inputs (r)
    assert set(concat.members) == {"head._input_quantizer", "b._input_quantizer", "scorer.proj._input_quantizer"}
    assert result.head._input_quantizer is result.cat._input_quantizer


def _exports(model, x, tmp_path, exporter):
    import onnx

    from workbench.export import export_qdq_onnx
    path = tmp_path / f"{exporter}.onnx"
    report = export_qdq_onnx(model, (x,), path, exporter=exporter, output="last_hidden_state", min_cosine=0.99,
                             dynamic_batch=False)
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    both = [n for n in graph.node if n.op_type == "MatMul" and all(
        producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in n.input)]
    return report, both


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_hf_sam_vision_attention_products_are_quantized_and_exported(tmp_path, exporter):
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
    import models as zoo

    torch.manual_seed(0)
    model = zoo.hf_sam_vision("eager")
    x = zoo.images(1, 32)
    model, report = prepare_for_tensorrt(model, example_inputs=(x,))
    products = [i.name for i in report.functional.inserted if i.kind == "matmul"]
    assert products == [f"vision_encoder.layers.{n}.attn.matmul{s}" for n in (0, 1) for s in ("", "_1")]
    assert "vision_encoder.layers.0.attn" in report.functional.runtime
    # the relative-position bias added to the scores stays float, with the rule's reason
    bias = [s for s in report.functional.skipped if s.owner == "vision_encoder.layers.0.attn"]
    assert bias and all("attention's own forward" in s.reason for s in bias)
    calibrate(model, [zoo.images(2, 32, seed=1)], num_batches=None, method="max", report_sqnr=False)
    exported, both = _exports(model, x, tmp_path, exporter)
    assert exported.exporter == exporter
    assert len(both) == 4  # both inputs of all 4 attention products come from DequantizeLinear


class BiasedAttention(nn.Module):
    """Scores plus a bias computed from the input (relative-position style), then softmax and P @ V."""

    def __init__(self, guarded: bool):
        super().__init__()
        self.guarded = guarded
        self.qkv = nn.Linear(8, 24)
        self.pos = nn.Linear(8, 4)

    def forward(self, x):
        if self.guarded and float(x.abs().max()) > 1e6:  # a branch on a value: torch.fx cannot trace it
            raise ValueError("input out of range")
        q, k, v = self.qkv(x).chunk(3, -1)
        b = self.pos(x)
        scores = (q @ k.transpose(-2, -1)) * 0.35 + b @ b.transpose(-2, -1)
        return scores.softmax(-1) @ v


@pytest.mark.parametrize("guarded", [False, True], ids=["traced", "run-time"])
def test_one_rule_table_whichever_route_found_the_operations(guarded):
    x = _x()
    _, report = insert_functional_quantizers(BiasedAttention(guarded).eval(), example_inputs=(x,))
    assert report.runtime == ([""] if guarded else [])
    assert sorted(report.inserted_names) == ["matmul", "matmul_1", "matmul_2"]
    (skipped,) = report.skipped
    assert "attention's own forward" in skipped.reason  # the scores' bias: TensorRT's fused attention takes it


class CountsPositives(nn.Module):
    """Converts a value to a Python int (torch.export cannot capture it: the export falls back to TorchScript)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        positives = int((h > 0).sum())
        r = torch.cat([h, self.b(x)], -1)                   # concat 0: quantized at run time
        return r[..., :8] if positives < 0 else r


def test_run_time_quantizers_are_in_the_file_after_torch_export_failed_inside_their_owner(tmp_path):
    """torch.export fails inside the owner's forward and leaves the quantizing mode off torch's stack without
    the owner's post hook: the TorchScript fallback's trace must still go through the quantizers (YOLOv8's
    Detect: its concatenations had Q/DQ in PyTorch and none in the file)."""
    import onnx
    from torch.overrides import _get_current_function_mode_stack

    from workbench.export import export_qdq_onnx

    model = CountsPositives().eval()
    x = _x()
    result, report = insert_functional_quantizers(model, example_inputs=(x,))
    assert report.runtime == [""] and report.inserted_names == ["cat"]
    calibrate(result, [x], num_batches=None, method="max", report_sqnr=False)
    path = tmp_path / "model.onnx"
    exported = export_qdq_onnx(result, (x,), path, min_cosine=0.99, dynamic_batch=False)
    assert exported.exporter == "torchscript"
    # torch.export's failed attempt leaves no mode of its own behind (it did: every later torch call of the thread
    # went through its handler, and torch.compile'd kernels traced that)
    assert _get_current_function_mode_stack() == []
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("DequantizeLinear") == 2 and ops[-1] == "Concat"
    assert not any("no Q/DQ in the file" in w for w in exported.warnings)
