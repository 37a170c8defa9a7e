"""Changing a project's settings as session jobs: every value checked before any is applied, one rebuild
of the quantized model for the lot, and the project as it was when a change cannot be built.

Functions of a :class:`~workbench.session.Session` (its methods call them), like
:mod:`workbench.session.tensorrt`. The settings themselves are defined in :mod:`workbench.project.settings`.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from workbench.project.settings import REBUILD_SETTINGS, SECTIONS, ProjectSettings, SettingsError, checked_setting
from workbench.quant.distributed import SINGLE, DistContext
from workbench.session.errors import SessionError
from workbench.session.events import SessionEvent

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["checked_value", "typed_settings", "set_settings", "update_setting", "add_pins", "set_device", "join"]


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


def typed_settings(session: Session) -> ProjectSettings:
    """The session's typed settings, made again from the stored ones only when those changed since the last
    read (code may edit ``project.settings`` directly), so they never disagree with what a save writes."""
    stored = session.project.settings
    if session._settings is None or session._settings[0] != stored:
        try:
            typed = ProjectSettings.from_stored(stored)
        except SettingsError as error:
            raise SessionError(f"The project's settings: {error}") from None
        session._settings = (copy.deepcopy(stored), typed)
    return session._settings[1]


def set_device(session: Session, device: str) -> None:
    """Move the session's models to ``device``; SessionError if the machine has none such."""
    target = torch.device(checked_value("device", device))
    session.device = target
    session.project.settings["device"] = str(target)
    session.float_model.to(target)
    session._folded = None  # its folded weights are its own tensors, on the old device
    if session._quant_model is not None:
        session._quant_model.to(target)


def join(session: Session, context: DistContext | None) -> DistContext:
    """A job's distributed context; on nccl the models move to this rank's GPU (the project keeps its device
    setting)."""
    context = context or SINGLE
    if context.backend == "nccl" and context.device is not None and context.device != session.device:
        setting = session.settings.device
        set_device(session, str(context.device))
        session.project.settings["device"] = setting
    return context


def set_settings(session: Session, changes: dict[str, Any]) -> None:
    """Change project settings (rules, pins, defaults, functional, calibration, metric, export, device,
    fold_bn, finetune) together.

    Every key and value is checked first: an unknown key or a bad value raises :class:`SessionError`
    and leaves the project as it was. Then all are applied, with one rebuild of the quantized model
    (when a setting it is built from changed). Values equal to the current ones change nothing.
    """
    if not isinstance(changes, dict):
        raise SessionError(f"settings are changed with a mapping of name to value, got {type(changes).__name__}.")
    checked = {key: checked_value(key, value) for key, value in changes.items()}
    current = session.settings
    checked = {key: value for key, value in checked.items() if value != current.stored(key)}
    if not checked:
        return
    previous = {key: copy.deepcopy(session.project.settings.get(key)) for key in checked}
    previous_device = session.device
    try:
        if "device" in checked:
            session.set_device(checked["device"])
        session.project.settings.update(checked)
        if "functional" in checked:  # functional quantizers add or remove layers
            session._sync_layers()
    except Exception:
        # checked values can still fail to build (a pin naming no quantizer): back to how it was
        session.project.settings.update(previous)
        if session.device != previous_device:
            session.set_device(str(previous_device))
        session._quant_model = None
        raise
    if checked.keys() & REBUILD_SETTINGS:
        session._invalidate()
    session._changed(SessionEvent.SETTINGS, keys=sorted(checked))
    if checked.keys() & REBUILD_SETTINGS:
        session._changed(SessionEvent.LAYERS, names=list(session.project.layers))


def update_setting(session: Session, key: str, **fields: Any) -> None:
    """Change some fields of a mapping setting (rules, functional, calibration, export, metric, finetune),
    keeping the others: ``update_setting("rules", maxpool=False)``. Checked as :meth:`set_settings`."""
    if key not in SECTIONS:
        raise SessionError(f"{key!r} is not a setting with fields; settings with fields are {', '.join(SECTIONS)}.")
    session.set_settings({key: {**session.settings.stored(key), **fields}})


def add_pins(session: Session, pairs: Iterable[Sequence[str]]) -> None:
    """Share one quantizer between each pair of quantizers or layers (TensorRT scale sharing).

    The names are checked by building the model: a pin naming no quantizer raises SessionError and
    leaves the pins as they were.
    """
    previous = session.settings.stored("pins")
    session.set_setting("pins", previous + [list(pair) for pair in pairs])
    try:
        session.quantized_model()
    except Exception as error:
        session.project.settings["pins"] = previous
        session._quant_model = None
        raise SessionError(f"pins: {error}") from error
