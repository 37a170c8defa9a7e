"""Quantized LSTM and LSTMCell.

TensorRT runs one fused GEMM per time step, so the quantization follows that: one input quantizer
sees ``cat([x_t, h_{t-1}])`` and one weight quantizer sees ``cat([W_ih, W_hh], dim=1)`` (per row by
default), per layer and direction, exactly as pytorch-quantization does. Parameters keep torch's
names (``weight_ih_l0``, ...) and quantizers are ``_input_quantizers.N`` / ``_weight_quantizers.N``.

While every quantizer is disabled the float module's own (cuDNN/MKL) forward runs, so results equal
the float module's bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import workbench.quant.tensor_quant as tensor_quant
from workbench.quant.nn.modules import _utils
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["QuantLSTM", "QuantLSTMCell", "LSTM", "LSTMCell"]


def _quant_lstm_step(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
                     b_ih: torch.Tensor | None, b_hh: torch.Tensor | None,
                     input_quantizer: TensorQuantizer) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step with the fused input quantized; weights arrive already quantized."""
    x, h = input_quantizer(torch.cat([x, h], 1)).split([x.size(1), h.size(1)], 1)
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, 1)
    c_next = torch.sigmoid(forget_gate) * c + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
    h_next = torch.sigmoid(out_gate) * torch.tanh(c_next)
    return h_next, c_next


def _quantized_weights(w_ih: torch.Tensor, w_hh: torch.Tensor,
                       weight_quantizer: TensorQuantizer) -> tuple[torch.Tensor, torch.Tensor]:
    fused = weight_quantizer(torch.cat([w_ih, w_hh], 1))
    return fused.split([w_ih.size(1), w_hh.size(1)], 1)


def _all_disabled(quantizers) -> bool:
    return all(not q.is_enabled for q in quantizers)


