"""Metrics a sensitivity analysis ranks units by, each with its direction (is higher better?).

Two kinds:

* :class:`OutputMetric`: accumulated batch by batch from the model's outputs while the analysis runs
  the model. The built-in label-free ones compare with the FP32 model's outputs on the same batches
  (computed once per analysis and reused): SQNR in dB, cosine similarity and MSE. Top-1 accuracy
  uses the batches' labels. Because the analysis runs the model itself, these metrics can start a
  pass from cached activations (see :mod:`workbench.analysis.prefix_cache`).
* :class:`ModelMetric`: a function ``fn(model, batches) -> float`` that runs the model itself, for
  scores such as COCO mAP; :class:`EntryPointMetric` loads it from ``module:function`` or
  ``file.py:function``.

Every metric serialises to a small dict (:meth:`Metric.to_dict`, :func:`metric_from_dict`) without
running any code: an entry point is only imported when an analysis evaluates it.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from workbench.analysis.entry_point import load_entry_point
from workbench.quant.algorithms.batches import batch_targets, class_scores, flat_tensors, select_output
from workbench.sources.entrypoints import split_entrypoint
from workbench.sources.errors import TrustRequired
from workbench.sources.metric_names import DEFAULT_METRIC, DIRECTIONS, Direction

__all__ = ["Direction", "Metric", "OutputMetric", "Accumulator", "ModelMetric", "EntryPointMetric", "SqnrMetric",
           "CosineMetric", "MseMetric", "Top1Metric", "get_metric", "metric_from_dict", "flat_tensors",
           "BUILTIN_METRICS", "DEFAULT_METRIC", "builtin_metric_labels", "builtin_metric_name",
           "metric_choices_text"]

def _check_direction(direction: Any) -> Direction:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be {' or '.join(map(repr, DIRECTIONS))} (which is better), "
                         f"got {direction!r}.")
    return str(direction)


class Metric(ABC):
    """A number measured on a model configuration, and which way is better."""

    kind: ClassVar[str]
    name: str
    direction: Direction
    # A value of +inf is meaningful for some metrics (SQNR of identical outputs); NaN never is.
    allows_infinity: ClassVar[bool] = False

    @property
    def higher_is_better(self) -> bool:
        return self.direction == Direction.HIGHER

    def gap(self, value: float, fp32: float) -> float:
        """How much worse ``value`` is than ``fp32`` in the metric's units (negative when better)."""
        if value == fp32:  # also when both are infinite
            return 0.0
        return fp32 - value if self.higher_is_better else value - fp32

    def within_tolerance(self, value: float, fp32: float, tolerance: float) -> bool:
        """Whether ``value`` is at most ``tolerance`` worse than ``fp32``.

        A hair of slack absorbs float rounding, so that an accuracy of 0.94 is within 0.01 of 0.95.
        """
        return self.gap(value, fp32) <= tolerance + 1e-9 * max(1.0, abs(fp32))

    def is_valid(self, value: float) -> bool:
        """Whether ``value`` is a number this metric can produce (finite, or +inf where allowed)."""
        if math.isnan(value):
            return False
        return math.isfinite(value) or (self.allows_infinity and value == math.inf)

    def to_dict(self) -> dict[str, Any]:
        """A plain description of the metric, for the project file."""
        return {"kind": self.kind, "name": self.name, "direction": self.direction}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, direction={self.direction!r})"


class Accumulator(Protocol):
    """Collects one configuration's outputs batch by batch and gives the metric's value."""

    def update(self, output: Any, reference: Any, batch: Any) -> None: ...

    def value(self) -> float: ...


class OutputMetric(Metric):
    """A metric over the model's outputs; the analysis runs the model and feeds the accumulator."""

    needs_reference: ClassVar[bool] = False  # True: needs the FP32 outputs of the same batches

    @abstractmethod
    def start(self) -> Accumulator:
        """A fresh accumulator for one pass over the batches."""


