"""A project's settings: their defaults, which of them the quantized model is built from, and the check of
each value as the project file stores it (plain JSON: dicts, lists, text, numbers, booleans).

Checked once where a value comes in (a new project, an edit); the rest of the code reads checked values.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from workbench.quant import QuantDescriptor
from workbench.quant.calib.methods import AMAX_METHODS, DEFAULT_AMAX_METHOD, PERCENTILE
from workbench.quant.tensorrt_rules import tensorrt_check
from workbench.strict_json import strict

__all__ = ["DEFAULT_SETTINGS", "PERCENTILE_FLOOR", "REBUILD_SETTINGS", "FUNCTIONAL_SWITCHES", "percentile_mistake",
           "SettingsError", "checked_setting", "make_descriptor", "jsonable"]

DEFAULT_SETTINGS: dict[str, Any] = {
    "defaults": {"input": {"calib_method": "histogram"}, "weight": None},
    "functional": {"add": True, "concat": True, "matmul": True, "attention": True,
                   "residual_adds_in_transformer_blocks": False},
    "rules": {"concat": True, "maxpool": True, "residual": True},
    "pins": [],
    "calibration": {"method": DEFAULT_AMAX_METHOD.value, "num_batches": 16, "percentile": PERCENTILE.default},
    "metric": {"name": "sqnr", "direction": None},
    "export": {"path": None, "opset": 17, "dynamic_batch": True, "amax_json": False, "calibration_cache": False},
    "device": "cpu",
    # the part of the model's output that metrics, sensitivity and export compare: a ModelOutput / dict key
    # ("logits") or a tuple index ("0"); None: the whole output if it is tensors, else its first tensor
    "output": None,
    # fold BatchNorm into the layer before it, as TensorRT does, so that per-channel weight amax is taken
    # on the weights the engine runs (projects from before folding existed open with it off)
    "fold_bn": True,
    # quantization-aware fine-tuning (workbench.training): lr and epochs are the user's (see recipe())
    "finetune": {"epochs": 2, "lr": 1e-4, "optimizer": "sgd", "schedule": "cosine", "momentum": 0.9,
                 "weight_decay": 0.0, "loss": "cross_entropy", "learn_amax": [], "steps_per_epoch": None,
                 "amp": None},
}

# what each functional switch quantizes (the CLI's --help and the GUI read it)
FUNCTIONAL_SWITCHES: dict[str, str] = {
    "add": "elementwise adds of two activations (residual adds)",
    "concat": "concatenations of activations",
    "matmul": "matrix products of two activations (torch.matmul, @, bmm, baddbmm)",
    "attention": "F.scaled_dot_product_attention and Hugging Face attention functions (q, k, v, probabilities)",
    "residual_adds_in_transformer_blocks": "residual adds inside transformer blocks (LayerNorm/attention "
                                           "blocks); off by default, TensorRT keeps them in its fused kernels",
}

# the settings that change which quantizers exist or how they are built (the model is rebuilt)
REBUILD_SETTINGS = frozenset({"defaults", "functional", "rules", "pins", "fold_bn"})


class SettingsError(ValueError):
    """A setting's value is not one the project can hold; the message says which and what is expected."""


def jsonable(value: Any) -> Any:
    """``value`` as the project's JSON holds it (:func:`workbench.strict_json.strict`: tuples as lists, keys
    as text, NumPy scalars and arrays as Python numbers and lists, non-finite floats and other objects as text)."""
    return strict(value)


def make_descriptor(fields: dict[str, Any] | None) -> QuantDescriptor | None:
    """The QuantDescriptor that stored descriptor fields (``QuantDescriptor.dict()``, JSON lists for tuples)
    describe; None for None. Raises QuantDescriptor's own TypeError/ValueError for bad fields."""
    if fields is None:
        return None
    fields = dict(fields)
    if isinstance(fields.get("axis"), list):
        fields["axis"] = tuple(fields["axis"]) if len(fields["axis"]) != 1 else fields["axis"][0]
    if isinstance(fields.get("num_bits"), list):
        fields["num_bits"] = tuple(fields["num_bits"])
    return QuantDescriptor(**fields)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(key: str, value: Any) -> dict[str, Any]:
    """A dict setting, with only the fields the default has."""
    if not isinstance(value, dict):
        raise SettingsError(f"{key} is a mapping of {', '.join(DEFAULT_SETTINGS[key])}, got {value!r}.")
    unknown = [name for name in value if name not in DEFAULT_SETTINGS[key]]
    if unknown:
        raise SettingsError(f"{key} has no {', '.join(map(repr, unknown))}; its fields are "
                            f"{', '.join(DEFAULT_SETTINGS[key])}.")
    return copy.deepcopy(value)


def _checked_device(value: Any) -> str:
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError) as error:
        raise SettingsError(f"{value!r} is not a device: use cpu, cuda or cuda:N ({error}).") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SettingsError(f"Device {value!r} is not available: this machine has no CUDA device.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SettingsError(f"Device {value!r} is not available: this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s).")
    elif device.type != "cpu":
        raise SettingsError(f"Device {value!r} is not supported: use cpu, cuda or cuda:N.")
    return str(device)


