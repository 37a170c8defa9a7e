"""TensorRT placement rules: concat / maxpool scale sharing, residual fusion, pins; sharing that lasts."""
import pytest
import torch
from torch import nn

from workbench import quant
from workbench.graph import PlacementRules, apply_placement_rules, insert_functional_quantizers
from workbench.quant import QuantDescriptor
from workbench.quant.algorithms.calibrate import calibrate
from workbench.sources.demo import ResNetLike


class ConvBNAct(nn.Module):
    def __init__(self, c1, c2, k=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, 1, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class CSP(nn.Module):
    """Two branches concatenated, then a conv; the input also feeds a third conv directly."""

    def __init__(self):
        super().__init__()
        self.cv1 = ConvBNAct(4, 4)
        self.cv2 = ConvBNAct(4, 4)
        self.cv3 = ConvBNAct(8, 8)
        self.side = nn.Conv2d(4, 8, 1)

    def forward(self, x):
        a = self.cv1(x)
        b = self.cv2(x)
        return self.cv3(torch.cat([a, b], 1)) + self.side(a)


class SPPF(nn.Module):
    def __init__(self):
        super().__init__()
        self.cv1 = ConvBNAct(4, 4)
        self.m = nn.MaxPool2d(5, 1, 2)
        self.cv2 = ConvBNAct(16, 4)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat([x, y1, y2, self.m(y2)], 1))


def prepared(model, rules=None):
    quant.replace_to_quantization_module(model)
    model, _ = insert_functional_quantizers(model)
    return model, apply_placement_rules(model, rules)


def small_resnet():
    torch.manual_seed(0)
    return ResNetLike((1, 1), width=8, num_classes=10).eval()


def test_resnet_residual_and_maxpool_rules():
    model, report = prepared(small_resnet())
    residual = report.by_rule("residual")
    assert [(a.anchor, a.disabled, a.kept) for a in residual] == [
        ("layer1.0.add", ("layer1.0.add._input0_quantizer",), ("layer1.0.add._input1_quantizer",)),
        # both operands come from conv+bn here: the later convolution (conv2) takes the add
        ("layer2.0.add", ("layer2.0.add._input0_quantizer",), ("layer2.0.add._input1_quantizer",)),
    ]
    assert "layer2.0.conv2" in residual[1].note
    assert model.layer1[0].add._input0_quantizer._disabled and not model.layer1[0].add._input1_quantizer._disabled
    # the stem's MaxPool output feeds layer1.0.conv1 and the identity branch of layer1.0.add
    assert report.pairs == [("layer1.0.conv1._input_quantizer", "layer1.0.add._input1_quantizer")]
    assert model.layer1[0].add._input1_quantizer is model.layer1[0].conv1._input_quantizer
    assert report.by_rule("maxpool")[0].anchor == "maxpool"


def test_concat_rule_shares_with_readers_of_inputs_and_output():
    model, report = prepared(CSP())
    assert [(g.major, g.members) for g in report.groups] == [
        ("cat._input_quantizer", ("cat._input_quantizer", "side._input_quantizer", "cv3.conv._input_quantizer"))]
    assert model.cv3.conv._input_quantizer is model.cat._input_quantizer is model.side._input_quantizer
    assert report.groups[0].rules == ("concat",)


def test_spp_maxpools_and_concat_end_in_one_group():
    model, report = prepared(SPPF())
    assert [g.members for g in report.groups] == [("cat._input_quantizer", "cv2.conv._input_quantizer")]


def test_each_rule_can_be_switched_off():
    _, report = prepared(small_resnet(), PlacementRules(residual=False, maxpool=False))
    assert report.applications == [] and report.groups == []
    model, report = prepared(CSP(), PlacementRules(concat=False))
    assert report.groups == [] and model.cv3.conv._input_quantizer is not model.cat._input_quantizer


def test_pins_by_quantizer_or_layer_name():
    model = small_resnet()
    rules = PlacementRules(concat=False, maxpool=False, residual=False,
                           pins=[("layer1.0.conv2._input_quantizer", "layer2.0.conv1"), ("fc", "layer2.0.add")])
    model, report = prepared(model, rules)
    assert model.layer2[0].conv1._input_quantizer is model.layer1[0].conv2._input_quantizer
    assert model.layer2[0].add._input0_quantizer is model.fc._input_quantizer
    assert model.layer2[0].add._input1_quantizer is model.fc._input_quantizer
    assert [a.rule for a in report.applications] == ["pin", "pin"]
    assert len(report.groups) == 2

    with pytest.raises(ValueError, match="neither a quantizer nor a layer"):
        apply_placement_rules(model, PlacementRules(pins=[("fc", "nope.conv")]))
    with pytest.raises(ValueError, match="without an input quantizer"):
        apply_placement_rules(model, PlacementRules(pins=[("fc", "layer1.0.bn1")]))


def test_sharing_survives_calibration_and_covers_every_member():
    torch.manual_seed(0)
    model, report = prepared(CSP())
    x = torch.randn(4, 4, 6, 6)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    shared = model.cat._input_quantizer
    # one quantizer saw the concat's inputs and the side conv's input: its amax covers all of them
    model.eval()
    with torch.no_grad(), quant.disable_quantization(model):
        a, b = model.cv1(x), model.cv2(x)
    assert torch.allclose(shared.amax, torch.cat([a, b], 1).abs().max())
    assert model.cv3.conv._input_quantizer.amax is shared.amax


