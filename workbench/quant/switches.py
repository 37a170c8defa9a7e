"""Turn the quantizers of a model (or part of it) on and off, as the reference scripts and torch.ao do.

Three kinds of switch, all on :class:`TensorQuantizer`'s public methods:

* per-module helpers for ``model.apply`` (torch.ao's ``enable_fake_quant`` / ``disable_observer`` style):
  :func:`enable_quantizer` / :func:`disable_quantizer` (bypass), :func:`enable_fake_quant` /
  :func:`disable_fake_quant` (the quantization step), :func:`enable_observer` / :func:`disable_observer`
  (calibration); each one leaves modules that are not quantizers alone;
* context managers that restore the previous flags on exit, even on an exception:
  :func:`bypass_quantization`, :class:`disable_quantization`, :class:`enable_quantization`;
* :func:`quantizer_state` / :func:`restore_quantizer_state` to save and put back flags by name.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["enable_quantization", "disable_quantization", "bypass_quantization", "quantizer_state",
           "restore_quantizer_state", "QuantizerState", "enable_quantizer", "disable_quantizer",
           "enable_fake_quant", "disable_fake_quant", "enable_observer", "disable_observer"]

# name -> (disabled, if_quant, if_calib)
QuantizerState = dict[str, tuple[bool, bool, bool]]


# ----- helpers for model.apply ------------------------------------------------------------------

def enable_quantizer(module: nn.Module) -> None:
    """Stop bypassing ``module`` if it is a TensorQuantizer (``model.apply(enable_quantizer)``).

    Args:
        module: any module; only a :class:`TensorQuantizer` is changed.
    """
    if isinstance(module, TensorQuantizer):
        module.enable()


def disable_quantizer(module: nn.Module) -> None:
    """Bypass ``module`` if it is a TensorQuantizer: inputs pass through (``model.apply(disable_quantizer)``).

    Args:
        module: any module; only a :class:`TensorQuantizer` is changed.
    """
    if isinstance(module, TensorQuantizer):
        module.disable()


def enable_fake_quant(module: nn.Module) -> None:
    """Switch the quantization step of a TensorQuantizer on (torch.ao's name; ``model.apply(enable_fake_quant)``).

    Args:
        module: any module; only a :class:`TensorQuantizer` is changed.
    """
    if isinstance(module, TensorQuantizer):
        module.enable_quant()


def disable_fake_quant(module: nn.Module) -> None:
    """Switch the quantization step of a TensorQuantizer off; calibration, if on, still sees the inputs.

    Args:
        module: any module; only a :class:`TensorQuantizer` is changed.
    """
    if isinstance(module, TensorQuantizer):
        module.disable_quant()


def enable_observer(module: nn.Module) -> None:
    """Feed a TensorQuantizer's inputs to its calibrator (torch.ao's name for ``enable_calib``).

    Args:
        module: any module; only a :class:`TensorQuantizer` is changed.

    Raises:
        ValueError: the quantizer has no calibrator.
    """
    if isinstance(module, TensorQuantizer):
        module.enable_calib()


def disable_observer(module: nn.Module) -> None:
    """Stop feeding a TensorQuantizer's inputs to its calibrator (torch.ao's name for ``disable_calib``).

    Args:
        module: any module; only a :class:`TensorQuantizer` is changed.
    """
    if isinstance(module, TensorQuantizer):
        module.disable_calib()


# ----- saving and restoring flags ---------------------------------------------------------------

def _check_model(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}.")


def quantizer_state(model: nn.Module) -> QuantizerState:
    """The enable flags of every TensorQuantizer under ``model``, by qualified name.

    Args:
        model: the model (or part of it) to read.

    Returns:
        ``{name: (disabled, quant enabled, calib enabled)}``, for :func:`restore_quantizer_state`.
    """
    return {name: (not m.is_enabled, m.is_quant_enabled, m.is_calib_enabled)
            for name, m in model.named_modules() if isinstance(m, TensorQuantizer)}


def _restore_flags(quantizer: TensorQuantizer, flags: tuple[bool, bool, bool]) -> None:
    disabled, quant, calib = flags
    quantizer.set_enabled(not disabled)
    if quant:
        quantizer.enable_quant()
    else:
        quantizer.disable_quant()
    if calib:
        quantizer.enable_calib()
    else:
        quantizer.disable_calib()


def restore_quantizer_state(model: nn.Module, state: QuantizerState) -> None:
    """Put back flags saved by :func:`quantizer_state` (quantizers not in ``state`` are left alone).

    Args:
        model: the model the state was read from.
        state: what :func:`quantizer_state` returned.
    """
    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer) and name in state:
            _restore_flags(module, state[name])


@contextmanager
def bypass_quantization(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` in float: every TensorQuantizer under it is bypassed inside the ``with`` block.

    On exit, normal or by an exception, each quantizer gets back exactly the enable flag it had (those
    that were off stay off). Quantizers are remembered by identity, so a quantizer renamed or moved
    inside the block is still restored, and one added inside it is left as it is.

    Args:
        model: the model (or part of it) whose quantizers to bypass.

    Returns:
        A context manager yielding ``model``.

    Raises:
        TypeError: ``model`` is not an nn.Module.
    """
    _check_model(model)
    saved = [(m, m.is_enabled) for m in model.modules() if isinstance(m, TensorQuantizer)]
    try:
        for quantizer, _ in saved:
            quantizer.disable()
        yield model
    finally:
        for quantizer, enabled in saved:
            quantizer.set_enabled(enabled)


class _QuantizationSwitch:
    _enabled = True

    def __init__(self, model: nn.Module) -> None:
        _check_model(model)
        self.model = model
        self._saved: QuantizerState | None = None

    def apply(self, enabled: bool | None = None) -> None:
        """Set every quantizer under the model (``enable_quantization(m).apply()`` style, no restore)."""
        on = self._enabled if enabled is None else enabled
        self.model.apply(enable_quantizer if on else disable_quantizer)

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
