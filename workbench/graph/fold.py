"""Fold eval-mode BatchNorm into the Conv / ConvTranspose / Linear layer that feeds it.

TensorRT folds ``conv -> batch norm`` into one convolution before it quantizes the weights, so the
per-channel weight amax that matters is the one of the *folded* weight. :func:`fold_batchnorm` does
the same to a PyTorch model before quantizers are placed: with ``scale = gamma / sqrt(var + eps)``
the layer's weight becomes ``W * scale`` (per output channel) and its bias ``(b - mean) * scale +
beta``; the BatchNorm is replaced by an ``nn.Identity`` under the same name, so every other name in
the model (and in a project's layer decisions) stays valid. A following ReLU is kept as it is:
TensorRT fuses conv + bias + ReLU on its own.

Pairs are found in the traced graph (:func:`workbench.graph.trace_pieces`), not by looking at
``nn.Sequential`` neighbours: ``self.bn1(self.conv1(x))`` inside a ``forward`` is a pair as much as
``nn.Sequential(conv, bn)``. A BatchNorm is left alone, with the reason in the report, when folding
would change what the model computes: the layer's output is also read elsewhere (the other reader
would see the folded values), the layer or the BatchNorm is called more than once, the BatchNorm is
fed by something else, it has no running statistics, or it sits in code that could not be traced.

Folding never writes into existing tensors: a folded layer gets new weight and bias parameters, so a
model that shares tensors with another one (the workbench's quantized model shares the user's float
model's) leaves the other one untouched.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.nn.utils import parametrize

from workbench.graph.batchnorm import batchnorm_eps, batchnorm_features, is_batchnorm
from workbench.graph.trace import TraceFailure, trace_pieces
from workbench.graph.tree import add_note
from workbench.plurals import count_text
from workbench.quant.algorithms.snapshot import ModelSnapshot, holds_quantizers, owned_quantizers
from workbench.quant.switches import disable_quantization

logger = logging.getLogger(__name__)

__all__ = ["FoldedPair", "SkippedBatchNorm", "FoldReport", "fold_batchnorm", "find_foldable", "folded_weights",
           "FOLD_TOLERANCE"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_ACTIVATIONS = (nn.ReLU, nn.ReLU6)
# Largest relative change of the outputs (max |diff| / max |reference|) accepted when folding is
# checked on an example input; exact folding in float64 stays around 1e-7.
FOLD_TOLERANCE = 1e-5


@dataclass(frozen=True)
class FoldedPair:
    """A BatchNorm folded into the layer before it."""

    layer: str                 # qualified name of the Conv/ConvTranspose/Linear that now holds the BN
    bn: str                    # qualified name of the BatchNorm (now an nn.Identity)
    activation: str | None = None  # a ReLU reading the BN's output, kept as it is

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "bn": self.bn, "activation": self.activation}


@dataclass(frozen=True)
class SkippedBatchNorm:
    """A BatchNorm left in the model, and why."""

    bn: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"bn": self.bn, "reason": self.reason}


@dataclass
class FoldReport:
    """What :func:`fold_batchnorm` folded and left alone."""

    folded: list[FoldedPair] = field(default_factory=list)
    skipped: list[SkippedBatchNorm] = field(default_factory=list)
    failures: list[TraceFailure] = field(default_factory=list)
    max_relative_error: float | None = None  # measured on the example input, when one was given

    @property
    def folded_into(self) -> dict[str, str]:
        """layer name -> name of the BatchNorm folded into it."""
        return {pair.layer: pair.bn for pair in self.folded}

    def summary(self) -> str:
        text = f"folded {count_text(len(self.folded), 'BatchNorm')}"
        if self.skipped:
            text += f", left {len(self.skipped)} ({'; '.join(f'{s.bn}: {s.reason}' for s in self.skipped[:3])}"
            text += "...)" if len(self.skipped) > 3 else ")"
        if self.max_relative_error is not None:
            text += f", outputs within {self.max_relative_error:.1e} relative"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"folded": [p.to_dict() for p in self.folded], "skipped": [s.to_dict() for s in self.skipped],
                "failures": [str(f) for f in self.failures], "max_relative_error": self.max_relative_error}


@dataclass
class _Candidate:
    layer: str
    bn: str
    activation: str | None


def _is_foldable_layer(module: nn.Module) -> bool:
    return isinstance(module, _CONVS + _TRANSPOSED + (nn.Linear,))


def _out_channels(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else module.out_channels


def find_foldable(model: nn.Module) -> tuple[list[_Candidate], list[SkippedBatchNorm], list[TraceFailure]]:
    """The (layer, BatchNorm) pairs of ``model`` that can be folded, the BatchNorms that cannot and why.

    Nothing is changed. Names are qualified names in ``model``.
    """
    pieces, failures = trace_pieces(model)
    names_of: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names_of.setdefault(id(module), []).append(name)
    calls: dict[int, int] = {}  # module object -> number of call sites over every traced graph
    bn_sites: list[tuple[Any, fx.Node, nn.Module, str]] = []
    for piece in pieces:
        for node in piece.graph_module.graph.nodes:
            if node.op != "call_module":
                continue
            module = piece.graph_module.get_submodule(node.target)
            calls[id(module)] = calls.get(id(module), 0) + 1
            if is_batchnorm(module):
                bn_sites.append((piece, node, module, piece.qualified(node.target)))

    candidates: list[_Candidate] = []
    skipped: list[SkippedBatchNorm] = []
    seen_bns: set[int] = set()
    for piece, node, bn, bn_name in bn_sites:
        if id(bn) in seen_bns:
            continue
        seen_bns.add(id(bn))
        reason = None
        source = node.args[0] if node.args else None
        layer_module = None
        if calls.get(id(bn), 0) > 1 or len(names_of.get(id(bn), [])) > 1:
            reason = "the BatchNorm is used more than once"
        elif bn.running_mean is None or bn.running_var is None:
            reason = "it has no running statistics (track_running_stats=False)"
        elif len(node.args) != 1 or node.kwargs:
            reason = "it is called with extra arguments"
        elif not isinstance(source, fx.Node) or source.op != "call_module":
            what = "the model input" if isinstance(source, fx.Node) and source.op == "placeholder" else (
                f"'{source.name}'" if isinstance(source, fx.Node) else "a constant")
            reason = f"it is fed by {what}, not by a Conv/ConvTranspose/Linear layer"
        else:
            layer_module = piece.graph_module.get_submodule(source.target)
            layer_name = piece.qualified(source.target)
            if not _is_foldable_layer(layer_module):
                reason = (f"it is fed by {layer_name} ({type(layer_module).__name__}), not by a "
                          "Conv/ConvTranspose/Linear")
            elif (not isinstance(layer_module._parameters.get("weight"), nn.Parameter)
                  or parametrize.is_parametrized(layer_module)):
                reason = f"the weight of {layer_name} is computed (weight norm or a parametrization)"
            elif holds_quantizers(layer_module) and _calibrated(layer_module):
                # a quantized layer not yet calibrated (pytorch-quantization's initialize() built it) folds: its
                # quantizers have seen nothing; a calibrated one's weight amax belongs to the unfolded weight
                reason = (f"{layer_name} is quantized and calibrated already (its weight amax is of the unfolded "
                          "weight): fold before calibrating, or recalibrate after folding")
            elif len(source.users) != 1:
                others = sorted(user.name for user in source.users if user is not node)
                reason = f"the output of {layer_name} is also read by {', '.join(others)}"
            elif calls.get(id(layer_module), 0) > 1 or len(names_of.get(id(layer_module), [])) > 1:
                reason = f"{layer_name} is used more than once"
            elif _out_channels(layer_module) != batchnorm_features(bn):
                reason = (f"{layer_name} has {_out_channels(layer_module)} output channels, the BatchNorm "
                          f"{batchnorm_features(bn)}")
            elif isinstance(layer_module, nn.Linear) and not isinstance(bn, nn.BatchNorm1d):
                reason = f"{type(bn).__name__} after a Linear layer normalises another dimension"
        if reason is not None:
            skipped.append(SkippedBatchNorm(bn_name, reason))
            continue
        activation = None
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_module":
            follower = piece.graph_module.get_submodule(users[0].target)
            if isinstance(follower, _ACTIVATIONS):
                activation = piece.qualified(users[0].target)
        candidates.append(_Candidate(piece.qualified(source.target), bn_name, activation))

    # BatchNorms no traced graph calls: inside code that could not be traced, or not used at all
    for name, module in model.named_modules():
        if is_batchnorm(module) and id(module) not in seen_bns:
            owner = next((f for f in failures if f.name == name.rpartition(".")[0]), None)
            reason = (f"its owner {owner.name or '<model>'} could not be traced ({owner.reason})" if owner is not None
                      else "it is not called in any traced forward")
            skipped.append(SkippedBatchNorm(name, reason))
    return candidates, skipped, failures


def folded_weights(layer: nn.Module, bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``layer`` with ``bn`` (eval-mode statistics) folded in, as new tensors.

    Computed in float64 and returned in the layer's dtype, so the folded layer matches the pair to
    about 1e-7 relative in float32.
    """
    weight = layer.weight.detach()
    dtype = weight.dtype
    mean = bn.running_mean.detach().double()
    var = bn.running_var.detach().double()
    gamma = bn.weight.detach().double() if bn.weight is not None else torch.ones_like(mean)
    beta = bn.bias.detach().double() if bn.bias is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + batchnorm_eps(bn))
    bias = layer.bias.detach().double() if layer.bias is not None else torch.zeros_like(mean)
    w = weight.double()
    if isinstance(layer, _TRANSPOSED):
        # weight is (in, out / groups, *kernel): output channel g * out_per_group + j sits at [g-th
        # block of inputs, j]
        groups = layer.groups
        in_channels, out_per_group = w.shape[:2]
        shaped = w.reshape(groups, in_channels // groups, out_per_group, *w.shape[2:])
        factor = scale.reshape(groups, 1, out_per_group, *([1] * (w.dim() - 2)))
        w = (shaped * factor).reshape(w.shape)
    else:
        w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    b = (bias - mean) * scale + beta
    return w.to(dtype), b.to(dtype)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def _relative_error(reference: Any, output: Any) -> float:
    from workbench.quant.algorithms.batches import flat_tensors

    worst = 0.0
    for ref, out in zip(flat_tensors(reference), flat_tensors(output)):
        if not ref.is_floating_point():
            continue
        scale = float(ref.detach().double().abs().max()) if ref.numel() else 0.0
        diff = float((ref.detach().double() - out.detach().double()).abs().max()) if ref.numel() else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _linear_bn_inputs(model: nn.Module, candidates: list[_Candidate], example: Sequence[Any]) -> tuple[Any, dict]:
    """Run the model once on ``example``: its output and the input rank of each Linear pair's BatchNorm."""
    ranks: dict[str, int] = {}
    handles = []
    for candidate in candidates:
        if isinstance(model.get_submodule(candidate.layer), nn.Linear):
            bn = model.get_submodule(candidate.bn)

            def hook(module, inputs, name=candidate.bn):
                ranks[name] = inputs[0].dim()

            handles.append(bn.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            output = model(*example)
    finally:
        for handle in handles:
            handle.remove()
    return output, ranks


def fold_batchnorm(model: nn.Module, *, inplace: bool = False, example_inputs: Sequence[Any] | None = None,
                   skip: Iterable[str] = (), tolerance: float = FOLD_TOLERANCE) -> tuple[nn.Module, FoldReport]:
    """Fold every foldable eval-mode BatchNorm of ``model`` into the layer before it.

    Args:
        model: a float model, or one whose quantized layers are not calibrated yet (built under
            ``quant_modules.initialize()``): fold before calibrating.
        inplace: change ``model``'s module tree (a folded layer still gets *new* weight and bias
            tensors; the old ones are not written to). Default: fold a deep copy.
        example_inputs: positional inputs for one forward pass. When given, a Linear + BatchNorm1d
            pair is only folded if the BatchNorm sees 2-D inputs (on 3-D inputs it normalises another
            dimension than the Linear's features), and the outputs before and after are compared:
            beyond ``tolerance`` (relative to the largest output) nothing is folded and the report
            says why. A model that fails on the example is folded without the check.
        skip: BatchNorm names to leave alone.

    Returns:
        ``(model, report)``: the folded model (``model`` itself when ``inplace``) and a :class:`FoldReport`.
        BatchNorm statistics are the running ones (eval mode), whatever mode the model is in.
    """
    if not inplace:
        model = copy.deepcopy(model)
    candidates, skipped, failures = find_foldable(model)
    report = FoldReport(skipped=skipped, failures=failures)
    skip = set(skip)
    for candidate in [c for c in candidates if c.bn in skip]:
        report.skipped.append(SkippedBatchNorm(candidate.bn, "left alone on request"))
    candidates = [c for c in candidates if c.bn not in skip]
    if not candidates:
        return model, report

    reference = None
    if example_inputs is not None:
        # eval mode for the check only; quantizers off, so a layer built quantized compares its float computation
        with ModelSnapshot(model), disable_quantization(model):
            model.eval()
            try:
                reference, ranks = _linear_bn_inputs(model, candidates, example_inputs)
            except Exception as error:  # the user's model on a synthetic input: fold without the check
                logger.info("BatchNorm folding not checked: the model failed on the example input (%s: %s)",
                            type(error).__name__, error)
                reference, ranks = None, {}
        for candidate in list(candidates):
            if ranks.get(candidate.bn, 2) != 2:
                candidates.remove(candidate)
                report.skipped.append(SkippedBatchNorm(candidate.bn, f"it normalises {ranks[candidate.bn]}-D inputs "
                                                       f"of {candidate.layer}: not the Linear's features"))

    undo: list[tuple[nn.Module, str, Any, str]] = []  # (owner, attribute, old value, kind)
    for candidate in candidates:
        layer = model.get_submodule(candidate.layer)
        bn = model.get_submodule(candidate.bn)
        weight, bias = folded_weights(layer, bn)
        # new Parameters: never write into tensors another model may share
        undo.append((layer, "weight", layer._parameters["weight"], "param"))
        undo.append((layer, "bias", layer._parameters.get("bias"), "param"))
        layer._parameters["weight"] = nn.Parameter(weight, requires_grad=layer.weight.requires_grad)
        layer._parameters["bias"] = nn.Parameter(bias, requires_grad=layer.weight.requires_grad)
        parent, attr = _parent(model, candidate.bn)
        identity = nn.Identity()
        identity.training = bn.training
        undo.append((parent, attr, bn, "module"))
        parent._modules[attr] = identity
        # "folded bn1" next to block.conv1; a Sequential's "folded stem.1" says more than "folded 1"
        short = candidate.bn.rpartition(".")[2]
        add_note(layer, f"folded {candidate.bn if short.isdigit() else short}")
        add_note(identity, f"folded into {candidate.layer}")
        report.folded.append(FoldedPair(candidate.layer, candidate.bn, candidate.activation))

    if reference is not None:
        with ModelSnapshot(model), disable_quantization(model), torch.no_grad():
            model.eval()
            output = model(*example_inputs)
        report.max_relative_error = _relative_error(reference, output)
        if report.max_relative_error > tolerance:
            for owner, attr, old, kind in reversed(undo):
                if kind == "module":
                    owner._modules[attr] = old
                else:
                    owner._parameters[attr] = old
                    if kind == "param" and attr == "weight":
                        _drop_note(owner)
            reason = (f"folding changed the outputs by {report.max_relative_error:.2e} relative (more than "
                      f"{tolerance:g}): left unfolded")
            report.skipped.extend(SkippedBatchNorm(pair.bn, reason) for pair in report.folded)
            logger.warning("BatchNorm folding %s", reason)
            report.folded = []
    return model, report


def _calibrated(module: nn.Module) -> bool:
    """Whether a quantizer of ``module`` holds an amax (from calibration or set by hand)."""
    return any(q.has_amax for _, q in owned_quantizers(module))


def _drop_note(module: nn.Module) -> None:
    notes = getattr(module, "_workbench_notes", None)
    if notes:
        module._workbench_notes = tuple(n for n in notes if not n.startswith("folded "))
