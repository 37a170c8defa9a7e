"""A project's settings, typed: one frozen dataclass per setting that is a mapping (calibration, metric,
export, ...) and :class:`ProjectSettings` holding them with the plain ones (device, output, fold_bn, pins).

The project file stores each setting as JSON (:meth:`ProjectSettings.to_stored`, one row per setting);
:meth:`ProjectSettings.from_stored` reads that back, filling defaults for what an older file lacks. Each
dataclass checks its own fields when it is made (read from a file, or edited), so the rest of the code
reads checked, typed values; a bad value is a :class:`SettingsError` that names the setting, the field
and what is expected.
"""
from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Self

from workbench.opsets import DEFAULT_OPSET, MIN_OPSET, newest_opset, opset_bounds_text
from workbench.quant.algorithms.precision_registry import BLOCK_METHODS, DEFAULT_BLOCK_METHOD, FP8_OPS
from workbench.quant.algorithms.tensorrt_rules import tensorrt_check
from workbench.quant.calib.methods import AMAX_METHODS, DEFAULT_AMAX_METHOD, PERCENTILE, AmaxMethod, percentile_mistake
from workbench.quant.descriptor import QuantDescriptor
from workbench.sources.metric_names import DEFAULT_METRIC, DIRECTIONS, Direction
from workbench.strict_json import strict

__all__ = ["ProjectSettings", "DefaultDescriptors", "FunctionalSettings", "RuleSettings", "CalibrationSettings",
           "MetricSettings", "ExportSettings", "FinetuneSettings", "SECTIONS", "DEFAULTS", "DEFAULT_SETTINGS",
           "REBUILD_SETTINGS", "FUNCTIONAL_SWITCHES", "RULES", "EXPORT_CHECKS", "SettingsError", "checked_setting",
           "available_device", "make_descriptor", "jsonable"]


class SettingsError(ValueError):
    """A setting's value is not one the project can hold; the message says which and what is expected."""


def jsonable(value: Any) -> Any:
    """``value`` as the project's JSON holds it (:func:`workbench.strict_json.strict`: tuples as lists, keys
    as text, NumPy scalars and arrays as Python numbers and lists, non-finite floats and other objects as text)."""
    return strict(value)


def make_descriptor(fields: Mapping[str, Any] | None) -> QuantDescriptor | None:
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


# ----- checks of one value ----------------------------------------------------------------------------

