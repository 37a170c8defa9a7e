"""Turn the quantizers of a model (or part of it) on and off, as the reference scripts do."""
from __future__ import annotations

from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["enable_quantization", "disable_quantization", "quantizer_state", "QuantizerState"]

# name -> (disabled, if_quant, if_calib)
QuantizerState = dict[str, tuple[bool, bool, bool]]


def quantizer_state(model: nn.Module) -> QuantizerState:
    """The enable flags of every TensorQuantizer under ``model``, by qualified name."""
    return {name: (m._disabled, m._if_quant, m._if_calib)
            for name, m in model.named_modules() if isinstance(m, TensorQuantizer)}


def restore_quantizer_state(model: nn.Module, state: QuantizerState) -> None:
    """Put back flags saved by :func:`quantizer_state`."""
    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer) and name in state:
            module._disabled, module._if_quant, module._if_calib = state[name]


class _QuantizationSwitch:
    _enabled = True

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected an nn.Module, got {type(model).__name__}.")
        self.model = model
        self._saved: QuantizerState | None = None

    def apply(self, enabled: bool | None = None) -> None:
        """Set every quantizer under the model (``enable_quantization(m).apply()`` style, no restore)."""
        on = self._enabled if enabled is None else enabled
        for module in self.model.modules():
            if isinstance(module, TensorQuantizer):
                module._disabled = not on

    def __enter__(self):
        self._saved = quantizer_state(self.model)
        _QuantizationSwitch.apply(self, self._enabled)
        return self

    def __exit__(self, *exc) -> None:
        # restore exactly what was there, rather than flipping everything the other way
        if self._saved is not None:
            restore_quantizer_state(self.model, self._saved)
            self._saved = None


class enable_quantization(_QuantizationSwitch):  # noqa: N801 - the reference scripts' name
    """Enable every quantizer under ``model``; as a context manager, restore the previous flags on exit."""

    _enabled = True


class disable_quantization(_QuantizationSwitch):  # noqa: N801
    """Disable (bypass) every quantizer under ``model``; as a context manager, restore on exit.

    ``disable_quantization(model).apply(False)`` re-enables, as in the reference scripts.
    """

    _enabled = False

    def apply(self, disabled: bool | None = None) -> None:
        super().apply(None if disabled is None else not disabled)