def _check_fields(key: str, checked: dict[str, Any]) -> None:
    """The fields of a mapping setting ``key``."""
    if key in ("functional", "rules"):
        wrong = [name for name, flag in checked.items() if not isinstance(flag, bool)]
        if wrong:
            raise SettingsError(f"{key} {', '.join(wrong)} must be true or false, got "
                                f"{', '.join(repr(checked[name]) for name in wrong)}.")
    elif key == "metric":
        name, direction = checked.get("name"), checked.get("direction")
        if not isinstance(name, str) or not name.strip():
            raise SettingsError(f"The metric needs a name (a built-in metric, or module:function / "
                                f"file.py:function), got {name!r}.")
        if direction not in (None, "higher", "lower"):
            raise SettingsError(f"The metric's direction is 'higher' or 'lower' (which is better), got {direction!r}.")
    elif key == "defaults":
        for role, fields in checked.items():
            if fields is not None and not isinstance(fields, dict):
                raise SettingsError(f"the default {role} descriptor is a mapping of fields or none, got {fields!r}.")
            try:
                made = make_descriptor(fields)
            except (TypeError, ValueError) as error:
                raise SettingsError(f"the default {role} descriptor: {error}") from None
            # a default applies to every layer type, so only the rule all of them share is checked here
            if made is not None and role == "input":
                verdict = tensorrt_check(role, made.num_bits, made.axis, "layer")
                if verdict.error:
                    raise SettingsError(f"the default input descriptor: {verdict.error}")
    elif key == "calibration":
        method, batches, percentile = checked.get("method"), checked.get("num_batches"), checked.get("percentile")
        if method is not None and method not in AMAX_METHODS:
            raise SettingsError(f"The calibration method is one of {', '.join(AMAX_METHODS)}, got {method!r}.")
        if batches is not None and (not _is_int(batches) or batches < 1):
            raise SettingsError(f"The calibration batches are a positive number or none (all), got {batches!r}.")
        if percentile is not None and not PERCENTILE.contains(percentile):
            raise SettingsError(f"The calibration percentile is {PERCENTILE.describe()}, got {percentile!r}.")
        mistake = percentile_mistake(percentile) if percentile is not None else None
        if mistake:
            raise SettingsError(mistake)
    elif key == "export":
        opset, path = checked.get("opset"), checked.get("path")
        if opset is not None and (not _is_int(opset) or opset < 1):
            raise SettingsError(f"The export opset is a positive integer, got {opset!r}.")
        if path is not None and not isinstance(path, str):
            raise SettingsError(f"The export path is a file name or none, got {path!r}.")
        wrong = [name for name in ("dynamic_batch", "amax_json", "calibration_cache")
                 if name in checked and not isinstance(checked[name], bool)]
        if wrong:
            raise SettingsError(f"export {', '.join(wrong)} must be true or false.")


# A percentile under this is almost certainly a fraction typed where a percent was meant (0.999 for 99.9).
PERCENTILE_FLOOR = 50.0


def percentile_mistake(percentile: float) -> str | None:
    """Why ``percentile`` (in percent) is almost certainly a mistake, with the value likely meant; None when
    it looks intended (at least :data:`PERCENTILE_FLOOR`). The CLI lets a user insist (``--force``)."""
    if percentile >= PERCENTILE_FLOOR:
        return None
    candidates = ([percentile * 100] if 0 < percentile <= 1 else []) + [100 - percentile]
    meant = next(c for c in candidates if c >= PERCENTILE_FLOOR)
    return (f"The percentile is in percent: {percentile:g} would set amax where only {percentile:g}% of the "
            f"values lie below it, clipping almost everything; did you mean {round(meant, 6):g}?")


def checked_setting(key: str, value: Any) -> Any:
    """``value`` if it is a valid value of setting ``key`` (as stored), else a :class:`SettingsError` saying why.

    A metric's name is checked for its form here; whether such a metric exists is the analysis layer's
    to say (the session asks it).
    """
    if key not in DEFAULT_SETTINGS:
        raise SettingsError(f"Unknown setting {key!r}; settings are {', '.join(DEFAULT_SETTINGS)}.")
    if key == "fold_bn":
        if not isinstance(value, bool):
            raise SettingsError(f"fold_bn is on or off (true/false), got {value!r}.")
        return value
    if key == "device":
        return _checked_device(value)
    if key == "output":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise SettingsError(f"output is the name of an output entry (logits, 0...) or none, got {value!r}.")
        return value.strip() if isinstance(value, str) else None
    if key == "pins":
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(pin, (list, tuple)) and len(pin) == 2 and all(isinstance(n, str) and n for n in pin)
                for pin in value):
            raise SettingsError(f"pins is a list of pairs of quantizer or layer names, got {value!r}.")
        return [list(pin) for pin in value]
    checked = _mapping(key, value)
    _check_fields(key, checked)
    return checked
