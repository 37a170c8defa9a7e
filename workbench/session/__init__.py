"""The service layer both front ends call: projects, layer decisions, calibration, sensitivity, export.

One idea a module: :mod:`~workbench.session.core` is the :class:`Session` (open, save, and every job a
user can run; it owns the models, settings and results, and composes the modules named by idea:
``data_sources``, ``decisions``, ``configure``, ``calibration``, ``analysis``, ``ladder``, ``smoothing``,
``finetuning``, ``exports``, ``tensorrt``, ``paths``, ``in_place``, ``layer_edits``, which receive what they
need and return results and records, never touching the Session or importing its module),
:mod:`~workbench.session.build` builds the quantized model from a project,
:mod:`~workbench.session.views` holds the read-only views the front ends show,
:mod:`~workbench.session.events` tells them what changed, and the project's settings are
:mod:`workbench.project.settings`.
"""
from workbench.project.settings import DEFAULT_SETTINGS, REBUILD_SETTINGS, ProjectSettings
from workbench.session.build import BuildReport, Built, build_quantized, descriptor_of
from workbench.session.core import Session
from workbench.session.errors import SessionError
from workbench.session.events import Event, EventEmitter, SessionEvent
from workbench.session.views import LayerView, descriptor_summary, jsonable

__all__ = ["Session", "SessionError", "LayerView", "DEFAULT_SETTINGS", "REBUILD_SETTINGS", "ProjectSettings",
           "descriptor_of", "descriptor_summary", "jsonable", "BuildReport", "Built", "build_quantized", "Event",
           "EventEmitter", "SessionEvent"]