def _refused(where: str, expected: str, value: Any) -> SettingsError:
    return SettingsError(f"{where} is {expected}, got {value!r}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _stored(value: Any) -> Any:
    """A typed field's value as the project's JSON holds it: enums as their text, tuples as lists, copies."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_stored(item) for item in value]
    return copy.deepcopy(value)


# ----- the settings that are mappings -----------------------------------------------------------------

class _Section:
    """A setting that is a mapping: a frozen dataclass, one field per key, checked in ``__post_init__``.

    Fields missing from a stored mapping take their defaults (a file written before a field existed, or a
    partial edit, means the default there); a key the dataclass does not have is refused.
    """

    KEY: ClassVar[str]
    # fields added after projects were written: stored only when not at their default, so the file of a
    # project that does not use them keeps the bytes it always had
    STORED_WHEN_SET: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_stored(cls, value: Any) -> Self:
        """The section from its stored mapping; SettingsError naming the setting and field otherwise."""
        names = cls.field_names()
        if not isinstance(value, Mapping):
            raise SettingsError(f"{cls.KEY} is a mapping of {', '.join(names)}, got {value!r}.")
        unknown = [name for name in value if name not in names]
        if unknown:
            raise SettingsError(f"{cls.KEY} has no {', '.join(map(repr, unknown))}; its fields are "
                                f"{', '.join(names)}.")
        return cls(**copy.deepcopy(dict(value)))

    def to_stored(self) -> dict[str, Any]:
        """The mapping the project file holds (every field, but those of :attr:`STORED_WHEN_SET` at their default)."""
        defaults = {f.name: f.default for f in fields(self)}  # type: ignore[arg-type]
        return {name: _stored(getattr(self, name)) for name in self.field_names()
                if name not in self.STORED_WHEN_SET or getattr(self, name) != defaults[name]}

    def _require(self, name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise _refused(f"{self.KEY}.{name}", expected, getattr(self, name))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen dataclass's own field while it is made

    def _flags(self) -> None:
        for name in self.field_names():
            self._require(name, isinstance(getattr(self, name), bool), "true or false")


@dataclass(frozen=True)
class DefaultDescriptors(_Section):
    """The descriptors layers get unless the user set their own: stored descriptor fields, or None for the
    quantized module's own default."""

    KEY: ClassVar[str] = "defaults"
    input: dict[str, Any] | None = field(default_factory=lambda: {"calib_method": "histogram"})
    weight: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for role in ("input", "weight"):
            stored = getattr(self, role)
            self._require(role, stored is None or isinstance(stored, Mapping), "a descriptor's fields or none")
            try:
                made = make_descriptor(stored)
            except (TypeError, ValueError) as error:
                raise SettingsError(f"defaults.{role} (the default {role} descriptor): {error}") from None
            # a default applies to every layer type, so only the rule all of them share is checked here
            if made is not None and role == "input":
                verdict = tensorrt_check(role, made.num_bits, made.axis, "layer")
                if verdict.error:
                    raise SettingsError(f"defaults.input (the default input descriptor): {verdict.error}")
            self._set(role, copy.deepcopy(dict(stored)) if stored is not None else None)

    def descriptor(self, role: str) -> QuantDescriptor | None:
        """The default descriptor of ``role`` (``input`` or ``weight``); None: the module's own default."""
        return make_descriptor(getattr(self, role))


@dataclass(frozen=True)
class FunctionalSettings(_Section):
    """Which functional operations (not modules) get quantizers; the help of each field is what the CLI's
    ``--help`` and the GUI show."""

    KEY: ClassVar[str] = "functional"
    add: bool = field(default=True, metadata={"help": "elementwise adds of two activations (residual adds)"})
    concat: bool = field(default=True, metadata={"help": "concatenations of activations"})
    matmul: bool = field(default=True, metadata={
        "help": "matrix products of two activations (torch.matmul, @, bmm, baddbmm)"})
    attention: bool = field(default=True, metadata={
        "help": "F.scaled_dot_product_attention and Hugging Face attention functions (q, k, v, probabilities)"})
    residual_adds_in_transformer_blocks: bool = field(default=False, metadata={
        "help": "residual adds inside transformer blocks (LayerNorm/attention blocks); off by default, TensorRT "
                "keeps them in its fused kernels"})

    def __post_init__(self) -> None:
        self._flags()


@dataclass(frozen=True)
class RuleSettings(_Section):
    """TensorRT's scale-sharing placement rules (:mod:`workbench.quant.algorithms.tensorrt_rules`), each on or off."""

    KEY: ClassVar[str] = "rules"
    concat: bool = True
    maxpool: bool = True
    residual: bool = True

    def __post_init__(self) -> None:
        self._flags()


@dataclass(frozen=True)
class CalibrationSettings(_Section):
    """How a calibration runs when the user does not say: amax method, batches (None: all), percentile."""

    KEY: ClassVar[str] = "calibration"
    method: AmaxMethod = DEFAULT_AMAX_METHOD
    num_batches: int | None = 16
    percentile: float = PERCENTILE.default
    # INT4 blockwise weights: each block's amax is its max, or the least-squared-error shrink of it
    block_method: str = DEFAULT_BLOCK_METHOD
    # one block's weights resident at a time (workbench.quant.algorithms.sequential): same amax, less memory
    sequential: bool = False
    STORED_WHEN_SET: ClassVar[tuple[str, ...]] = ("block_method", "sequential")

    def __post_init__(self) -> None:
        self._require("block_method", self.block_method in BLOCK_METHODS, f"one of {', '.join(BLOCK_METHODS)}")
        self._require("sequential", isinstance(self.sequential, bool), "true or false")
        if self.method is None:  # stored none: the default method
            self._set("method", DEFAULT_AMAX_METHOD)
        self._require("method", self.method in AMAX_METHODS, f"one of {', '.join(AMAX_METHODS)}")
        self._set("method", AmaxMethod(self.method))
        self._require("num_batches", self.num_batches is None or (_is_int(self.num_batches) and self.num_batches >= 1),
                      "a positive number or none (all batches)")
        if self.percentile is None:  # stored none: the default percentile
            self._set("percentile", PERCENTILE.default)
        self._require("percentile", PERCENTILE.contains(self.percentile), f"{PERCENTILE.describe()} (in percent)")
        mistake = percentile_mistake(self.percentile)
        if mistake:
            raise SettingsError(f"calibration.percentile: {mistake}")


@dataclass(frozen=True)
class MetricSettings(_Section):
    """The metric sensitivity ranks and evaluation reports by: a built-in name, or a user function
    (``module:function`` / ``file.py:function``) with which direction is better."""

    KEY: ClassVar[str] = "metric"
    name: str = DEFAULT_METRIC
    direction: Direction | None = None

    def __post_init__(self) -> None:
        self._require("name", isinstance(self.name, str) and bool(self.name.strip()),
                      "the name of a built-in metric or of a user function (module:function / file.py:function)")
        self._require("direction", self.direction is None or self.direction in DIRECTIONS,
                      f"{' or '.join(map(repr, DIRECTIONS))} (which is better) or none (the metric's own)")
        if self.direction is not None:
            self._set("direction", Direction(self.direction))


@dataclass(frozen=True)
class ExportSettings(_Section):
    """The last export's choices, the defaults of the next one. ``path`` is relative to the project's folder."""

    KEY: ClassVar[str] = "export"
    path: str | None = None
    opset: int = DEFAULT_OPSET
    dynamic_batch: bool = True
    amax_json: bool = False
    calibration_cache: bool = False
    fp8_ops: str = "standard"  # workbench.quant.algorithms.precision.FP8_OPS: "trt" for TensorRT before 10
    # the model's outputs the graph returns, by name (workbench.export.outputs); None: every one
    outputs: tuple[str, ...] | None = None
    # the sample's sequence length kept fixed (a model that loops over the sequence in Python)
    static_sequence: bool = False
    # parity: the lowest cosine of every output of onnxruntime with the fake-quant model before a file counts as
    # validated (below it the file is written "not validated" with a diagnosis, or refused with --strict)
    min_cosine: float = field(default=0.999, metadata={
        "help": "the lowest cosine similarity of onnxruntime's outputs with the fake-quant model's for a file to "
                "count as validated"})
    # how many calibration batches parity is checked on besides the sample (0: the sample's checks only)
    parity_batches: int = field(default=4, metadata={
        "help": "calibration batches onnxruntime's outputs are compared on, besides the sample"})
    STORED_WHEN_SET: ClassVar[tuple[str, ...]] = ("fp8_ops", "outputs", "static_sequence", "min_cosine",
                                                  "parity_batches")

    def __post_init__(self) -> None:
        self._require("path", self.path is None or isinstance(self.path, str), "a file name or none")
        self._require("fp8_ops", self.fp8_ops in FP8_OPS, f"one of {', '.join(FP8_OPS)}")
        self._require("outputs", self.outputs is None or (
            isinstance(self.outputs, (list, tuple)) and bool(self.outputs)
            and all(isinstance(name, str) and name.strip() for name in self.outputs)),
            "a list of output names (logits, pred_boxes...) or none for every output")
        if self.outputs is not None:
            self._set("outputs", tuple(self.outputs))
        if self.opset is None:  # stored none: the default opset
            self._set("opset", type(self).opset)
        # below MIN_OPSET no exporter anywhere can write the file; the upper bound is this machine's onnx, checked
        # when the setting is edited (checked_setting), so a project from a newer onnx still opens
        if not (_is_int(self.opset) and self.opset >= MIN_OPSET):  # the text asks onnx: only on a refusal
            raise _refused("export.opset", opset_bounds_text(), self.opset)
        for name in ("dynamic_batch", "amax_json", "calibration_cache", "static_sequence"):
            self._require(name, isinstance(getattr(self, name), bool), "true or false")
        self._require("min_cosine", _is_number(self.min_cosine) and -1.0 <= self.min_cosine <= 1.0,
                      "a cosine similarity between -1 and 1 (0.999 by default)")
        self._require("parity_batches", _is_int(self.parity_batches) and self.parity_batches >= 0,
                      "a number of batches >= 0")


@dataclass(frozen=True)
class FinetuneSettings(_Section):
    """Quantization-aware fine-tuning (:mod:`workbench.training`); the names of optimizers and schedules are
    the training layer's to check (it runs them)."""

    KEY: ClassVar[str] = "finetune"
    epochs: int = 2
    lr: float = 1e-4
    optimizer: str = "sgd"
    schedule: str = "cosine"
    momentum: float = 0.9
    weight_decay: float = 0.0
    loss: str = "cross_entropy"
    learn_amax: tuple[str, ...] = ()
    steps_per_epoch: int | None = None
    amp: bool | None = None

    def __post_init__(self) -> None:
        self._require("epochs", _is_int(self.epochs) and self.epochs >= 1, "a positive integer")
        self._require("lr", _is_number(self.lr) and self.lr > 0, "a positive number")
        for name in ("momentum", "weight_decay"):
            self._require(name, _is_number(getattr(self, name)) and getattr(self, name) >= 0, "a number >= 0")
        if self.loss is None:  # stored none: the default loss
            self._set("loss", type(self).loss)
        for name in ("optimizer", "schedule", "loss"):
            self._require(name, isinstance(getattr(self, name), str) and bool(getattr(self, name)), "a name")
        patterns = [self.learn_amax] if isinstance(self.learn_amax, str) else self.learn_amax
        self._require("learn_amax", isinstance(patterns, (list, tuple)) and all(isinstance(p, str) for p in patterns),
                      "a list of quantizer name patterns")
        self._set("learn_amax", tuple(patterns))
        self._require("steps_per_epoch", self.steps_per_epoch is None
                      or (_is_int(self.steps_per_epoch) and self.steps_per_epoch >= 1), "a positive integer or none")
        self._require("amp", self.amp is None or isinstance(self.amp, bool), "true, false or none (automatic)")


SECTIONS: dict[str, type[_Section]] = {section.KEY: section for section in (
    DefaultDescriptors, FunctionalSettings, RuleSettings, CalibrationSettings, MetricSettings, ExportSettings,
    FinetuneSettings)}

# what each functional switch quantizes (the CLI's --help and the GUI read it)
FUNCTIONAL_SWITCHES: dict[str, str] = {f.name: f.metadata["help"] for f in fields(FunctionalSettings)}
RULES: tuple[str, ...] = RuleSettings.field_names()
# the export settings the CLI's `set --export NAME=VALUE` and the GUI's Settings dialog edit, with their help
EXPORT_CHECKS: dict[str, str] = {f.name: f.metadata["help"] for f in fields(ExportSettings) if "help" in f.metadata}


# ----- the plain settings -----------------------------------------------------------------------------

def _device(value: Any) -> str:
    """A device's name in torch's spelling (``cuda:0``); whether this machine has it is :func:`available_device`'s.

    Read by pattern rather than by ``torch.device``: ``--help`` builds these settings without loading torch.
    """
    text = str(value).strip() if isinstance(value, str) or type(value).__name__ == "device" else None
    match = _DEVICE_NAME.fullmatch(text) if text is not None else None
    if match is None:
        raise SettingsError(f"device: {value!r} is not a device: use cpu, cuda or cuda:N.")
    kind, index = match.group(1), match.group(2)
    if kind not in _TORCH_DEVICE_TYPES:
        raise SettingsError(f"device: {value!r} is not a device: use cpu, cuda or cuda:N.")
    if kind not in ("cpu", "cuda"):
        raise SettingsError(f"device: {value!r} is not supported: use cpu, cuda or cuda:N.")
    return kind if index is None else f"{kind}:{int(index)}"


# torch's device spelling: a type, and an optional index; the types torch.device knows (it refuses others)
_DEVICE_NAME = re.compile(r"([a-z_]+)(?::(\d+))?")
_TORCH_DEVICE_TYPES = frozenset({"cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve",
                                 "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                                 "privateuseone"})


def available_device(value: Any) -> str:
    """:func:`_device`, and this machine has it (checked when the setting is edited: a project saved on a GPU
    machine still opens on another)."""
    import torch

    device = torch.device(_device(value))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SettingsError(f"device: {value!r} is not available: this machine has no CUDA device.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SettingsError(f"device: {value!r} is not available: this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s).")
    return str(device)


def _pins(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(pin, (list, tuple)) and len(pin) == 2 and all(isinstance(n, str) and n for n in pin)
            for pin in value):
        raise _refused("pins", "a list of pairs of quantizer or layer names", value)
    return tuple((pin[0], pin[1]) for pin in value)


def _output(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise _refused("output", "the name of an output entry (logits, 0...) or none", value)
    return value.strip() if isinstance(value, str) else None


def _fold_bn(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refused("fold_bn", "on or off (true/false)", value)
    return value


_PLAIN = {"pins": _pins, "device": _device, "output": _output, "fold_bn": _fold_bn}


@dataclass(frozen=True)
class ProjectSettings:
    """Every setting of a project, checked. Made by :meth:`from_stored` (a project file's JSON) or as the
    defaults (``ProjectSettings()``); :meth:`to_stored` is the JSON again. Fields are in the file's order."""

    defaults: DefaultDescriptors = field(default_factory=DefaultDescriptors)
    functional: FunctionalSettings = field(default_factory=FunctionalSettings)
    rules: RuleSettings = field(default_factory=RuleSettings)
    # pairs of quantizers or layers that share one quantizer (TensorRT scale sharing)
    pins: tuple[tuple[str, str], ...] = ()
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    metric: MetricSettings = field(default_factory=MetricSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    device: str = "cpu"
    # the part of the model's output that metrics, sensitivity and export compare: a ModelOutput / dict key
    # ("logits") or a tuple index ("0"); None: the whole output if it is tensors, else its first tensor
    output: str | None = None
    # fold BatchNorm into the layer before it, as TensorRT does, so that per-channel weight amax is taken
    # on the weights the engine runs (projects from before folding existed open with it off)
    fold_bn: bool = True
    # quantization-aware fine-tuning (workbench.training): lr and epochs are the user's (see recipe())
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)

    def __post_init__(self) -> None:
        for key, check in _PLAIN.items():
            object.__setattr__(self, key, check(getattr(self, key)))
        for key, section in SECTIONS.items():
            if not isinstance(getattr(self, key), section):
                raise SettingsError(f"{key} is a {section.__name__}, got {getattr(self, key)!r}.")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every setting's name, in the file's order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> ProjectSettings:
        """The settings a project file holds (one JSON value per setting); defaults for missing settings and
        fields. SettingsError naming the setting and the field when a value is not one a project can hold."""
        unknown = [key for key in stored if key not in cls.keys()]
        if unknown:
            raise SettingsError(f"Unknown setting {unknown[0]!r}; settings are {', '.join(cls.keys())}.")
        values = {key: SECTIONS[key].from_stored(value) if key in SECTIONS else value for key, value in stored.items()}
        return cls(**values)

    def to_stored(self) -> dict[str, Any]:
        """The JSON the project file holds: one value per setting, every field of every mapping."""
        return {key: self.stored(key) for key in self.keys()}

    def stored(self, key: str) -> Any:
        """One setting's value as the project file holds it."""
        value = getattr(self, key)
        return value.to_stored() if isinstance(value, _Section) else _stored(value)


DEFAULTS = ProjectSettings()
# the defaults as a project file stores them (a new project's settings; the help texts name them)
DEFAULT_SETTINGS: dict[str, Any] = DEFAULTS.to_stored()

# the settings that change which quantizers exist or how they are built (the model is rebuilt)
REBUILD_SETTINGS = frozenset({"defaults", "functional", "rules", "pins", "fold_bn"})


def checked_setting(key: str, value: Any) -> Any:
    """``value`` as the project file stores setting ``key`` (every field of a mapping, defaults for those not
    given), if it is valid and, for the device and the ONNX opset, usable on this machine; else a
    :class:`SettingsError`.

    A metric's name is checked for its form here; whether such a metric exists is the analysis layer's
    to say (the session asks it).
    """
    checked = ProjectSettings.from_stored({key: value})
    if key == "export" and checked.export.opset > newest_opset():
        raise _refused("export.opset", opset_bounds_text(), checked.export.opset)
    return available_device(value) if key == "device" else checked.stored(key)
