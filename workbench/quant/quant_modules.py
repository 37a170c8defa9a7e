"""The seed-style workflow: swap ``torch.nn`` classes for quantized ones while a model is built.

``initialize()`` replaces ``torch.nn.Conv2d`` and friends in the ``torch.nn`` namespace (not the
user's classes) so that models constructed afterwards contain quantized modules; ``deactivate()``
puts the originals back. :func:`workbench.quant.replace_to_quantization_module` is the alternative
that converts an existing model in place without touching any namespace.
"""
from __future__ import annotations

from collections import namedtuple
from contextlib import contextmanager

import torch

import workbench.quant.nn as quant_nn

__all__ = ["initialize", "deactivate", "enable_onnx_export", "QuantModuleReplacementHelper"]

_quant_entry = namedtuple("quant_entry", "orig_mod mod_name replace_mod")

_DEFAULT_QUANT_MAP = [
    _quant_entry(torch.nn, "Conv1d", quant_nn.QuantConv1d),
    _quant_entry(torch.nn, "Conv2d", quant_nn.QuantConv2d),
    _quant_entry(torch.nn, "Conv3d", quant_nn.QuantConv3d),
    _quant_entry(torch.nn, "ConvTranspose1d", quant_nn.QuantConvTranspose1d),
    _quant_entry(torch.nn, "ConvTranspose2d", quant_nn.QuantConvTranspose2d),
    _quant_entry(torch.nn, "ConvTranspose3d", quant_nn.QuantConvTranspose3d),
    _quant_entry(torch.nn, "Linear", quant_nn.QuantLinear),
    _quant_entry(torch.nn, "LSTM", quant_nn.QuantLSTM),
    _quant_entry(torch.nn, "LSTMCell", quant_nn.QuantLSTMCell),
    _quant_entry(torch.nn, "AvgPool1d", quant_nn.QuantAvgPool1d),
    _quant_entry(torch.nn, "AvgPool2d", quant_nn.QuantAvgPool2d),
    _quant_entry(torch.nn, "AvgPool3d", quant_nn.QuantAvgPool3d),
    _quant_entry(torch.nn, "AdaptiveAvgPool1d", quant_nn.QuantAdaptiveAvgPool1d),
    _quant_entry(torch.nn, "AdaptiveAvgPool2d", quant_nn.QuantAdaptiveAvgPool2d),
    _quant_entry(torch.nn, "AdaptiveAvgPool3d", quant_nn.QuantAdaptiveAvgPool3d),
    _quant_entry(torch.nn, "MultiheadAttention", quant_nn.QuantMultiheadAttention),
    _quant_entry(torch.nn, "TransformerEncoderLayer", quant_nn.QuantTransformerEncoderLayer),
    _quant_entry(torch.nn, "TransformerEncoder", quant_nn.QuantTransformerEncoder),
]

# The float classes, captured at import so that initialize() cannot make us lose them.
FLOAT_CLASSES = {entry.mod_name: getattr(entry.orig_mod, entry.mod_name) for entry in _DEFAULT_QUANT_MAP}


class QuantModuleReplacementHelper:
    """Keeps what :func:`initialize` replaced so that :func:`deactivate` can restore it."""

    def __init__(self) -> None:
        self.orginal_func_map: set = set()  # (sic) the original's attribute name, kept for scripts
        self.default_quant_map = _DEFAULT_QUANT_MAP
        self.quant_map: set = set()

    def prepare_state(self, float_module_list=None, custom_map=None) -> None:
        """Decide what to replace: the defaults minus ``float_module_list``, plus ``custom_map`` entries."""
        skip = set(float_module_list or [])
        known = {entry.mod_name for entry in self.default_quant_map}
        unknown = skip - known
        if unknown:
            raise ValueError(f"float_module_list names modules that are not replaced anyway: {sorted(unknown)}. "
                             f"Known: {sorted(known)}.")
        for entry in self.default_quant_map:
            if entry.mod_name in skip:
                continue
            self.quant_map.add(entry)
            self.orginal_func_map.add(_quant_entry(entry.orig_mod, entry.mod_name, FLOAT_CLASSES[entry.mod_name]))
        for item in custom_map or []:
            if len(item) != 3:
                raise ValueError(f"custom_quant_modules entries are (module, name, quantized class), got {item!r}.")
            entry = _quant_entry(*item)
            self.quant_map.add(entry)
            self.orginal_func_map.add(_quant_entry(entry.orig_mod, entry.mod_name,
                                                   getattr(entry.orig_mod, entry.mod_name)))

    def apply_quant_modules(self) -> None:
        for entry in self.quant_map:
            setattr(entry.orig_mod, entry.mod_name, entry.replace_mod)

    def restore_float_modules(self) -> None:
        for entry in self.orginal_func_map:
            setattr(entry.orig_mod, entry.mod_name, entry.replace_mod)
        self.quant_map.clear()
        self.orginal_func_map.clear()


_quant_module_helper_object = QuantModuleReplacementHelper()


def initialize(float_module_list=None, custom_quant_modules=None) -> None:
    """Replace ``torch.nn`` layer classes by quantized ones until :func:`deactivate`.

    Args:
        float_module_list: names of classes to leave alone, e.g. ``["Linear"]``.
        custom_quant_modules: extra ``(module, class_name, quantized_class)`` entries.
    """
    _quant_module_helper_object.prepare_state(float_module_list, custom_quant_modules)
    _quant_module_helper_object.apply_quant_modules()


def deactivate() -> None:
    """Put back the classes :func:`initialize` replaced."""
    _quant_module_helper_object.restore_float_modules()


@contextmanager
def enable_onnx_export():
    """While active, every TensorQuantizer checks it is calibrated before running (for ONNX export)."""
    previous = quant_nn.TensorQuantizer._enable_onnx_export
    quant_nn.TensorQuantizer._enable_onnx_export = True
    try:
        yield
    finally:
        quant_nn.TensorQuantizer._enable_onnx_export = previous
