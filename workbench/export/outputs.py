"""Which of a model's outputs the ONNX graph returns, and under which names.

A model returns a tensor, or a structure of them: a Hugging Face ``ModelOutput`` (``logits``, ``pred_boxes``,
``last_hidden_state``...), a dict, a tuple, nested any way. The export keeps every tensor of it, each an ONNX
output named after where it sits: the key (``pred_boxes``), the keys and indices down to it joined by dots
(``encoder.hidden``, ``output_1.0`` for the first tensor of a tuple in second place). A single tensor is
``output``; a flat tuple of tensors gives ``output_0``, ``output_1``... Whatever is not a tensor (None, a cache
object, an integer) is left out, and a tensor the model returns twice (the same object under two names) is one
output, the first name, with a note.

The user may pick outputs by name (``export --outputs logits,pred_boxes``): a name selects that tensor, or every
tensor under it (``encoder`` selects ``encoder.hidden`` and ``encoder.attn``).

An input and an output with one name (diffusers' UNet takes ``sample`` and returns ``sample``) cannot both be
graph values (ONNX graphs are in single static assignment form): the output gets ``_out`` after its name
(:func:`distinct_from_inputs`), and the report says so.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["NamedOutputs", "named_tensors", "pick_outputs", "distinct_from_inputs"]


@dataclass
class NamedOutputs:
    """The tensors the graph returns, their names, and what was left out (with why)."""

    names: list[str]
    tensors: list[torch.Tensor]
    notes: list[str] = field(default_factory=list)


def _walk(value: Any, path: str, found: list[tuple[str, Any]]) -> None:
    if isinstance(value, torch.Tensor):
        found.append((path, value))
    elif isinstance(value, Mapping):  # a dict, or a ModelOutput (its fields that are not None)
        for key, item in value.items():
            _walk(item, f"{path}.{key}" if path else str(key), found)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _walk(item, f"{path}.{index}" if path else f"output_{index}", found)
    elif value is not None:
        found.append((path, value))  # not a tensor: reported, not exported


def named_tensors(output: Any) -> NamedOutputs:
    """Every tensor of a model ``output``, in order, named after its place (see the module docstring)."""
    found: list[tuple[str, Any]] = []
    _walk(output, "", found)
    if isinstance(output, torch.Tensor):
        found = [("output", output)]
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    notes: list[str] = []
    seen: dict[int, str] = {}
    skipped: list[str] = []
    for name, value in found:
        if not isinstance(value, torch.Tensor):
            skipped.append(f"{name} ({type(value).__name__})")
            continue
        if id(value) in seen:
            notes.append(f"output {name} is the same tensor as {seen[id(value)]}: exported once, as "
                         f"{seen[id(value)]}")
            continue
        seen[id(value)] = name
        names.append(name)
        tensors.append(value)
    if names == ["output_0"]:  # a tuple holding one tensor: the model's one output
        names = ["output"]
    if skipped:
        notes.append("not tensors, so not graph outputs: " + ", ".join(skipped))
    return NamedOutputs(names, tensors, notes)


def pick_outputs(named: NamedOutputs, wanted: Sequence[str] | None) -> NamedOutputs:
    """The outputs ``wanted`` names (each a name, or a prefix naming every tensor under it), in the model's order.

    Raises:
        ValueError: a wanted name matches no output (the message lists the names there are).
    """
    if not wanted:
        return named
    unknown = [w for w in wanted if not any(n == w or n.startswith(w + ".") for n in named.names)]
    if unknown:
        raise ValueError(f"The model returns no output named {', '.join(map(repr, unknown))}; its outputs are: "
                         f"{', '.join(named.names)}.")
    keep = [i for i, n in enumerate(named.names) if any(n == w or n.startswith(w + ".") for w in wanted)]
    left = [n for i, n in enumerate(named.names) if i not in keep]
    notes = list(named.notes)
    if left:
        notes.append(f"outputs left out as asked (--outputs {','.join(wanted)}): {', '.join(left)}")
    return NamedOutputs([named.names[i] for i in keep], [named.tensors[i] for i in keep], notes)


def distinct_from_inputs(output_names: Sequence[str], input_names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The output names with those an input also has renamed (``sample`` -> ``sample_out``, or ``sample_out_2``
    where that is taken too), and one note per rename for the report."""
    taken = set(input_names) | set(output_names)
    renamed: list[str] = []
    notes: list[str] = []
    for name in output_names:
        if name in input_names:
            new = f"{name}_out"
            count = 2
            while new in taken:
                new = f"{name}_out_{count}"
                count += 1
            taken.add(new)
            notes.append(f"output {name!r} renamed {new!r}: an input has that name, and an ONNX graph names each "
                         "value once")
            name = new
        renamed.append(name)
    return renamed, notes
