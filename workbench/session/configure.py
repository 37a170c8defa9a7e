"""Checking a change of a project's settings before the :class:`~workbench.session.Session` applies it:
every value checked before any is applied, the typed settings made from the stored ones, and the device a
distributed job runs on.

Functions of plain values; the session applies what they return (one rebuild of the quantized model for
the lot, and the project as it was when a change cannot be built). The settings themselves are defined in
:mod:`workbench.project.settings`.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from workbench.project.settings import SECTIONS, ProjectSettings, SettingsError, checked_setting
from workbench.quant.algorithms.distributed import SINGLE, DistContext
from workbench.session.errors import SessionError

__all__ = ["checked_value", "typed_settings", "changed_settings", "updated_section", "job_device"]


def checked_value(key: str, value: Any) -> Any:
    """A setting's value as the project stores it, checked by its dataclass (:func:`checked_setting`), plus
    whether its metric exists; SessionError if not."""
    try:
        checked = checked_setting(key, value)
        if key == "metric":
            from workbench.analysis import get_metric

            get_metric(checked["name"], checked["direction"])  # the name, an entry point's form; imports nothing
    except (SettingsError, ValueError, TypeError) as error:
        raise SessionError(str(error)) from None
    return checked


def typed_settings(stored: dict[str, Any],
                   cached: tuple[dict[str, Any], ProjectSettings] | None) -> tuple[dict[str, Any], ProjectSettings]:
    """``(stored copy, typed settings)`` for the project's stored settings: ``cached`` while the stored ones
    are still what it was made from (code may edit ``project.settings`` directly), else made again, so the
    typed settings never disagree with what a save writes."""
    if cached is None or cached[0] != stored:
        try:
            typed = ProjectSettings.from_stored(stored)
        except SettingsError as error:
            raise SessionError(f"The project's settings: {error}") from None
        cached = (copy.deepcopy(stored), typed)
    return cached


def changed_settings(current: ProjectSettings, changes: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``changes`` that differ from ``current``, each checked (:func:`checked_value`).

    Raises:
        SessionError: ``changes`` is not a mapping, or a key or value is refused (nothing is applied then).
    """
    if not isinstance(changes, dict):
        raise SessionError(f"settings are changed with a mapping of name to value, got {type(changes).__name__}.")
    checked = {key: checked_value(key, value) for key, value in changes.items()}
    return {key: value for key, value in checked.items() if value != current.stored(key)}


def updated_section(current: ProjectSettings, key: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The stored value of the mapping setting ``key`` with ``fields`` changed and the others kept."""
    if key not in SECTIONS:
        raise SessionError(f"{key!r} is not a setting with fields; settings with fields are {', '.join(SECTIONS)}.")
    return {**current.stored(key), **fields}


def job_device(context: DistContext | None, device: torch.device) -> tuple[DistContext, torch.device | None]:
    """A job's distributed context, and the device the models must move to for it (None: they stay on
    ``device``): on nccl, this rank's GPU."""
    context = context or SINGLE
    if context.backend == "nccl" and context.device is not None and context.device != device:
        return context, context.device
    return context, None