class QuantLSTM(_utils.QuantMixin, nn.LSTM):
    """Quantized multi-layer LSTM (same arguments as :class:`torch.nn.LSTM`, without ``proj_size``)."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    _float_module = nn.LSTM

    def __init__(self, *args, **kwargs) -> None:
        # checked before anything is built: nn.LSTM would allocate the projection weights (or raise its
        # own error about proj_size) first. proj_size is nn.LSTM's 8th positional argument.
        proj_size = kwargs.get("proj_size", args[7] if len(args) > 7 else 0)
        if proj_size:
            raise ValueError(f"QuantLSTM does not support proj_size > 0 (LSTM with projections), got "
                             f"proj_size={proj_size!r}.")
        quant_kwargs = {key: kwargs.pop(key) for key in ("quant_desc_input", "quant_desc_weight") if key in kwargs}
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(self.__class__, **quant_kwargs)
        super().__init__(*args, **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight,
                            num_layers=self.num_layers * (2 if self.bidirectional else 1))

    def forward(self, input, hx=None):
        if _all_disabled(self._input_quantizers) and _all_disabled(self._weight_quantizers):
            return super().forward(input, hx)
        if self.proj_size:
            raise ValueError("QuantLSTM does not support proj_size > 0 (LSTM with projections).")

        packed = isinstance(input, PackedSequence)
        if packed:
            padded, lengths = pad_packed_sequence(input, batch_first=False)
            x = padded
        else:
            lengths = None
            unbatched = input.dim() == 2
            x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        steps, batch = x.size(0), x.size(1)
        directions = 2 if self.bidirectional else 1

        if hx is None:
            zeros = x.new_zeros(self.num_layers * directions, batch, self.hidden_size)
            h0, c0 = zeros, zeros
        else:
            h0, c0 = hx
            if not packed and input.dim() == 2:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        self._check_hidden(h0, c0, batch, directions)

        if lengths is not None:
            # mask[t, b] is True while sequence b is still running at step t
            mask = torch.arange(steps).unsqueeze(1) < lengths.unsqueeze(0)
            mask = mask.to(x.device).unsqueeze(2)
        else:
            mask = None

        layer_input = x
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            direction_outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                suffix = "_reverse" if direction == 1 else ""
                w_ih = getattr(self, f"weight_ih_l{layer}{suffix}")
                w_hh = getattr(self, f"weight_hh_l{layer}{suffix}")
                b_ih = getattr(self, f"bias_ih_l{layer}{suffix}") if self.bias else None
                b_hh = getattr(self, f"bias_hh_l{layer}{suffix}") if self.bias else None
                w_ih, w_hh = _quantized_weights(w_ih, w_hh, self._weight_quantizers[index])
                h, c = h0[index], c0[index]
                outputs: list[torch.Tensor | None] = [None] * steps
                order = range(steps - 1, -1, -1) if direction == 1 else range(steps)
                for t in order:
                    h_new, c_new = _quant_lstm_step(layer_input[t], h, c, w_ih, w_hh, b_ih, b_hh,
                                                    self._input_quantizers[index])
                    if mask is not None:
                        running = mask[t]
                        h = torch.where(running, h_new, h)
                        c = torch.where(running, c_new, c)
                        outputs[t] = torch.where(running, h_new, torch.zeros_like(h_new))
                    else:
                        h, c = h_new, c_new
                        outputs[t] = h_new
                direction_outputs.append(torch.stack(outputs, 0))
                h_n.append(h)
                c_n.append(c)
            layer_input = torch.cat(direction_outputs, 2) if directions == 2 else direction_outputs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, p=self.dropout, training=True)

        h_n_t, c_n_t = torch.stack(h_n, 0), torch.stack(c_n, 0)
        output = layer_input
        if packed:
            return pack_padded_sequence(output, lengths, enforce_sorted=False), (h_n_t, c_n_t)
        if input.dim() == 2:
            return output.squeeze(1), (h_n_t.squeeze(1), c_n_t.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (h_n_t, c_n_t)

    def _check_hidden(self, h0: torch.Tensor, c0: torch.Tensor, batch: int, directions: int) -> None:
        expected = (self.num_layers * directions, batch, self.hidden_size)
        for name, tensor in (("h_0", h0), ("c_0", c0)):
            if tuple(tensor.shape) != expected:
                raise RuntimeError(f"Expected {name} of size {expected}, got {tuple(tensor.shape)}.")


class QuantLSTMCell(_utils.QuantMixin, nn.LSTMCell):
    """Quantized LSTM cell (same arguments as :class:`torch.nn.LSTMCell`)."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    _float_module = nn.LSTMCell

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs) -> None:
        factory, kwargs = _utils.split_factory_kwargs(kwargs)
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(self.__class__, **kwargs)
        super().__init__(input_size, hidden_size, bias, **factory)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        if not self._input_quantizer.is_enabled and not self._weight_quantizer.is_enabled:
            return super().forward(input, hx)
        unbatched = input.dim() == 1
        x = input.unsqueeze(0) if unbatched else input
        if x.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {x.size(1)}, expected {self.input_size}")
        if hx is None:
            zeros = x.new_zeros(x.size(0), self.hidden_size)
            h, c = zeros, zeros
        else:
            h, c = (hx[0].unsqueeze(0), hx[1].unsqueeze(0)) if unbatched else hx
        for name, tensor in (("hx[0]", h), ("hx[1]", c)):
            if tensor.size(0) != x.size(0) or tensor.size(1) != self.hidden_size:
                raise RuntimeError(f"{name} has size {tuple(tensor.shape)}, "
                                   f"expected ({x.size(0)}, {self.hidden_size}).")
        w_ih, w_hh = _quantized_weights(self.weight_ih, self.weight_hh, self._weight_quantizer)
        h_next, c_next = _quant_lstm_step(x, h, c, w_ih, w_hh, self.bias_ih, self.bias_hh, self._input_quantizer)
        if unbatched:
            return h_next.squeeze(0), c_next.squeeze(0)
        return h_next, c_next


LSTM = QuantLSTM
LSTMCell = QuantLSTMCell
