"""Editing layers' decisions: a descriptor change, a reset to the defaults, a precision, each applied to the
project all or nothing and then, where a rebuild would give the same model, to the live quantized model in place.

Each edit is planned (and checked) by :mod:`workbench.session.decisions` before anything changes, applied to the
project's decisions, and returned as a :class:`LayerEdit` (the layers' decisions before it, and the notes the
user should read). :func:`apply_in_place` then swaps the edited quantizers of the model built before the edit
(see :mod:`workbench.session.in_place`); when it cannot, the caller rebuilds. The Session owns the model and
calls these with what they need; nothing here knows of it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.project import Project
from workbench.project.settings import DefaultDescriptors
from workbench.quant.algorithms.precision import Precision
from workbench.session import decisions, in_place
from workbench.session.build import BuildReport

__all__ = ["LayerEdit", "layer_state", "edit_descriptor", "edit_precision", "reset_descriptor", "apply_in_place"]


@dataclass
class LayerEdit:
    """What one edit did to the project's layer decisions.

    ``before``: each changed layer's decision before the edit (its keys are the changed layers, in order);
    ``notes``: what the edit accepted but the user should know (4-bit: simulation only), or None for an edit
    that says nothing about notes (a reset keeps the last edit's).
    """

    before: dict[str, in_place.LayerState] = field(default_factory=dict)
    notes: list[str] | None = None

    @property
    def changed(self) -> list[str]:
        """The layers whose decision changed."""
        return list(self.before)


def layer_state(project: Project, name: str) -> in_place.LayerState:
    """The layer's decision as :mod:`workbench.session.in_place` compares them: quantize, input and weight
    descriptors."""
    decision = project.layers[name]
    return decision.quantize, decision.input_desc, decision.weight_desc


def edit_descriptor(project: Project, model: nn.Module, names: Iterable[str], role: str, fields: dict[str, Any],
                    defaults: DefaultDescriptors | None = None) -> LayerEdit:
    """Change descriptor fields of the ``role`` ("input" or "weight") quantizer of layers (checked by
    :func:`~workbench.session.decisions.plan_descriptor` against ``model``, the quantized model now); every layer
    is validated before any changes, so an error (:class:`SessionError`, naming the layer) leaves all of them as
    they were. ``defaults`` (the project's default descriptors): a descriptor edited back to its default or its
    precision's is stored as :func:`~workbench.session.decisions.plan_descriptor` says (no override, or the
    precision's own)."""
    updates, notes = decisions.plan_descriptor(project, model, names, role, fields, defaults)
    before = {name: layer_state(project, name) for name in updates}
    for name, updated in updates.items():
        setattr(project.layers[name], f"{role}_desc", updated)
    return LayerEdit(before, notes)


def edit_precision(project: Project, model: nn.Module, defaults: DefaultDescriptors, names: Iterable[str],
                   precision: Precision | str, **options: Any) -> LayerEdit:
    """Run layers in ``precision``: their quantize flag and both descriptors become the precision's
    (:func:`~workbench.session.decisions.plan_precision`, which checks every layer first)."""
    plans = decisions.plan_precision(project, model, defaults, names, precision, **options)
    before = {name: layer_state(project, name) for name in plans}
    for name, (quantize, input_desc, weight_desc) in plans.items():
        decision = project.layers[name]
        decision.quantize, decision.input_desc, decision.weight_desc = quantize, input_desc, weight_desc
    return LayerEdit(before, [])


def reset_descriptor(project: Project, names: Iterable[str], role: str | None = None) -> LayerEdit:
    """Back to the layer type's default descriptor (both roles unless ``role`` is given)."""
    names = list(names)
    before = {name: layer_state(project, name) for name in names if name in project.layers}
    changed = decisions.reset_descriptor(project, names, role)
    return LayerEdit({name: before[name] for name in changed})


def apply_in_place(model: nn.Module | None, project: Project, edit: LayerEdit, *, defaults: DefaultDescriptors,
                   report: BuildReport, device: torch.device) -> bool:
    """Put the edited layers' new descriptors into ``model`` (built from the decisions before ``edit``) without a
    rebuild, where that gives the same model; ``report`` (its build report) learns what is restored and stale.

    Returns False, with ``model`` untouched, when only a rebuild gives the right model (a change to or from
    float, a shared quantizer; see :mod:`workbench.session.in_place`) or there is no model (``None``: not built).
    """
    if model is None:
        return False
    after = {name: layer_state(project, name) for name in edit.before}
    changes = in_place.layer_changes(model, edit.before, after, defaults,
                                     switches=in_place.switches_in_place(model, report))
    return changes is not None and in_place.swap_layers(
        model, changes.roles, calibration=project.current_calibration, finetune=project.current_finetune,
        report=report, device=device, off=changes.off, on=changes.on) is not None