def test_rule_after_calibration_takes_the_largest_amax():
    torch.manual_seed(0)
    model = CSP()
    quant.replace_to_quantization_module(model)
    model, _ = insert_functional_quantizers(model)
    calibrate(model, [torch.randn(4, 4, 6, 6)], num_batches=1, method="max", report_sqnr=False)
    amaxes = [float(model.cat._input_quantizer.amax), float(model.side._input_quantizer.amax),
              float(model.cv3.conv._input_quantizer.amax)]
    report = apply_placement_rules(model)
    assert report.groups[0].amax == pytest.approx(max(amaxes))
    assert float(model.cv3.conv._input_quantizer.amax) == pytest.approx(max(amaxes))


def test_state_dict_round_trip_keeps_sharing_and_values():
    torch.manual_seed(0)
    model, _ = prepared(CSP())
    x = torch.randn(2, 4, 6, 6)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    state = model.state_dict()
    assert torch.equal(state["cat._input_quantizer._amax"], state["cv3.conv._input_quantizer._amax"])

    fresh, _ = prepared(CSP())
    fresh.load_state_dict(state)
    assert fresh.cv3.conv._input_quantizer is fresh.cat._input_quantizer
    assert torch.equal(fresh(x), model(x))

    plain = CSP()  # without the rules: separate quantizers, but the same amax values
    quant.replace_to_quantization_module(plain)
    plain, _ = insert_functional_quantizers(plain)
    plain.load_state_dict(state)
    assert plain.cv3.conv._input_quantizer is not plain.cat._input_quantizer
    assert torch.equal(plain.cv3.conv._input_quantizer.amax, plain.cat._input_quantizer.amax)


def test_incompatible_quantizers_are_reported_not_shared():
    model = CSP()
    quant.replace_to_quantization_module(model)
    model, _ = insert_functional_quantizers(model)
    model.side._input_quantizer = quant.TensorQuantizer(QuantDescriptor(unsigned=True))
    report = apply_placement_rules(model)
    assert report.groups == []
    assert "signedness" in report.conflicts[0] and "side._input_quantizer" in report.conflicts[0]
    assert model.side._input_quantizer is not model.cat._input_quantizer


def test_rules_see_past_an_untraceable_root():
    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = CSP()

        def forward(self, x):
            if x.mean() > 10:
                return x
            return self.body(x)

    model, report = prepared(Root())
    assert [f.name for f in report.failures] == [""]
    assert report.pieces == ["body"]
    assert report.groups[0].major == "body.cat._input_quantizer"
    assert "could not be traced" in report.summary()


def test_prepare_for_tensorrt_in_one_call():
    from workbench.graph import prepare_for_tensorrt

    model, report = prepare_for_tensorrt(small_resnet(), ignore_policy=["fc", r"layer2\.0\.add"])
    assert "fc" in report.replacement.ignored_names
    assert report.functional.inserted_names == ["layer1.0.add"]
    assert report.rules.disabled == ["layer1.0.add._input0_quantizer"]
    assert report.warnings == [] and "layers quantized" in report.summary()

    _, report = prepare_for_tensorrt(nn.Sequential(nn.ReLU(), nn.Tanh()))
    assert report.warnings and "nothing was quantized" in report.warnings[0]


class YoloConcat(nn.Module):
    """ultralytics' Concat: ``forward(x)`` concatenates the list its caller builds."""

    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class YoloLike(nn.Module):
    """ultralytics' loop over ``self.model``: each layer reads ``m.f`` (-1: the previous output, or a list of
    earlier outputs built at run time); the guard on the input keeps torch.fx from tracing the whole model,
    so the Concat is traced as its own piece whose input is one placeholder, not a list."""

    def __init__(self):
        super().__init__()
        self.model = nn.ModuleList([nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), YoloConcat(1),
                                    nn.Conv2d(16, 4, 1)])
        for i, (m, f) in enumerate(zip(self.model, (-1, -1, [-1, 0], -1))):
            m.f, m.i = f, i
        self.save = {0}

    def forward(self, x):
        if bool(x.isnan().any()):
            raise ValueError("NaN input")
        y = []
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x


def test_concat_of_a_list_built_by_the_caller_does_not_crash_the_concat_rule():
    """YOLOv8 from its yaml crashed ``new`` with "'Node' object is not iterable" in the Concat rule."""
    model = YoloLike().eval()
    quant.replace_to_quantization_module(model)
    model, functional = insert_functional_quantizers(model, example_inputs=(torch.randn(1, 3, 8, 8),))
    assert [i.name for i in functional.concats] == ["model.2.cat"]
    report = apply_placement_rules(model, runtime=functional)
    assert "model.2" in report.pieces
    # the recorded run sees across the pieces: the conv reading the concatenation shares its scale
    assert model.model[3]._input_quantizer is model.model[2].cat._input_quantizer
    out = model(torch.randn(1, 3, 8, 8))
    assert out.shape == (1, 4, 8, 8)
