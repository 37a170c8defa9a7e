"""A new project's choices, read the same way by every front end: the model factory's arguments, how
images become inputs, and the project's first settings.

The command line (``workbench new``) and the GUI's New Project wizard both build their request here, so
that the same choices give the same project whichever way they were typed.
"""
from __future__ import annotations

import json
from typing import Any

import yaml

from workbench import bounded_json
from workbench.project.settings import SettingsError, checked_setting
from workbench.session.errors import SessionError
from workbench.sources.data_source import ImageOptions

__all__ = ["DEFAULT_IMAGE_OPTIONS", "factory_arguments", "image_options", "new_project_settings", "parse_value"]

# How image files become tensors unless the user says otherwise: pixels in [0, 1], no resize, no crop.
# A model trained on normalised inputs needs its own mean and std (e.g. ImageNet's 0.485, 0.456, 0.406 /
# 0.229, 0.224, 0.225): both front ends ask for them, and neither guesses.
DEFAULT_IMAGE_OPTIONS = ImageOptions()


def parse_value(text: str) -> Any:
    """A value typed as text: true/false/yes/no/on/off, none/null, a JSON number, list or mapping, else the text."""
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("none", "null"):
        return None
    try:
        return bounded_json.loads(text)
    except json.JSONDecodeError:
        return text


def factory_arguments(text: str | None) -> dict[str, Any]:
    """The model factory's keyword arguments from what the user typed: ``name=value`` pairs separated by
    commas (``num_classes=10,pretrained=false``) or a YAML/JSON mapping (``num_classes: 10, pretrained: false``).

    Raises:
        SessionError: neither form, saying what was expected.
    """
    text = (text or "").strip()
    if not text:
        return {}
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if all("=" in part and ":" not in part.split("=", 1)[0] for part in parts):
        return {key.strip(): parse_value(value.strip()) for key, value in (part.split("=", 1) for part in parts)}
    try:
        value = yaml.safe_load(text if text.startswith("{") else "{" + text + "}")
    except yaml.YAMLError as error:
        raise SessionError(f"The factory arguments are name=value pairs or a YAML/JSON mapping; {text!r} is "
                           f"neither ({str(error).splitlines()[0]}).") from None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise SessionError(f"The factory arguments are name=value pairs or a YAML/JSON mapping, got {text!r}.")
    return value


def image_options(*, resize: int | None = None, crop: int | None = None, mean: tuple[float, ...] | None = None,
                  std: tuple[float, ...] | None = None, grayscale: bool = False) -> ImageOptions:
    """How a folder of images becomes inputs: what the user gave, :data:`DEFAULT_IMAGE_OPTIONS` for the rest
    (one value of mean/std for grayscale images, three for colour ones)."""
    channels = 1 if grayscale else 3
    default_mean, default_std = DEFAULT_IMAGE_OPTIONS.mean[:1] * channels, DEFAULT_IMAGE_OPTIONS.std[:1] * channels
    return ImageOptions(resize=resize or DEFAULT_IMAGE_OPTIONS.resize, crop=crop or DEFAULT_IMAGE_OPTIONS.crop,
                        mean=tuple(mean) if mean else default_mean, std=tuple(std) if std else default_std,
                        grayscale=grayscale)


def new_project_settings(*, metric: str | None = None, direction: str | None = None) -> dict[str, Any]:
    """The settings a new project starts with besides the defaults, checked (SessionError when not valid).

    ``direction`` only counts for a user metric (``module:function``); a built-in one has its own.
    """
    settings: dict[str, Any] = {}
    if metric and metric.strip():
        name = metric.strip()
        settings["metric"] = {"name": name, "direction": direction if ":" in name else None}
    try:
        return {key: checked_setting(key, value) for key, value in settings.items()}
    except SettingsError as error:
        raise SessionError(str(error)) from None
