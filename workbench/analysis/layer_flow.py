"""Which layers feed which: producers and consumers of each quantizable layer, from one recorded forward.

The fusion clean-up of the precision ladder asks whether a layer runs alone in its format between neighbours in
another. Neighbours in module order are not neighbours in the data flow: ViT's ``v_proj`` is a sibling of
``k_proj`` (both read the block's normalised input), not "between" it and ``o_proj``; DETR's parallel branches
likewise. So the neighbours are read from the calls themselves: one sample runs through the model while a torch
function mode tags every tensor with the layers it was computed from (through any number of non-layer operations:
norms, activations, reshapes, attention arithmetic), and each layer's call records the tags of its inputs.

Works on any forward that runs (no tracing needed); a model that cannot run the sample gives no flow (None), and
the caller falls back to module order.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from workbench.quant.algorithms.batches import run_model

logger = logging.getLogger(__name__)

__all__ = ["LayerFlow", "record_layer_flow", "flow_from_mapping"]


@dataclass
class LayerFlow:
    """``producers[layer]``: the layers whose outputs reach ``layer``'s inputs (through non-layer operations);
    ``consumers[layer]``: the layers that read what it computes. A layer reading the model's input has no producer;
    one writing the model's output (only) has no consumer."""

    producers: dict[str, set[str]]
    consumers: dict[str, set[str]]

    def neighbours(self, layer: str) -> set[str]:
        return self.producers.get(layer, set()) | self.consumers.get(layer, set())


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


class _Tags(TorchFunctionMode):
    """Tags each tensor an operation outside the layers computes with the union of its inputs' tags."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[int, frozenset[str]] = {}
        self.alive: list[torch.Tensor] = []  # ids stay unique while the tagged tensors live
        self.depth = 0  # inside a layer's own forward: its output is tagged when it returns

    def of(self, value: Any) -> set[str]:
        found: set[str] = set()
        for tensor in _tensors(value):
            found |= self.tags.get(id(tensor), frozenset())
        return found

    def tag(self, value: Any, sources: Iterable[str]) -> None:
        sources = frozenset(sources)
        for tensor in _tensors(value):
            self.tags[id(tensor)] = sources
            self.alive.append(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.depth == 0:
            sources = self.of((args, kwargs))
            if sources:
                self.tag(out, sources)
        return out


def record_layer_flow(model: nn.Module, layers: Iterable[str], batch: Any, device: torch.device) -> LayerFlow | None:
    """Run ``batch`` through ``model`` once (no gradients) and record which of ``layers`` (module names) feed which.

    None when the forward fails (the error is logged): the caller falls back to another order.
    """
    names = [name for name in layers]
    modules = dict(model.named_modules())
    producers: dict[str, set[str]] = {name: set() for name in names}
    mode = _Tags()
    handles = []

    def before(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if mode.depth == 0:
                producers[name] |= mode.of((args, kwargs))
            mode.depth += 1
        return hook

    def after(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            mode.depth -= 1
            if mode.depth == 0:
                mode.tag(output, {name})
        return hook

    try:
        for name in names:
            module = modules.get(name)
            if module is None:
                continue
            handles.append(module.register_forward_pre_hook(before(name), with_kwargs=True))
            handles.append(module.register_forward_hook(after(name), with_kwargs=True))
        with torch.no_grad(), mode:
            run_model(model, batch, device)
    except Exception as error:  # noqa: BLE001 - any failure only costs the data-flow view
        logger.info("layer data flow not recorded (module order is used instead): %s", error)
        return None
    finally:
        for handle in handles:
            handle.remove()
    consumers: dict[str, set[str]] = {name: set() for name in names}
    for name, sources in producers.items():
        sources.discard(name)
        for source in sources:
            consumers.setdefault(source, set()).add(name)
    return LayerFlow(producers, consumers)


def flow_from_mapping(producers: Mapping[str, Iterable[str]]) -> LayerFlow:
    """A :class:`LayerFlow` from a producers map (tests, and flows stored elsewhere)."""
    prod = {name: set(sources) for name, sources in producers.items()}
    consumers: dict[str, set[str]] = {name: set() for name in prod}
    for name, sources in prod.items():
        for source in sources:
            consumers.setdefault(source, set()).add(name)
    return LayerFlow(prod, consumers)
