"""BatchNorm folding: pairs found in the traced graph, outputs kept, weight amax on the folded weights."""
import pytest
import torch
from torch import nn

from workbench.graph import describe_model, fold_batchnorm
from workbench.graph.fold import folded_weights
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.demo import load_digits_cnn, load_digits_split
from workbench.sources.model_source import ModelSpec


def randomize_bn(model, seed=1):
    """Statistics and affine parameters far from the identity, so that a wrong fold shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                module.running_mean.uniform_(-1, 1, generator=generator)
                module.running_var.uniform_(0.2, 3.0, generator=generator)
                if module.weight is not None:
                    module.weight.uniform_(-1.5, 1.5, generator=generator)
                    module.bias.uniform_(-0.5, 0.5, generator=generator)
    return model.eval()


def relative_error(reference, output):
    reference, output = reference.detach(), output.detach()
    return float((reference - output).abs().max() / reference.abs().max())


class Functional(nn.Module):
    """Pairs called in forward, not Sequential neighbours; every foldable layer kind."""

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 6, 3, padding=1)
        self.bn1d = nn.BatchNorm1d(6)
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8, affine=False)
        self.deconv = nn.ConvTranspose2d(8, 12, 2, stride=2, groups=4)  # grouped: output channels interleave
        self.bn_deconv = nn.BatchNorm2d(12)
        self.conv3d = nn.Conv3d(1, 4, 3, padding=1)
        self.bn3d = nn.BatchNorm3d(4)
        self.linear = nn.Linear(12, 5)
        self.bn_linear = nn.BatchNorm1d(5)

    def forward(self, x):
        a = torch.relu(self.bn1d(self.conv1d(x.mean(-1))))
        b = self.bn_deconv(self.deconv(torch.relu(self.bn(self.conv(x)))))
        c = self.bn3d(self.conv3d(x[:, :1].unsqueeze(2).repeat(1, 1, 3, 1, 1)))
        return self.bn_linear(self.linear(b.mean((2, 3)))) + a.mean() + c.mean()


def test_every_layer_kind_folds_and_keeps_the_outputs():
    model = randomize_bn(Functional())
    x = torch.randn(4, 3, 6, 6)
    reference = model(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded, report = fold_batchnorm(model, example_inputs=(x,))
    assert {(p.layer, p.bn) for p in report.folded} == {
        ("conv1d", "bn1d"), ("conv", "bn"), ("deconv", "bn_deconv"), ("conv3d", "bn3d"), ("linear", "bn_linear")}
    assert report.skipped == [] and report.max_relative_error < 1e-6
    assert relative_error(reference, folded(x)) < 1e-5
    # names stay: the BatchNorms are Identities under their old names; the original is untouched
    assert all(isinstance(getattr(folded, name), nn.Identity) for name in ("bn1d", "bn", "bn_deconv", "bn3d"))
    assert isinstance(model.bn, nn.BatchNorm2d)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert folded.conv.bias is not None and model.conv.bias is None


def test_checking_on_an_example_leaves_each_module_in_its_own_mode():
    model = randomize_bn(Functional())
    model.train()
    model.linear.eval()  # a frozen layer stays frozen, the rest stays in training
    folded, report = fold_batchnorm(model, inplace=True, example_inputs=(torch.randn(4, 3, 6, 6),))
    assert report.max_relative_error is not None and report.max_relative_error < 1e-6  # ran in eval mode
    assert folded.training and folded.conv.training and not folded.linear.training
    assert folded.bn.training  # the Identity replacing a training-mode BatchNorm keeps its mode


def test_inplace_folding_gives_new_tensors_and_keeps_the_old_ones():
    model = randomize_bn(load_digits_cnn())
    shared_weight = model.block.conv1.weight
    original = shared_weight.detach().clone()
    folded, report = fold_batchnorm(model, inplace=True)
    assert folded is model and len(report.folded) == 4
    assert model.block.conv1.weight is not shared_weight  # a model sharing the old tensor keeps its values
    assert torch.equal(shared_weight, original)


def test_the_demo_model_folds_with_its_relus_kept():
    model = load_digits_cnn()
    x = load_digits_split("test").images[:128]
    folded, report = fold_batchnorm(model, example_inputs=(x,))
    assert [(p.layer, p.bn, p.activation) for p in report.folded] == [
        ("stem.0", "stem.1", "stem.2"), ("block.conv1", "block.bn1", "block.relu"), ("block.conv2", "block.bn2", None),
        ("expand.0", "expand.1", "expand.2")]
    assert isinstance(folded.stem[2], nn.ReLU)  # kept as it is: TensorRT fuses conv + bias + ReLU itself
    assert relative_error(model(x), folded(x)) < 1e-5
    assert report.summary().startswith("folded 4 BatchNorms")


class TwoReaders(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.bn2 = nn.BatchNorm2d(4)
        self.bn_input = nn.BatchNorm2d(3)
        self.shared_bn = nn.BatchNorm2d(4)
        self.conv3 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        c = self.conv(self.bn_input(x))          # a BatchNorm on the model input: nothing to fold into
        y = self.bn(c) + c                       # the conv output has a second reader
        z = self.bn2(torch.relu(self.conv2(y)))  # fed by a ReLU, not by the conv
        return self.shared_bn(self.conv3(z)) + self.shared_bn(z)  # one BatchNorm called twice


def test_batchnorms_that_cannot_fold_are_left_with_reasons():
    model = randomize_bn(TwoReaders())
    x = torch.randn(2, 3, 5, 5)
    folded, report = fold_batchnorm(model, example_inputs=(x,))
    assert report.folded == []
    reasons = {s.bn: s.reason for s in report.skipped}
    assert "also read by" in reasons["bn"] and "conv" in reasons["bn"]
    assert "fed by the model input" in reasons["bn_input"]
    assert "relu" in reasons["bn2"] and "not by a" in reasons["bn2"]
    assert "more than once" in reasons["shared_bn"]
    assert isinstance(folded.bn, nn.BatchNorm2d)
    assert torch.equal(model(x), folded(x))


def test_linear_batchnorm_on_sequences_is_not_folded():
    model = randomize_bn(nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5)))
    flat, report = fold_batchnorm(model, example_inputs=(torch.randn(3, 6),))
    assert [p.bn for p in report.folded] == ["1"]
    sequence = randomize_bn(nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(4)))  # BN over dim 1 of (N, 4, 5)
    x = torch.randn(3, 4, 6)
    folded, report = fold_batchnorm(sequence, example_inputs=(x,))
    assert report.folded == [] and "5 output channels, the BatchNorm 4" in report.skipped[0].reason
    assert torch.equal(sequence(x), folded(x))


def test_skip_and_untraceable_owner():
    class Dynamic(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 1)
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: not traceable
                return self.bn(self.conv(x))
            return x

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.dynamic = Dynamic()
            self.tail = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2))

        def forward(self, x):
            return self.tail(self.dynamic(x))

    model = randomize_bn(Outer())
    folded, report = fold_batchnorm(model, skip=["tail.1"])
    reasons = {s.bn: s.reason for s in report.skipped}
    assert reasons["tail.1"] == "left alone on request"
    assert "dynamic could not be traced" in reasons["dynamic.bn"]
    assert report.folded == []
    folded, report = fold_batchnorm(model)
    assert [p.bn for p in report.folded] == ["tail.1"] and [s.bn for s in report.skipped] == ["dynamic.bn"]
    normed = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv2d(2, 3, 1)), nn.BatchNorm2d(3)).eval()
    assert "the weight of 0 is computed" in fold_batchnorm(normed)[1].skipped[0].reason


def test_folded_weights_scale_each_output_channel():
    conv = nn.Conv2d(2, 3, 1, bias=False)
    bn = randomize_bn(nn.BatchNorm2d(3))
    weight, bias = folded_weights(conv, bn)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    assert torch.allclose(weight, conv.weight * scale.view(-1, 1, 1, 1), rtol=1e-6)
    assert torch.allclose(bias, bn.bias - bn.running_mean * scale, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def calibrated_pair():
    """The demo calibrated with and without folding."""
    sessions = {}
    for fold in (True, False):
        session = Session.create(ModelSpec("demo", "digits"),
                                 DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2),
                                 settings={"fold_bn": fold})
        session.calibrate(method="max")
        sessions[fold] = session
    return sessions


def test_weight_amax_is_the_folded_weights_per_channel_max(calibrated_pair):
    folded, plain = calibrated_pair[True], calibrated_pair[False]
    for layer, bn in (("block.conv1", "block.bn1"), ("expand.0", "expand.1")):
        conv = folded.float_model.get_submodule(layer)
        norm = folded.float_model.get_submodule(bn)
        expected = folded_weights(conv, norm)[0].abs().amax((1, 2, 3))
        amax = folded.quantized_model().get_submodule(layer)._weight_quantizer._amax.flatten()
        plain_amax = plain.quantized_model().get_submodule(layer)._weight_quantizer._amax.flatten()
        assert torch.allclose(amax, expected, rtol=1e-6)
        scale = (norm.weight / torch.sqrt(norm.running_var + norm.eps)).abs().detach()
        assert torch.allclose(amax, plain_amax * scale, rtol=1e-5)  # BN's per-channel scale moved into amax
    fc = folded.quantized_model().fc._weight_quantizer._amax  # nothing folded into the fc: same amax
    assert torch.equal(fc, plain.quantized_model().fc._weight_quantizer._amax)


def test_session_folds_a_copy_and_shows_the_merge(calibrated_pair):
    session = calibrated_pair[True]
    assert isinstance(session.float_model.block.bn1, nn.BatchNorm2d)  # the user's model is as it was
    model = session.quantized_model()
    assert isinstance(model.block.bn1, nn.Identity)
    assert model.block.conv1.weight.data_ptr() != session.float_model.block.conv1.weight.data_ptr()
    assert model.fc.weight is session.float_model.fc.weight  # unfolded layers still share
    tree = describe_model(model)
    assert tree["block.conv1"].notes == ("folded bn1",) and tree["stem.0"].notes == ("folded stem.1",)
    assert tree["block.bn1"].notes == ("folded into block.conv1",)
    views = {layer.name: layer for layer in session.layers()}
    assert views["block.conv1"].notes == ["folded bn1"] and views["fc"].notes == []
    # the residual rule still sees conv (+ folded BN) + identity: same quantizers on as without folding
    plain = calibrated_pair[False].quantized_model()
    assert [q._disabled for q in (model.block.add._input0_quantizer, model.block.add._input1_quantizer)] == \
        [q._disabled for q in (plain.block.add._input0_quantizer, plain.block.add._input1_quantizer)]
    x = load_digits_split("test").images[:64]
    with torch.no_grad():
        for q in [m for m in model.modules() if hasattr(m, "_disabled")]:
            q._disabled = True
        try:
            assert relative_error(session.float_model(x), model(x)) < 1e-5
        finally:
            session._quant_model = None  # rebuilt with its quantizers on for the other tests


def test_switching_folding_makes_weight_amax_stale(calibrated_pair, tmp_path):
    session = calibrated_pair[True]
    path = session.save(tmp_path / "folded.qwb")
    reopened = Session.open(path)
    assert reopened.project.settings["fold_bn"] is True and reopened.build_report.stale == []
    assert reopened.folded_layers() == {"stem.0": "stem.1", "block.conv1": "block.bn1", "block.conv2": "block.bn2",
                                        "expand.0": "expand.1"}
    reopened.set_setting("fold_bn", False)
    reopened.quantized_model()
    assert sorted(reopened.build_report.stale) == ["block.conv1._weight_quantizer", "block.conv2._weight_quantizer",
                                                   "expand.0._weight_quantizer", "stem.0._weight_quantizer"]
    assert reopened.folded_layers() == {}


class FrozenBatchNorm2d(nn.Module):
    """torchvision.ops.FrozenBatchNorm2d as it is written: fixed statistics in buffers, its own eps."""

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x):
        scale = self.weight.reshape(1, -1, 1, 1) * (self.running_var.reshape(1, -1, 1, 1) + self.eps).rsqrt()
        bias = self.bias.reshape(1, -1, 1, 1) - self.running_mean.reshape(1, -1, 1, 1) * scale
        return x * scale + bias


def _randomised(bn):
    torch.manual_seed(1)
    for name in ("weight", "bias", "running_mean"):
        getattr(bn, name).copy_(torch.randn_like(getattr(bn, name)))
    bn.running_var.copy_(torch.rand_like(bn.running_var) + 0.5)
    return bn


def test_frozen_batchnorms_fold_into_the_conv_before_them():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _randomised(FrozenBatchNorm2d(4, eps=1e-3)), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    folded, report = fold_batchnorm(model, example_inputs=(x,))
    assert [(p.layer, p.bn) for p in report.folded] == [("0", "1")] and not report.skipped
    assert isinstance(folded[1], nn.Identity)
    torch.testing.assert_close(folded(x), expected, rtol=1e-5, atol=1e-5)


def test_hugging_face_detr_frozen_batchnorm_folds_with_its_fixed_epsilon():
    detr = pytest.importorskip("transformers.models.detr.modeling_detr")
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), _randomised(detr.DetrFrozenBatchNorm2d(4))).eval()
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    folded, report = fold_batchnorm(model, example_inputs=(x,))
    assert len(report.folded) == 1 and not report.skipped
    torch.testing.assert_close(folded(x), expected, rtol=1e-5, atol=1e-5)


def test_a_frozen_batchnorm_that_cannot_fold_is_listed_with_its_reason():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = _randomised(FrozenBatchNorm2d(4))

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y  # the conv's output is read twice: folding would change the second reader

    _, report = fold_batchnorm(Shared().eval())
    assert [(s.bn, s.reason) for s in report.skipped] == [("bn", "the output of conv is also read by add")]
