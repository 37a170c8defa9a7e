"""Per-input-channel smoothing of GEMM layers: SmoothQuant and an AWQ-style activation-aware scale search.

Both move range between a Linear layer's input and its weight with one factor per input channel ``s``:
``y = (x / s) @ (W * s).T`` equals ``x @ W.T`` in exact arithmetic, but the quantizers see ``x / s`` and
``W * s``. SmoothQuant (Xiao et al.) takes ``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)`` so that a
few outlier activation channels stop dominating an INT8 activation range. AWQ (Lin et al.) keeps the
activations in float and searches ``s = mean|X| ** a`` over a grid of ``a`` for the one that minimises the
layer's output error with quantized (INT4 blockwise) weights.

``1 / s`` is folded into the operation that produces the input (a LayerNorm's weight and bias, or a
Linear's output rows) when that producer feeds nothing but the smoothed layers; otherwise it stays on
the input quantizer as its ``pre_quant_scale`` (exported as a Mul before the Q/DQ pair). Layers reading
the same tensor (the q, k and v projections after one LayerNorm) share one ``s``, so the fold stays exact.

The float model is never changed: :func:`apply_smoothing` gives the quantized model new weight tensors,
so dropping the record and rebuilding restores the original weights exactly.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.batches import flat_tensors, model_inputs, to_device
from workbench.quant.algorithms.precision import DEFAULT_BLOCK_SIZE
from workbench.quant.algorithms.residency import DerivedWeight
from workbench.quant.gemm import known_linear_like
from workbench.quant.kernels.blocks import block_view, unblock
from workbench.quant.nn.modules.quant_gemm import QuantConv1D
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["transposed_weight", "is_linear_like",
           "SMOOTHING_METHODS", "LayerSmoothing", "SmoothingError", "smoothquant_scales", "plan_smoothing",
           "apply_smoothing", "int4_blockwise_fake_quant", "smoothing_summary", "describe_smoothing", "InputStatistics",
           "plan_groups", "fold_keeps_output", "checked_method", "linear_layers", "AWQ_ROWS"]

SMOOTHING_METHODS = ("smoothquant", "awq")
AWQ_GRID = 20  # a in 0, 0.05, ..., 0.95 (AWQ's own grid)
AWQ_ROWS = 2048  # input rows kept per layer for the AWQ error (enough for a stable mean squared error)
_FOLD_RTOL = 1e-4  # a fold must keep the float model's output to this relative error
_FOLD_EPS = 8  # ... or to this many epsilons of the output's dtype (bf16, fp16), whichever is more
_MIN_SCALE = 1e-5


class SmoothingError(ValueError):
    """A layer cannot be smoothed (not a Linear, no input reached it, a shape that does not fit)."""


@dataclass
class LayerSmoothing:
    """One layer's smoothing: its weight's input columns are multiplied by ``scales``, its input divided.

    ``folded_into`` names the module whose output rows (weight and bias) carry ``1 / scales`` (None: the
    input quantizer's ``pre_quant_scale`` does, exported as a Mul). ``alpha`` is SmoothQuant's strength or
    the exponent AWQ's search chose.
    """

    layer: str
    method: str
    alpha: float
    scales: torch.Tensor
    folded_into: str | None = None
    error_before: float | None = None  # AWQ: the layer's output error without and with the scales
    error_after: float | None = None

    def describe(self) -> str:
        return describe_smoothing(self.method, self.alpha, float(self.scales.min()), float(self.scales.max()),
                                  self.folded_into)


def describe_smoothing(method: str, alpha: float, low: float, high: float, folded_into: str | None) -> str:
    """One line for a layer's smoothing, as ``show`` and the layer panel print it."""
    name = "SmoothQuant" if method == "smoothquant" else "AWQ"
    where = f"1/s folded into {folded_into}" if folded_into else "1/s as a Mul before the input quantizer"
    return f"{name} alpha={alpha:g} (scales {low:.3g}..{high:.3g}, {where})"


def smoothing_summary(items: Iterable[LayerSmoothing]) -> dict[str, Any]:
    """How many layers each method smooths and how many of them fold into the producer."""
    items = list(items)
    return {"layers": len(items), "folded": sum(1 for i in items if i.folded_into),
            "methods": sorted({i.method for i in items})}


def smoothquant_scales(act_amax: torch.Tensor, weight_amax: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's ``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)`` per input channel.

    Channels that never saw a non-zero input or weight keep ``s = 1`` (dividing by zero helps no one).
    """
    if not (0.0 <= alpha <= 1.0):
        raise SmoothingError(f"SmoothQuant's alpha must be in [0, 1], got {alpha!r}.")
    act = act_amax.float().clamp(min=_MIN_SCALE)
    weight = weight_amax.float().clamp(min=_MIN_SCALE)
    scales = act.pow(alpha) / weight.pow(1.0 - alpha)
    dead = (act_amax <= 0) | (weight_amax <= 0) | ~torch.isfinite(scales)
    return torch.where(dead, torch.ones_like(scales), scales.clamp(min=_MIN_SCALE))


def int4_blockwise_fake_quant(weight: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Symmetric INT4 fake quantization of a ``[out, in]`` weight in blocks of ``block_size`` along ``in``,
    each block scaled by its own max |w| (7 steps each side), as the int4w precision's max calibration does."""
    blocked = block_view(weight.float(), 0, block_size)
    scale = blocked.abs().amax(dim=-1, keepdim=True).clamp(min=2 ** -24) / 7.0
    quantized = torch.clamp(torch.round(blocked / scale), -8, 7) * scale
    return unblock(quantized, weight.shape, 0).to(weight.dtype)


# ----- statistics ------------------------------------------------------------------------------


@dataclass
class _Stats:
    amax: torch.Tensor | None = None
    abs_sum: torch.Tensor | None = None
    rows: int = 0
    samples: list[torch.Tensor] = field(default_factory=list)
    kept: int = 0


def transposed_weight(module: nn.Module) -> bool:
    """Whether ``module`` is Hugging Face's ``Conv1D`` (GPT-2's projections) or its quantized class: a Linear whose
    weight is stored ``[in, out]``."""
    if isinstance(module, QuantConv1D):
        return True
    known = known_linear_like(type(module))
    return known is not None and known[1] is QuantConv1D


def is_linear_like(module: nn.Module) -> bool:
    """A Linear, or a Linear with its weight transposed (Hugging Face's Conv1D): what smoothing applies to."""
    return isinstance(module, nn.Linear) or transposed_weight(module)


def _out_in(module: nn.Module) -> torch.Tensor:
    """The layer's weight as ``[out, in]`` (a view: Conv1D stores it ``[in, out]``)."""
    return module.weight.t() if transposed_weight(module) else module.weight


def linear_layers(model: nn.Module, names: Sequence[str]) -> dict[str, nn.Linear]:
    """The modules named ``names``; SmoothingError for a name the model lacks or a module that is not a Linear."""
    modules = dict(model.named_modules())
    layers = {}
    for name in names:
        module = modules.get(name)
        if module is None:
            raise SmoothingError(f"{name!r} is not a module of the model.")
        if not is_linear_like(module):
            raise SmoothingError(f"{name}: smoothing applies to Linear layers (nn.Linear, or Hugging Face's Conv1D: "
                                 f"a weight read by a GEMM); this is a {type(module).__name__}.")
        layers[name] = module
    return layers


class InputStatistics:
    """Per-channel input statistics of the layers to smooth, collected by hooks on the modules of a model or of one
    of its blocks, and which of those layers read one tensor (and that tensor's producer), read from the first
    batch's data flow.

    Args:
        layers: the layers by their names in the model.
        keep_rows: input rows kept per layer (AWQ's search runs on them).
    """

    def __init__(self, layers: dict[str, nn.Module], keep_rows: int) -> None:
        self.layers = layers
        self.keep_rows = keep_rows
        self.stats = {name: _Stats() for name in layers}
        self.groups: dict[str, list[str]] = {}  # first layer -> the layers reading its input
        self.producers: dict[str, str | None] = {}  # first layer -> the LayerNorm/Linear that produced that input
        self.batches = 0
        self._inputs_seen: dict[int, list[str]] = {}  # id of an input tensor -> modules that read it (first batch)
        self._outputs_of: dict[int, str] = {}  # id of an output tensor -> the LayerNorm/Linear that produced it
        self._alive: list[torch.Tensor] = []  # keeps ids unique during the first batch

    def _pre_hook(self, name: str) -> Callable[[nn.Module, tuple], None]:
        def record(module: nn.Module, args: tuple) -> None:
            if not args or not isinstance(args[0], torch.Tensor):
                return
            x = args[0]
            if self.batches == 0:
                self._alive.append(x)
                self._inputs_seen.setdefault(id(x), []).append(name)
            item = self.stats.get(name)
            if item is None:
                return
            flat = x.detach().float().reshape(-1, x.shape[-1])
            amax = flat.abs().amax(dim=0).cpu()
            total = flat.abs().sum(dim=0).cpu()
            item.amax = amax if item.amax is None else torch.maximum(item.amax, amax)
            item.abs_sum = total if item.abs_sum is None else item.abs_sum + total
            item.rows += flat.shape[0]
            if item.kept < self.keep_rows:
                take = flat[: self.keep_rows - item.kept].cpu()
                item.samples.append(take)
                item.kept += take.shape[0]
        return record

    def _out_hook(self, name: str) -> Callable[[nn.Module, tuple, Any], None]:
        def record(module: nn.Module, args: tuple, output: Any) -> None:
            if self.batches == 0 and isinstance(output, torch.Tensor):
                self._alive.append(output)
                self._outputs_of[id(output)] = name
        return record

    @contextmanager
    def hooks(self, root: nn.Module, prefix: str = "") -> Iterator[None]:
        """Within it, the modules of ``root`` (the model, or its submodule named ``prefix`` without its final dot)
        record what they read; call :meth:`batch_done` after each batch."""
        handles = []
        for relative, module in root.named_modules():
            name = prefix + relative if relative else prefix.rstrip(".")
            if len(module._modules) == 0 or name in self.layers:  # leaves: every module that may read a tensor
                handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            if isinstance(module, nn.LayerNorm) or is_linear_like(module):
                handles.append(module.register_forward_hook(self._out_hook(name)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def batch_done(self) -> None:
        """One batch went through: after the first, the groups and producers are read from its data flow."""
        if self.batches == 0:
            self.groups, self.producers = _groups(self.layers, self._inputs_seen, self._outputs_of)
            self._alive.clear()
            self._inputs_seen.clear()
            self._outputs_of.clear()
        self.batches += 1

    def check_reached(self) -> None:
        """SmoothingError when no batch ran, or when one of the layers saw none."""
        if self.batches == 0:
            raise SmoothingError("No calibration batch reached the model: nothing to compute smoothing scales from.")
        missing = [name for name, item in self.stats.items() if item.amax is None]
        if missing:
            one = len(missing) == 1
            raise SmoothingError(f"No calibration batch reached {', '.join(missing[:5])}: no input statistics for "
                                 f"{'it' if one else 'them'}; leave {'it' if one else 'them'} out of the smoothing.")


def _groups(layers: dict[str, nn.Linear], inputs_seen: dict[int, list[str]],
            outputs_of: dict[int, str]) -> tuple[dict[str, list[str]], dict[str, str | None]]:
    groups: dict[str, list[str]] = {}
    producers: dict[str, str | None] = {}
    placed: set[str] = set()
    for tensor_id, readers in inputs_seen.items():
        ours = [r for r in dict.fromkeys(readers) if r in layers and r not in placed]
        if not ours:
            continue
        groups[ours[0]] = ours
        placed.update(ours)
        others = [r for r in readers if r not in layers]
        producer = outputs_of.get(tensor_id)
        # a producer reading its own output or feeding other modules too cannot carry 1/s
        producers[ours[0]] = producer if producer is not None and not others and producer not in ours else None
    for name in layers:  # a layer called on a tensor its hooks saw twice (shared weights) stays alone
        if name not in placed:
            groups[name], producers[name] = [name], None
    return groups, producers


# ----- planning ---------------------------------------------------------------------------------


def _awq_scales(layers: list[nn.Linear], stats: list[_Stats],
                weight_quant: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, torch.Tensor, float, float]:
    """AWQ's grid search for one group: the exponent ``a`` of ``s = mean|X| ** a`` with the least output
    error when the group's weights are quantized by ``weight_quant``. Returns (a, s, error at a=0, best error)."""
    x = torch.cat(stats[0].samples)[:AWQ_ROWS]
    mean_abs = sum(item.abs_sum for item in stats) / sum(item.rows for item in stats)
    weight = torch.cat([_out_in(layer).detach().float().cpu() for layer in layers], dim=0)
    reference = x @ weight.T
    best = (math.inf, 0.0, torch.ones_like(mean_abs))
    first_error = math.nan
    for step in range(AWQ_GRID):
        a = step / AWQ_GRID
        scales = mean_abs.clamp(min=_MIN_SCALE).pow(a)
        scales = scales / (scales.max() * scales.min()).sqrt()  # centred, as AWQ does: no overall gain
        quantized = weight_quant(weight * scales)
        error = float(((x / scales) @ quantized.T - reference).pow(2).mean())
        if step == 0:
            first_error = error
        if error < best[0]:
            best = (error, a, scales)
    return best[1], best[2], first_error, best[0]


def _structural_copy(model: nn.Module) -> nn.Module:
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def _fold_keeps_output(model: nn.Module, items: list[LayerSmoothing], batch: Any, device: torch.device) -> bool:
    """Whether folding ``items`` (one producer) into a copy of the float model keeps its output on ``batch``."""
    def run(module: nn.Module) -> Any:
        args, kwargs = model_inputs(to_device(batch, device))
        return module(*args, **kwargs)
    return fold_keeps_output(model, items, run)


def fold_keeps_output(module: nn.Module, items: list[LayerSmoothing], run: Callable[[nn.Module], Any],
                      prefix: str = "") -> bool:
    """Whether folding ``items`` (one producer) into a structural copy of ``module`` (the float model, or its block
    named ``prefix``) keeps what ``run(copy)`` returns to :data:`_FOLD_RTOL` of its largest value."""
    trial = _structural_copy(module)
    relative = [dataclasses.replace(item, layer=item.layer[len(prefix):],
                                    folded_into=item.folded_into[len(prefix):] if item.folded_into else None)
                for item in items]
    _scale_weights(trial, relative, fold=True)
    with torch.no_grad():
        reference = flat_tensors(run(module))
        output = flat_tensors(run(trial))
    for a, b in zip(reference, output):
        if a.shape != b.shape:
            return False
        # a bf16/fp16 model's folded weights are rounded to its dtype: an exact fold then parts by about half its
        # epsilon (3.8e-3 on a bf16 GPT-2, 4.7e-4 in fp16, 1.2e-7 in fp32); a wrong one by the order of the values
        tolerance = max(_FOLD_RTOL, _FOLD_EPS * torch.finfo(a.dtype).eps) if a.is_floating_point() else _FOLD_RTOL
        a, b = a.float(), b.float()
        if float((a - b).abs().max()) > tolerance * max(float(a.abs().max()), 1e-6):
            return False
    return len(reference) == len(output)


def plan_smoothing(model: nn.Module, layers: Sequence[str], batches: Iterable, *, method: str = "smoothquant",
                   alpha: float = 0.5, device: torch.device | str = "cpu", block_size: int = DEFAULT_BLOCK_SIZE,
                   weight_quant: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[LayerSmoothing]:
    """Compute smoothing scales for the Linear ``layers`` of the float ``model`` on calibration ``batches``.

    ``method`` is ``"smoothquant"`` (with strength ``alpha``) or ``"awq"`` (which searches its exponent,
    quantizing weights with ``weight_quant``, by default INT4 blockwise with ``block_size``). The model is
    not changed; each group of layers reading one tensor gets one set of scales, folded into that tensor's
    producer (LayerNorm or Linear) when a trial fold on the first batch keeps the model's output.

    Raises:
        SmoothingError: an unknown method, alpha outside [0, 1], a layer that is not a Linear or that no
            batch reached.
    """
    checked_method(method, alpha)
    device = torch.device(device)
    found = linear_layers(model, layers)
    if not found:
        return []
    batches = list(batches)
    collected = InputStatistics(found, AWQ_ROWS if method == "awq" else 0)
    with collected.hooks(model), torch.no_grad():
        for batch in batches:
            args, kwargs = model_inputs(to_device(batch, device))
            model(*args, **kwargs)
            collected.batch_done()
    collected.check_reached()
    quantize = weight_quant or (lambda w: int4_blockwise_fake_quant(w, block_size))
    return plan_groups(model, collected, method, alpha, quantize,
                       lambda items: _fold_keeps_output(model, items, batches[0], device))


def checked_method(method: str, alpha: float) -> None:
    """SmoothingError for an unknown method, or SmoothQuant's alpha outside [0, 1]."""
    if method not in SMOOTHING_METHODS:
        raise SmoothingError(f"Unknown smoothing method {method!r}; choose one of {', '.join(SMOOTHING_METHODS)}.")
    if method == "smoothquant" and not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise SmoothingError(f"SmoothQuant's alpha must be a number in [0, 1], got {alpha!r}.")


def plan_groups(model: nn.Module, collected: InputStatistics, method: str, alpha: float,
                quantize: Callable[[torch.Tensor], torch.Tensor],
                keeps_output: Callable[[list[LayerSmoothing]], bool], prefix: str = "") -> list[LayerSmoothing]:
    """The smoothing of each group of ``collected``'s layers (their weights in memory now), from its statistics:
    one set of scales per group, folded into the group's producer where that fits and ``keeps_output(items)``
    says a trial fold keeps the output. ``model`` is the model, or its block named ``prefix`` (its modules are
    found without that prefix)."""
    def module(name: str) -> nn.Module:
        return model.get_submodule(name[len(prefix):])

    planned: list[LayerSmoothing] = []
    for head, members in collected.groups.items():
        modules = [module(m) for m in members]
        stats = [collected.stats[m] for m in members]
        if method == "smoothquant":
            act = torch.stack([item.amax for item in stats]).amax(dim=0)
            weight_amax = torch.stack([_out_in(mod).detach().abs().amax(dim=0).float().cpu() for mod in modules])
            scales = smoothquant_scales(act, weight_amax.amax(dim=0), float(alpha))
            chosen, before, after = float(alpha), None, None
        else:
            chosen, scales, before, after = _awq_scales(modules, stats, quantize)
        items = [LayerSmoothing(m, method, chosen, scales.clone(), None, before, after) for m in members]
        producer = collected.producers.get(head)
        if producer is not None and _foldable(module(producer), scales.numel()):
            for item in items:
                item.folded_into = producer
            if not keeps_output(items):
                for item in items:
                    item.folded_into = None
        planned.extend(items)
    return planned


def _foldable(module: nn.Module, channels: int) -> bool:
    if isinstance(module, nn.LayerNorm):
        return module.weight is not None and module.weight.numel() == channels
    return is_linear_like(module) and _out_in(module).shape[0] == channels


# ----- applying ---------------------------------------------------------------------------------


def _replace(module: nn.Module, attr: str, factor: torch.Tensor, derived: list[DerivedWeight] | None) -> None:
    """A new parameter ``attr`` of ``module``: the old one times ``factor`` (see :class:`DerivedWeight`); one on meta
    (a lazily opened model) is added to ``derived``, to be computed when its block is loaded."""
    old = module._parameters[attr]
    # on meta: made without touching the old one's data, which a streamed build would read from the checkpoint
    value = torch.empty(old.shape, dtype=old.dtype, device="meta") if old.is_meta else \
        DerivedWeight.compute(old, (factor,))
    new = nn.Parameter(value, requires_grad=old.requires_grad)
    module._parameters[attr] = new
    if derived is not None and new.is_meta:
        earlier = next((item for item in derived if item.target is old), None)  # a producer smoothed itself too
        if earlier is not None:
            derived.remove(earlier)
        derived.append(earlier.then(new, factor) if earlier is not None else DerivedWeight(new, old, (factor,)))


def _scale_weights(model: nn.Module, items: Sequence[LayerSmoothing], *, fold: bool,
                   derived: list[DerivedWeight] | None = None) -> set[str]:
    """W * s on every item's layer and, with ``fold``, 1/s on the producers; returns the producers folded."""
    folded: dict[str, torch.Tensor] = {}
    for item in items:
        layer = model.get_submodule(item.layer)
        scales = item.scales.to(torch.float32)
        # the input channels are the weight's columns ([out, in]), or its rows for a Conv1D ([in, out])
        _replace(layer, "weight", scales[:, None] if transposed_weight(layer) else scales, derived)
        if fold and item.folded_into:
            previous = folded.setdefault(item.folded_into, item.scales)
            if previous is not item.scales and not torch.equal(previous, item.scales):
                raise SmoothingError(f"{item.layer}: its scales differ from those of the other layers folded into "
                                     f"{item.folded_into}; smooth the layers reading one tensor together.")
    for name, scales in folded.items():
        producer = model.get_submodule(name)
        inverse = 1.0 / scales.to(torch.float32)
        if transposed_weight(producer):  # a Conv1D's output channels are its weight's columns
            _replace(producer, "weight", inverse[None, :], derived)
        elif isinstance(producer, nn.Linear):
            _replace(producer, "weight", inverse[:, None], derived)
        else:
            _replace(producer, "weight", inverse, derived)
        if producer.bias is not None:
            _replace(producer, "bias", inverse, derived)
    return set(folded)


def apply_smoothing(model: nn.Module, items: Sequence[LayerSmoothing],
                    derived: list[DerivedWeight] | None = None) -> list[str]:
    """Give the quantized ``model`` the smoothing ``items``: new weight tensors ``W * s`` for each layer and
    ``1 / s`` folded into the producer or set as the input quantizer's ``pre_quant_scale``.

    Parameters are replaced, never written to, so a model sharing its tensors with the float model leaves
    that one unchanged. Returns the names of the producers folded into. A weight still on meta (a lazily opened
    model) gets a new parameter on meta, added to ``derived``: :class:`~workbench.quant.algorithms.residency.
    WithDerivedWeights` computes it from the checkpoint's weight each time its block is loaded.

    Raises:
        SmoothingError: a layer missing from the model, a weight whose input size differs from the scales,
            an input quantizer that already has a ``pre_quant_scale``. A layer left in float whose 1/s is
            not folded is skipped (it computes exactly what the float layer does).
    """
    modules = dict(model.named_modules())
    for item in items:
        layer = modules.get(item.layer)
        if layer is None or not isinstance(getattr(layer, "weight", None), torch.Tensor) or layer.weight.dim() != 2:
            raise SmoothingError(f"{item.layer}: smoothing was recorded for a Linear layer of that name, but the "
                                 "model has none now; clear the smoothing (calibrate --smoothquant off).")
        if _out_in(layer).shape[1] != item.scales.numel():
            raise SmoothingError(f"{item.layer}: {item.scales.numel()} smoothing scales recorded, the weight has "
                                 f"{_out_in(layer).shape[1]} input channels; smooth again.")
        if item.folded_into and item.folded_into not in modules:
            raise SmoothingError(f"{item.layer}: smoothing was folded into {item.folded_into}, which the model no "
                                 "longer has; smooth again.")
        if not item.folded_into:
            quantizer = getattr(layer, "_input_quantizer", None)
            if not isinstance(quantizer, TensorQuantizer):
                continue  # left in float: unsmoothed, it computes exactly what the float layer does
            if quantizer.pre_quant_scale is not None:
                raise SmoothingError(f"{item.layer}: its input quantizer already has a pre_quant_scale (shared "
                                     "with another layer?); smooth one of them only.")
    # a float layer (no input quantizer) whose 1/s is not folded is simply not smoothed
    items = [item for item in items if item.folded_into
             or isinstance(getattr(modules[item.layer], "_input_quantizer", None), TensorQuantizer)]
    folded = _scale_weights(model, items, fold=True, derived=derived)
    for item in items:
        if not item.folded_into:
            quantizer = modules[item.layer]._input_quantizer
            weight = modules[item.layer].weight  # on meta while lazily opened: the scale is made in memory
            quantizer.pre_quant_scale = (1.0 / item.scales.float()).to("cpu" if weight.is_meta else weight.device)
    return sorted(folded)
