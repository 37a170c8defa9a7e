"""Quantized modules: float results when disabled, the expected quantized computation when enabled."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from workbench.quant import nn as quant_nn
from workbench.quant import tensor_quant as tq
from workbench.quant.tensor_quant import QuantDescriptor


def disable_all(module):
    for m in module.modules():
        if isinstance(m, quant_nn.TensorQuantizer):
            m.disable()


# (float module factory, quantized class, input shape)
LAYERS = [
    (lambda: nn.Conv1d(3, 5, 3, padding=1), quant_nn.QuantConv1d, (2, 3, 11)),
    (lambda: nn.Conv2d(3, 6, 3, stride=2, padding=1, groups=3), quant_nn.QuantConv2d, (2, 3, 9, 9)),
    (lambda: nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), quant_nn.QuantConv2d, (1, 4, 6, 6)),
    (lambda: nn.Conv3d(2, 4, 2), quant_nn.QuantConv3d, (1, 2, 5, 5, 5)),
    (lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), quant_nn.QuantConvTranspose1d, (2, 3, 7)),
    (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=1, groups=2), quant_nn.QuantConvTranspose2d,
     (2, 4, 5, 5)),
    (lambda: nn.ConvTranspose3d(2, 3, 2, stride=2), quant_nn.QuantConvTranspose3d, (1, 2, 3, 3, 3)),
    (lambda: nn.Linear(7, 5), quant_nn.QuantLinear, (4, 3, 7)),
    (lambda: nn.MaxPool1d(2), quant_nn.QuantMaxPool1d, (2, 3, 8)),
    (lambda: nn.MaxPool2d(3, stride=2, padding=1), quant_nn.QuantMaxPool2d, (2, 3, 9, 9)),
    (lambda: nn.MaxPool3d(2), quant_nn.QuantMaxPool3d, (1, 2, 4, 4, 4)),
    (lambda: nn.AvgPool1d(2), quant_nn.QuantAvgPool1d, (2, 3, 8)),
    (lambda: nn.AvgPool2d(2, ceil_mode=True), quant_nn.QuantAvgPool2d, (2, 3, 7, 7)),
    (lambda: nn.AvgPool3d(2), quant_nn.QuantAvgPool3d, (1, 2, 4, 4, 4)),
    (lambda: nn.AdaptiveAvgPool1d(3), quant_nn.QuantAdaptiveAvgPool1d, (2, 3, 8)),
    (lambda: nn.AdaptiveAvgPool2d((2, 3)), quant_nn.QuantAdaptiveAvgPool2d, (2, 3, 7, 7)),
    (lambda: nn.AdaptiveAvgPool3d(1), quant_nn.QuantAdaptiveAvgPool3d, (1, 2, 4, 4, 4)),
    (lambda: nn.InstanceNorm2d(3, affine=True), quant_nn.QuantInstanceNorm2d, (2, 3, 5, 5)),
]


@pytest.mark.parametrize("make_float, quant_cls, shape", LAYERS)
def test_disabled_quantization_gives_float_results(make_float, quant_cls, shape):
    float_module = make_float()
    quant_module = quant_cls.from_float(float_module)
    disable_all(quant_module)
    x = torch.randn(shape)
    assert torch.equal(quant_module(x), float_module(x))
    assert isinstance(quant_module, type(float_module))  # code that walks the model still recognises it


WEIGHTLESS = [layer for layer in LAYERS if "Pool" in layer[1].__name__ or "InstanceNorm" in layer[1].__name__]


@pytest.mark.parametrize("make_float, quant_cls, shape", WEIGHTLESS)
def test_weightless_modules_run_the_float_forward_on_the_quantized_input(make_float, quant_cls, shape):
    float_module = make_float()
    quant_module = quant_cls.from_float(float_module)
    x = torch.randn(shape)
    expected = float_module(tq.fake_tensor_quant(x, x.abs().max(), 8, False, False))
    assert torch.equal(quant_module(x), expected)


@pytest.mark.parametrize("quant_cls", [quant_nn.QuantInstanceNorm1d, quant_nn.QuantLinear, quant_nn.QuantConv1d])
def test_device_and_dtype_reach_the_float_module(quant_cls):
    args = (4, 4, 3) if quant_cls is quant_nn.QuantConv1d else (4, 4) if quant_cls is quant_nn.QuantLinear else (4,)
    kwargs = {"affine": True} if quant_cls is quant_nn.QuantInstanceNorm1d else {}
    module = quant_cls(*args, device="cpu", dtype=torch.float64, **kwargs)
    assert module.weight.dtype == torch.float64


@pytest.mark.parametrize("make_float, quant_cls, shape", LAYERS)
def test_from_float_shares_parameters_and_keeps_keys(make_float, quant_cls, shape):
    float_module = make_float()
    quant_module = quant_cls.from_float(float_module)
    for name, param in float_module.named_parameters():
        assert getattr(quant_module, name) is param
    float_keys = set(float_module.state_dict())
    assert float_keys <= set(quant_module.state_dict())


def test_conv2d_quantized_forward_is_conv_of_quantized_tensors():
    conv = quant_nn.QuantConv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    amax_w = conv.weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)
    expected = F.conv2d(tq.fake_tensor_quant(x, x.abs().max(), 8, False, False),
                        tq.fake_tensor_quant(conv.weight, amax_w, 8, False, False), conv.bias, padding=1)
    assert torch.equal(conv(x), expected)


def test_conv_transpose_weight_is_per_output_channel():
    conv = quant_nn.QuantConvTranspose2d(4, 6, 3)
    conv.input_quantizer.disable()
    x = torch.randn(1, 4, 5, 5)
    amax = conv.weight.detach().abs().amax(dim=(0, 2, 3), keepdim=True)  # (1, out, 1, 1)
    expected = F.conv_transpose2d(x, tq.fake_tensor_quant(conv.weight, amax, 8, False, False), conv.bias)
    assert torch.equal(conv(x), expected)
    assert conv.weight_quantizer.axis == 1


def test_linear_quantized_forward():
    weight_amax = [[0.5], [0.6], [0.7], [0.8]]  # one amax per output row, shaped to broadcast
    linear = quant_nn.QuantLinear(6, 4, quant_desc_input=QuantDescriptor(amax=2.0),
                                  quant_desc_weight=QuantDescriptor(axis=0, amax=weight_amax))
    x = torch.randn(3, 6)
    expected = F.linear(tq.fake_tensor_quant(x, torch.tensor(2.0), 8, False, False),
                        tq.fake_tensor_quant(linear.weight, torch.tensor(weight_amax), 8, False, False),
                        linear.bias)
    assert torch.equal(linear(x), expected)


def test_unknown_keyword_is_reported():
    with pytest.raises(TypeError, match="Unused keys"):
        quant_nn.QuantConv2d(3, 3, 1, quant_desc_inptu=QuantDescriptor())


def test_real_quantization_descriptor_is_refused_in_modules():
    with pytest.raises(ValueError, match="Only fake quantization"):
        quant_nn.QuantLinear(3, 3, quant_desc_input=QuantDescriptor(fake_quant=False))


def test_set_default_quant_desc_is_per_class():
    saved = quant_nn.QuantLinear.default_quant_desc_input
    try:
        quant_nn.QuantLinear.set_default_quant_desc_input(QuantDescriptor(calib_method="histogram"))
        assert quant_nn.QuantLinear(2, 2).input_quantizer._calibrator.__class__.__name__ == "HistogramCalibrator"
        assert quant_nn.QuantConv2d(2, 2, 1).input_quantizer._calibrator.__class__.__name__ == "MaxCalibrator"
        with pytest.raises(ValueError, match="QuantDescriptor"):
            quant_nn.QuantLinear.set_default_quant_desc_input("histogram")
    finally:
        quant_nn.QuantLinear.default_quant_desc_input = saved


class TestLSTM:
    def make(self, **kwargs):
        torch.manual_seed(3)
        float_lstm = nn.LSTM(5, 7, **kwargs)
        return float_lstm, quant_nn.QuantLSTM.from_float(float_lstm)

    @pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2}, {"bidirectional": True},
                                        {"batch_first": True, "num_layers": 2, "bidirectional": True}])
    def test_quantizers_disabled_equals_float(self, kwargs):
        float_lstm, quant_lstm = self.make(**kwargs)
        disable_all(quant_lstm)
        x = torch.randn(4, 3, 5)
        out_f, (h_f, c_f) = float_lstm(x)
        out_q, (h_q, c_q) = quant_lstm(x)
        assert torch.equal(out_f, out_q) and torch.equal(h_f, h_q) and torch.equal(c_f, c_q)

    @pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True}, {"batch_first": True}])
    def test_python_loop_matches_float_when_quantization_is_off(self, kwargs):
        """With calibration on and quantization off, the step-by-step loop runs: it must match cuDNN/MKL."""
        float_lstm, quant_lstm = self.make(**kwargs)
        for m in quant_lstm.modules():
            if isinstance(m, quant_nn.TensorQuantizer):
                m.disable_quant()
                m.enable_calib()
        x = torch.randn(4, 3, 5)
        out_f, (h_f, c_f) = float_lstm(x)
        out_q, (h_q, c_q) = quant_lstm(x)
        assert torch.allclose(out_f, out_q, atol=1e-6)
        assert torch.allclose(h_f, h_q, atol=1e-6) and torch.allclose(c_f, c_q, atol=1e-6)
        assert quant_lstm._input_quantizers[0]._calibrator.compute_amax() is not None

    def test_packed_sequences(self):
        float_lstm, quant_lstm = self.make(bidirectional=True)
        for m in quant_lstm.modules():
            if isinstance(m, quant_nn.TensorQuantizer):
                m.disable_quant()
        x = torch.randn(6, 3, 5)
        lengths = torch.tensor([6, 2, 4])
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        out_f, (h_f, _) = float_lstm(packed)
        out_q, (h_q, _) = quant_lstm(packed)
        pad_f, _ = pad_packed_sequence(out_f)
        pad_q, _ = pad_packed_sequence(out_q)
        assert torch.allclose(pad_f, pad_q, atol=1e-6)
        assert torch.allclose(h_f, h_q, atol=1e-6)

    def test_quantized_step_uses_fused_input_and_weight(self):
        cell_float = nn.LSTMCell(4, 3)
        cell = quant_nn.QuantLSTMCell.from_float(cell_float)
        x, h, c = torch.randn(2, 4), torch.randn(2, 3), torch.randn(2, 3)
        fused_in = tq.fake_tensor_quant(torch.cat([x, h], 1), torch.cat([x, h], 1).abs().max(), 8, False, False)
        w = torch.cat([cell.weight_ih, cell.weight_hh], 1)
        fused_w = tq.fake_tensor_quant(w, w.detach().abs().amax(dim=1, keepdim=True), 8, False, False)
        gates = (F.linear(fused_in[:, :4], fused_w[:, :4], cell.bias_ih)
                 + F.linear(fused_in[:, 4:], fused_w[:, 4:], cell.bias_hh))
        i, f, g, o = gates.chunk(4, 1)
        c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_next = torch.sigmoid(o) * torch.tanh(c_next)
        h_q, c_q = cell(x, (h, c))
        assert torch.equal(h_q, h_next) and torch.equal(c_q, c_next)

    def test_state_dict_keys(self):
        _, quant_lstm = self.make(num_layers=2)
        keys = set(quant_lstm.state_dict())
        assert {"weight_ih_l0", "weight_hh_l1", "bias_ih_l0"} <= keys
        assert len(quant_lstm._input_quantizers) == 2

    def test_proj_size_is_refused(self):
        with pytest.raises(ValueError, match="proj_size"):
            quant_nn.QuantLSTM(4, 6, proj_size=2)

    def test_proj_size_is_refused_before_nn_lstm_checks_it(self):
        # nn.LSTM's own complaint (proj_size must be smaller than hidden_size) would come first otherwise
        with pytest.raises(ValueError, match=r"QuantLSTM does not support proj_size > 0.*proj_size=8"):
            quant_nn.QuantLSTM(4, 6, proj_size=8)
        with pytest.raises(ValueError, match=r"QuantLSTM does not support proj_size > 0.*proj_size=2"):
            quant_nn.QuantLSTM(4, 6, 1, True, False, 0.0, False, 2)
