"""insert_functional_quantizers: QuantAdd / QuantConcat inserted by tracing, names, state, fallback."""
import operator

import pytest
import torch
from torch import nn

from workbench import quant
from workbench.graph import insert_functional_quantizers
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantAdd, QuantConcat
from workbench.sources.demo import ResNetLike


def small_resnet():
    torch.manual_seed(0)
    return ResNetLike((1, 1), width=8, num_classes=10).eval()


class Branches(nn.Module):
    """Every form of add, plus adds that must stay alone."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 1)
        self.unused = nn.Linear(2, 2)  # never called: must survive in the state_dict
        self.scale = nn.Parameter(torch.ones(1, 4, 1, 1))
        self.register_buffer("offset", torch.zeros(1, 4, 1, 1))

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        s = a + b
        s = torch.add(s, a)
        t = s.add(b)
        t += a
        u = t.add_(b)
        v = u + 1.0                      # a constant: nothing to quantize
        w = v * self.scale + self.offset  # a buffer operand: left alone, reported
        n = x.size(0) + 1                # shape arithmetic: not an activation
        return torch.add(w, a, alpha=2) * n


def test_resnet_adds_get_stable_names_and_the_model_keeps_its_classes():
    model = small_resnet()
    quant.replace_to_quantization_module(model)
    before = set(model.state_dict())
    result, report = insert_functional_quantizers(model)
    assert report.inserted_names == ["layer1.0.add", "layer2.0.add"]
    assert [i.operation for i in report.inserted] == ["operator.add(bn2, x)", "operator.add(bn2, downsample)"]
    assert report.complete and report.failures == []
    assert result is model and type(model) is ResNetLike  # the root's forward has no add: untouched
    assert isinstance(model.layer1[0].add, QuantAdd)
    assert type(model.layer1[0]).__name__ == "BasicBlock"
    assert set(model.state_dict()) >= before


def test_outputs_unchanged_with_quantizers_disabled():
    model = small_resnet()
    x = torch.randn(2, 3, 32, 32)
    reference = model(x)
    quant.replace_to_quantization_module(model)
    model, _ = insert_functional_quantizers(model)
    with quant.disable_quantization(model):
        assert torch.equal(model(x), reference)
    model.layer1[0].add._input1_quantizer.amax = 1e-3  # the inserted quantizer really quantizes
    assert not torch.equal(model(x), reference)


def test_every_add_form_and_what_is_left_alone():
    model = Branches()
    x = torch.randn(2, 3, 5, 5)
    reference = model(x)
    before = set(model.state_dict())
    result, report = insert_functional_quantizers(model)
    assert isinstance(result, torch.fx.GraphModule)
    assert report.inserted_names == ["add", "add_1", "add_2", "add_3", "add_4"]
    assert [s.reason for s in report.skipped] == [
        "one operand is a parameter or buffer of the model, not an activation",
        "scales the second operand (alpha=2)"]
    assert set(result.state_dict()) >= before | {"unused.weight", "unused.bias"}
    assert result.unused is model.unused and result.a is model.a  # shared, not copied
    with quant.disable_quantization(result):
        assert torch.equal(result(x), reference)


def test_in_place_adds_that_fx_would_change_are_left_alone():
    class AugmentedAlias(nn.Module):
        def forward(self, x, y):
            keep = x
            x += y              # changes keep too; fx would record x = x + y
            return x * keep

    class MethodAlias(nn.Module):
        def forward(self, x, y):
            keep = x * 1
            out = keep.add_(y)  # fx records add_ itself; keep is read again below
            return out * keep

    x, y = torch.randn(3), torch.randn(3)
    result, report = insert_functional_quantizers(AugmentedAlias())
    assert report.inserted == [] and isinstance(result, AugmentedAlias)
    assert "`x += ...`" in report.failures[0].reason and "forward argument" in report.failures[0].reason

    result, report = insert_functional_quantizers(MethodAlias())
    assert report.inserted == []
    assert report.skipped[0].reason == "in-place add whose first operand is read again afterwards"
    assert torch.equal(result(x.clone(), y), MethodAlias()(x.clone(), y))


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.add = True  # a plain attribute called "add", as in YOLOv5's Bottleneck

    def forward(self, x):
        y = self.conv(x)
        z = torch.cat([y, x], 1) if self.add else y
        return torch.cat((z, z[:, :4] + y), dim=1)


def test_concat_names_avoid_existing_attributes():
    model = nn.Sequential(nn.Identity(), Concat())
    result, report = insert_functional_quantizers(model)
    assert report.inserted_names == ["1.cat", "1.add_1", "1.cat_1"]
    assert [i.num_inputs for i in report.concats] == [2, 2]
    assert result[1].add is True  # the user's attribute is still there
    cat = result[1].cat
    assert isinstance(cat, QuantConcat) and cat.dim == 1
    x = torch.randn(2, 3, 4, 4)
    with quant.disable_quantization(result):
        assert torch.equal(result(x), Concat.forward(model[1], x))


class DataDependent(nn.Module):
    """Python control flow on a tensor value: fx cannot trace this forward."""

    def __init__(self):
        super().__init__()
        self.inner = Residual()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        if x.sum() > 0:
            x = x + self.conv(x)
        return self.inner(x)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return x + self.conv(x)


def test_untraceable_module_is_reported_and_its_children_are_still_converted():
    model = DataDependent()
    x = torch.rand(2, 4, 5, 5)
    reference = model(x)
    quant.replace_to_quantization_module(model)
    result, report = insert_functional_quantizers(model)
    assert result is model
    assert [(f.name, f.type_name) for f in report.failures] == [("", "DataDependent")]
    assert "TraceError" in report.failures[0].reason or "bool" in report.failures[0].reason
    assert report.inserted_names == ["inner.add"]
    assert not report.complete
    assert "could not be traced" in report.summary()
    assert isinstance(model.conv, quant.QuantConv2d)  # module-level quantization is unaffected
    with quant.disable_quantization(model):
        assert torch.equal(model(x), reference)


def test_ignore_policy_and_switches():
    model = small_resnet()
    _, report = insert_functional_quantizers(model, ignore_policy=r"layer2\.")
    assert report.inserted_names == ["layer1.0.add"]
    assert report.skipped[0].reason.startswith("ignored by policy")
    _, report = insert_functional_quantizers(Concat(), concat=False)
    assert report.inserted_names == ["add_1"]
    # names are positional: ignoring one add does not rename the next
    _, report = insert_functional_quantizers(Branches(), ignore_policy="add_1")
    assert report.inserted_names == ["add", "add_2", "add_3", "add_4"]


def test_running_twice_adds_nothing():
    model = small_resnet()
    model, first = insert_functional_quantizers(model)
    model, second = insert_functional_quantizers(model)
    assert len(first.inserted) == 2 and second.inserted == []


def test_calibrated_state_dict_round_trip():
    model = small_resnet()
    quant.replace_to_quantization_module(model)
    model, _ = insert_functional_quantizers(model)
    x = torch.randn(2, 3, 32, 32)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    state = model.state_dict()
    assert "layer1.0.add._input0_quantizer._amax" in state

    fresh = small_resnet()
    quant.replace_to_quantization_module(fresh)
    fresh, _ = insert_functional_quantizers(fresh)
    fresh.load_state_dict(state)
    assert torch.equal(fresh(x), model(x))


def test_non_tensor_add_targets_are_recognised():
    from workbench.graph.trace import ADD_FUNCTIONS

    assert ADD_FUNCTIONS[operator.iadd] is True and ADD_FUNCTIONS[operator.add] is False


def test_bad_argument():
    with pytest.raises(TypeError):
        insert_functional_quantizers("model")