def _paired(output: Any, reference: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # the compared part of each output (a ModelOutput's first tensor, never a cache): one rule everywhere
    got, ref = flat_tensors(select_output(output)), flat_tensors(select_output(reference))
    if not ref:
        raise ValueError("The model's output holds no tensor to compare.")
    if len(got) != len(ref) or any(g.shape != r.shape for g, r in zip(got, ref)):
        raise ValueError(f"The output's structure changed: {[tuple(t.shape) for t in got]} against the FP32 "
                         f"model's {[tuple(t.shape) for t in ref]}.")
    # float64 so that sums over large outputs keep their digits
    return [(g.detach().double(), r.detach().double()) for g, r in zip(got, ref)]


class _SqnrAccumulator:
    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0

    def update(self, output: Any, reference: Any, batch: Any) -> None:
        for got, ref in _paired(output, reference):
            self.signal += float(ref.pow(2).sum())
            self.noise += float((ref - got).pow(2).sum())

    def value(self) -> float:
        if self.noise == 0:
            return math.inf
        if self.signal == 0:
            return -math.inf  # rejected as invalid: an all-zero reference has no SQNR
        return 10.0 * math.log10(self.signal / self.noise)


class SqnrMetric(OutputMetric):
    """Signal-to-quantization-noise ratio of the outputs against FP32, in dB, over all batches.

    ``10 log10(sum(ref**2) / sum((ref - out)**2))`` summed over every output element of every batch
    (what :func:`workbench.quant.algorithms.calibrate.sqnr_db` gives for one batch). +inf when the outputs are
    identical, so the FP32 model scores +inf: use a target rather than a tolerance with it.
    """

    kind = "sqnr"
    needs_reference = True
    allows_infinity = True

    def __init__(self) -> None:
        self.name = "SQNR (dB)"
        self.direction = Direction.HIGHER.value

    def start(self) -> Accumulator:
        return _SqnrAccumulator()


class _CosineAccumulator:
    def __init__(self) -> None:
        self.dot = 0.0
        self.ref_sq = 0.0
        self.out_sq = 0.0

    def update(self, output: Any, reference: Any, batch: Any) -> None:
        for got, ref in _paired(output, reference):
            self.dot += float((got * ref).sum())
            self.ref_sq += float(ref.pow(2).sum())
            self.out_sq += float(got.pow(2).sum())

    def value(self) -> float:
        if self.ref_sq == 0 or self.out_sq == 0:
            return 1.0 if self.ref_sq == self.out_sq else 0.0
        return self.dot / math.sqrt(self.ref_sq * self.out_sq)


class CosineMetric(OutputMetric):
    """Cosine similarity of all output elements of all batches with the FP32 ones (1.0: same direction)."""

    kind = "cosine"
    needs_reference = True

    def __init__(self) -> None:
        self.name = "cosine similarity"
        self.direction = Direction.HIGHER.value

    def start(self) -> Accumulator:
        return _CosineAccumulator()


class _MseAccumulator:
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, output: Any, reference: Any, batch: Any) -> None:
        for got, ref in _paired(output, reference):
            self.total += float((ref - got).pow(2).sum())
            self.count += ref.numel()

    def value(self) -> float:
        return self.total / self.count if self.count else math.nan


class MseMetric(OutputMetric):
    """Mean squared error of all output elements of all batches against the FP32 ones."""

    kind = "mse"
    needs_reference = True

    def __init__(self) -> None:
        self.name = "MSE"
        self.direction = Direction.LOWER.value

    def start(self) -> Accumulator:
        return _MseAccumulator()


def _labels(batch: Any) -> torch.Tensor:
    labels = batch_targets(batch)
    if not isinstance(labels, torch.Tensor):
        raise ValueError("top-1 accuracy needs labelled batches: (inputs, labels) tuples, or dicts with a "
                         "'labels' key.")
    return labels


class _Top1Accumulator:
    def __init__(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, output: Any, reference: Any, batch: Any) -> None:
        logits = class_scores(output)
        labels = _labels(batch).to(logits.device)
        if labels.dim() == logits.dim():  # one-hot or soft labels
            labels = labels.argmax(-1)
        if logits.dim() < 2 or labels.shape != logits.shape[:-1]:
            raise ValueError(f"top-1 accuracy expects class scores of shape (N, classes) and labels of shape (N,), "
                             f"got {tuple(logits.shape)} and {tuple(labels.shape)}.")
        self.correct += int((logits.argmax(-1) == labels).sum())
        self.total += labels.numel()

    def value(self) -> float:
        return self.correct / self.total if self.total else math.nan


class Top1Metric(OutputMetric):
    """Top-1 accuracy (fraction in [0, 1]) against the labels in the batches."""

    kind = "top1"

    def __init__(self) -> None:
        self.name = "top-1 accuracy"
        self.direction = Direction.HIGHER.value

    def start(self) -> Accumulator:
        return _Top1Accumulator()


class ModelMetric(Metric):
    """A user function ``fn(model, batches) -> float`` that runs the model itself.

    The analysis calls it under ``torch.no_grad()`` with the model in eval mode and ``batches`` the
    list of batches the analysis uses.
    """

    kind = "callable"

    def __init__(self, fn: Callable[[nn.Module, Sequence[Any]], float], *, direction: Direction,
                 name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"A metric function must be callable, got {type(fn).__name__}.")
        self._fn: Callable[[nn.Module, Sequence[Any]], float] | None = fn
        self.direction = _check_direction(direction)
        self.name = name or getattr(fn, "__qualname__", None) or repr(fn)

    def load(self) -> Callable[[nn.Module, Sequence[Any]], float]:
        """The function (loaded on first use for an entry point)."""
        assert self._fn is not None
        return self._fn

    def evaluate(self, model: nn.Module, batches: Sequence[Any]) -> Any:
        """The function's raw return value; the analysis checks that it is a finite number."""
        return self.load()(model, batches)


