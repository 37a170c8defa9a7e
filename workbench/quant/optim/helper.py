"""Parameter grouping and freezing for quantization-aware fine-tuning."""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence

import torch
from torch import nn

logger = logging.getLogger(__name__)


def match_parameters(model: nn.Module, patterns: Sequence[str]) -> Iterator[nn.Parameter]:
    """Yield the parameters whose name matches any of ``patterns`` (``re.search``)."""
    compiled = [re.compile(p) for p in patterns]
    for name, param in model.named_parameters():
        if any(p.search(name) for p in compiled):
            yield param


def group_parameters(model: nn.Module, patterns_list: Sequence[Sequence[str]], lrs=None, momentums=None,
                     weight_decays=None) -> list[dict]:
    """Parameter groups for a torch optimizer, one per list of patterns, with optional per-group options.

    Raises:
        TypeError: ``patterns_list`` is not a list of lists, or an option list has the wrong length.
    """
    groups = []
    for patterns in patterns_list:
        if not isinstance(patterns, list):
            raise TypeError("patterns_list must be list of list of patterns")
        groups.append({"params": match_parameters(model, patterns)})
    for key, values in (("lr", lrs), ("momentum", momentums), ("weight_decay", weight_decays)):
        if values is None:
            continue
        if len(values) != len(patterns_list):
            raise TypeError(f"len({key}s) must match len(patterns_list)")
        for group, value in zip(groups, values):
            group[key] = value
    return groups


def freeze_parameters(model: nn.Module, patterns: Sequence[str]) -> None:
    """Set ``requires_grad=False`` on parameters whose name matches any pattern (``re.search``)."""
    for name, param in model.named_parameters():
        if any(re.search(p, name) for p in patterns):
            logger.info("Freeze %s.", name)
            param.requires_grad = False


def quant_weight_inplace(model: nn.Module) -> None:
    """Replace every quantized module's weight by its quantized value (e.g. for relax-and-round)."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if hasattr(module, "_weight_quantizer") and module.weight_quantizer is not None:
                if not module.weight_quantizer.fake_quant:
                    logger.warning("In-place real quantization of %s: for inference only.", name)
                module.weight.data.copy_(module.weight_quantizer(module.weight))