class EntryPointMetric(ModelMetric):
    """A :class:`ModelMetric` named by ``module:function`` or ``file.py:function`` (loaded when first used).

    A relative file path is relative to ``base_dir`` (a project's folder; default: the current directory).
    """

    kind = "entry_point"

    def __init__(self, spec: str, *, direction: Direction, name: str | None = None,
                 base_dir: Path | None = None) -> None:
        split_entrypoint(spec)  # a malformed spec fails now; the module is only imported when used
        self.spec = spec
        self.base_dir = base_dir
        self._fn = None
        self.direction = _check_direction(direction)
        self.name = name or spec

    def load(self) -> Callable[[nn.Module, Sequence[Any]], float]:
        """Import the function (once per metric object).

        Raises:
            EntryPointError: it cannot be loaded.
        """
        if self._fn is None:
            self._fn = load_entry_point(self.spec, self.base_dir)
        return self._fn

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "spec": self.spec}


BUILTIN_METRICS: dict[str, type[OutputMetric]] = {
    "sqnr": SqnrMetric, "cosine": CosineMetric, "mse": MseMetric, "top1": Top1Metric,
}


def builtin_metric_labels() -> dict[str, str]:
    """Every built-in metric's key and its name for people (``{"sqnr": "SQNR (dB)", ...}``), as menus list them."""
    return {key: cls().name for key, cls in BUILTIN_METRICS.items()}


def metric_choices_text() -> str:
    """The metrics a user can name, for a ``--help`` or a tooltip."""
    return f"{', '.join(BUILTIN_METRICS)}, or a user function as module:function / file.py:function"
_ALIASES = {"sqnr_db": "sqnr", "cos": "cosine", "accuracy": "top1", "top-1": "top1"}


def builtin_metric_name(name: str) -> str | None:
    """The built-in metric ``name`` stands for, aliases resolved (``"sqnr_db"`` -> ``"sqnr"``); None for an
    entry point or an unknown name."""
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    return key if key in BUILTIN_METRICS else None


def get_metric(metric: Metric | str | Callable[..., float], direction: Direction | None = None, *,
               trust_code: bool = True, base_dir: Path | None = None) -> Metric:
    """A metric from a name, an entry point or a function.

    Args:
        metric: a :class:`Metric`; a built-in name (``"sqnr"``, ``"cosine"``, ``"mse"``, ``"top1"``); an
            entry point ``"module:function"`` or ``"file.py:function"``; or a function
            ``fn(model, batches) -> float``.
        direction: ``"higher"`` or ``"lower"`` is better; required for entry points and functions
            (a built-in's is fixed).
        trust_code: whether an entry point may run. A caller passing one in Python means to run it (the
            default); a front end passes the user's choice, since a project file's metric is code that
            whoever wrote the project chose.
        base_dir: what a relative ``file.py`` of an entry point is relative to (a project's folder;
            default: the current directory).

    Raises:
        ValueError: an unknown name, a malformed entry point, a missing or bad direction.
        TrustRequired: an entry point without ``trust_code`` (nothing is imported).
    """
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        key = builtin_metric_name(metric)
        if key is not None:
            return BUILTIN_METRICS[key]()
        if ":" not in metric:
            raise ValueError(f"Unknown metric {metric!r}: use one of {', '.join(BUILTIN_METRICS)}, or a user "
                             f"function as 'module:function' or 'file.py:function'.")
        if direction is None:
            raise ValueError(f"Say whether a higher or a lower value of {metric!r} is better (direction=...).")
        chosen = EntryPointMetric(metric, direction=direction, base_dir=base_dir)  # checks the form, runs nothing
        if not trust_code:
            raise TrustRequired(f"The metric {metric} runs its Python code; only do this for code you trust, then "
                                "allow it (--trust-code on the command line).")
        return chosen
    if callable(metric):
        if direction is None:
            raise ValueError("Say whether a higher or a lower value of the metric is better (direction=...).")
        return ModelMetric(metric, direction=direction)
    raise TypeError(f"metric must be a Metric, a name, an entry point or a function, got {type(metric).__name__}.")


def metric_from_dict(data: Mapping[str, Any]) -> Metric:
    """Re-create a metric from :meth:`Metric.to_dict` without importing anything.

    Raises:
        ValueError: an unknown kind, or a plain function (it has no name to find it by again).
    """
    kind = data.get("kind")
    if kind in BUILTIN_METRICS:
        return BUILTIN_METRICS[kind]()
    if kind == "entry_point":
        return EntryPointMetric(str(data["spec"]), direction=data["direction"], name=data.get("name"))
    if kind == "callable":
        raise ValueError(f"Metric {data.get('name')!r} was a Python function passed directly; it cannot be "
                         f"re-created from a saved description. Give it as 'module:function' instead.")
    raise ValueError(f"Unknown metric kind {kind!r}.")
