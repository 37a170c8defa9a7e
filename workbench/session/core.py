"""The session: one open project and the things a user can do with it.

A :class:`Session` owns one project (plain data, saved by :mod:`workbench.project`) and the live
models built from it: the float model from the project's model source and the quantized model
(:func:`workbench.session.build.build_quantized`). Its methods are the user's actions: create, open and
save a project; choose data; select layers and edit their descriptors; change settings; calibrate,
rank sensitivity, search a fallback, evaluate, fine-tune and export. Long jobs take a
``progress(done, total, message)`` callback and a ``cancel`` token with ``is_set()`` and never touch
Qt: the GUI runs them in a worker thread, the CLI with a tqdm bar. What the front ends show is read
through :mod:`workbench.session.views`.
"""
from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench import __version__
from workbench.graph import ModelTree, describe_model
from workbench.graph.fold import FoldReport
from workbench.project import (
    CalibrationRecord,
    ExportRecord,
    FallbackRecord,
    FinetuneRecord,
    LayerDecision,
    Project,
    QuantizerRecord,
    SensitivityRecord,
    file_revision,
    load_project,
    save_project,
)
from workbench.project.model import now_iso
from workbench.project.settings import DEFAULT_SETTINGS, REBUILD_SETTINGS, SettingsError, checked_setting, jsonable
from workbench.project.settings import make_descriptor
from workbench.quant import TensorQuantizer
from workbench.quant.calib import DEFAULT_AMAX_METHOD, PERCENTILE, AmaxMethod, HistogramCalibrator
from workbench.quant.calibrate import CalibrationResult, CancelToken, ProgressCallback, calibrate
from workbench.quant.batches import first_samples, input_shapes, model_inputs, run_model, to_device
from workbench.quant.distributed import SINGLE, DistContext
from workbench.quant.replace import ignore_matcher
from workbench.quant.snapshot import quantizer_names
from workbench.quant.tensorrt_rules import tensorrt_check
from workbench.session import tensorrt, views
from workbench.session.exports import check_overwrite, export_digest, resolve_export_path, stored_export_path
from workbench.session.build import BuildReport, build_quantized, descriptor_of, fold_base, layer_of, quantizable
from workbench.session.build import role_quantizer, to_numpy
from workbench.session.errors import SessionError
from workbench.session.events import EventEmitter, SessionEvent
from workbench.session.views import LayerView
from workbench.sources.data_source import DataSource, DataSpec, InputSpec, check_input, open_data
from workbench.sources.errors import EntryPointError, SourceError, TrustRequired
from workbench.sources.model_source import LoadedModel, ModelSpec, load_model
from workbench.sources.paths import absolute_entrypoint, absolute_path, relative_entrypoint, relative_path
from workbench.sources.trust import CHANGED, TRUSTED, UNKNOWN, CodeReference, code_references, remember_trust
from workbench.sources.trust import trust_status

logger = logging.getLogger(__name__)

__all__ = ["Session"]


class Session:
    """One open project and its live models. Not thread-safe: one job at a time."""

    def __init__(self, project: Project, *, path: Path | None = None, base_dir: Path | None = None,
                 trust_code: bool = False) -> None:
        if project.model is None:
            raise SessionError("The project has no model source.")
        self.project = project
        self.path = path
        self.base_dir = base_dir or (path.parent if path is not None else Path.cwd())
        self.trust_code = trust_code
        self.dirty = False
        self.events = EventEmitter()  # what changed, for the front ends (see workbench.session.events)
        self.who = "this command"  # who opened the file, for the message when another process saved it meanwhile
        self.merged_on_save: list[str] = []  # what the last save kept of another process's changes
        self.file_changes: list[str] = []  # model/weights files that differ from when the project was made
        self.notes: list[str] = []  # what the last edit accepted but the user should know (4-bit: simulation only)
        for key, value in DEFAULT_SETTINGS.items():
            project.settings.setdefault(key, copy.deepcopy(value))
        try:
            self._loaded: LoadedModel = load_model(project.model, trust_code=trust_code, base_dir=self.base_dir)
        except EntryPointError as error:
            raise EntryPointError(f"{error}{_moved_hint(project, self.base_dir)}") from error
        self.float_model: nn.Module = self._loaded.model
        self._data: dict[str, DataSource] = {}
        self._quant_model: nn.Module | None = None
        self.last_build_s = 0.0
        self._folded: tuple[nn.Module, FoldReport] | None = None  # the float model with BatchNorm folded
        self.build_report = BuildReport()
        self._layer_shapes: dict[str, dict[str, Any]] | None = None
        self._check_digests()
        self.device = torch.device(project.settings.get("device") or "cpu")
        self.float_model.to(self.device)

    # ----- construction -----------------------------------------------------------------------

    @classmethod
    def create(cls, model: ModelSpec, calibration: DataSpec, evaluation: DataSpec | None = None, *,
               trust_code: bool = False, input_shape: Sequence[int] | None = None, name: str | None = None,
               base_dir: Path | None = None, settings: dict[str, Any] | None = None) -> Session:
        """A new project on ``model`` with ``calibration`` data (and optional evaluation data).

        The model is loaded, its input taken from the data (or ``input_shape``), and one forward pass
        checks that the two fit. Layers start as the defaults: every quantizable layer quantized.
        """
        base = base_dir or Path.cwd()
        settings = {key: _checked(key, value) for key, value in (settings or {}).items()}
        project = Project(name=name or Path(model.target).stem or "project", model=model,
                          data={"calibration": calibration}, app_version=__version__)
        if evaluation is not None:
            project.data["evaluation"] = evaluation
        project.settings.update(settings)
        session = cls(project, base_dir=base, trust_code=trust_code)
        project.model_digests = session._loaded.digests
        data_spec = session.data("calibration").input_spec()
        if input_shape is not None:
            declared = InputSpec(tuple(int(s) for s in input_shape))
            check_input(declared, data_spec, calibration.label)
        project.input_spec = data_spec
        for role, spec in project.data.items():  # every data set now, not as an error in a later job
            if role != "calibration":
                check_input(data_spec, session.data(role).input_spec(), spec.label)
        session.check_forward()
        session._init_layers()
        session.dirty = True
        return session

    @classmethod
    def open(cls, path: str | Path, *, trust_code: bool = False, remembered: bool = True) -> Session:
        """Open a project file; the model is rebuilt and its calibration restored without recalibrating.

        ``trust_code`` lets the project's code run and remembers that trust for this file and this code
        (:mod:`workbench.sources.trust`); without it, trust remembered earlier for the same file and the
        same code applies, unless ``remembered`` is False.
        """
        path = Path(path)
        project = load_project(path)
        references = _code_references(project, path.parent)
        status = trust_status(path, references) if references and remembered and not trust_code else UNKNOWN
        try:
            session = cls(project, path=path, base_dir=path.parent, trust_code=trust_code or status == TRUSTED)
        except TrustRequired as error:
            if status != CHANGED:
                raise
            files = ", ".join(Path(f).name for r in references for f in r.files) or "its references"
            raise TrustRequired(f"{error} It was trusted before, but its code changed since ({files}): check it "
                                "before trusting it again.") from None
        if trust_code and references:
            remember_trust(path, references)
        if session.file_changes or not project.layers:
            session._sync_layers()  # the model may have new or fewer layers than the project knows
        model = session.quantized_model()  # rebuild now: errors surface on open, not on first use
        if any(name not in project.layers for name, _, _ in quantizable(model)):
            session._sync_layers()  # code changed without a file to fingerprint (a package entry point)
        return session

    def save(self, path: str | Path | None = None) -> Path:
        """Save to ``path`` (or where it was opened/last saved). Paths in the project become relative to it."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise SessionError("The project has no file yet: give a path to save it to.")
        if target.suffix == "":
            target = target.with_suffix(".qwb")
        target = target.resolve()
        if self.path is None or target.parent != self.base_dir.resolve():
            self._rebase(target.parent)
        self.project.name = self.project.name or target.stem
        report = save_project(self.project, target, who=self.who)
        if report.merged:  # another process's changes are in the project now: build from them
            self._quant_model, self._data = None, {}
            logger.info("%s: kept what another process saved meanwhile: %s", target, ", ".join(report.merged))
        self.merged_on_save = report.merged
        if self.trust_code:  # the user trusts this code (and may have added some, a metric): remember it here
            references = _code_references(self.project, target.parent)
            if references:
                remember_trust(target, references)
        self.path = target
        self.dirty = False
        self.events.emit(SessionEvent.SAVED, path=str(target))
        return target

    def changed_on_disk(self) -> bool:
        """Whether another process saved the project file since this session opened or last saved it."""
        origin = self.project.origin
        if self.path is None or origin is None:
            return False
        return file_revision(self.path) != origin.revision

    @staticmethod
    def code_references(path: str | Path) -> list[CodeReference]:
        """The code a project file would run (model, data, metric, loss) and why it needs trust, read
        without running any of it; empty for a project that runs none."""
        path = Path(path)
        return _code_references(load_project(path), path.parent)

    @staticmethod
    def trust_status(path: str | Path) -> str:
        """Whether the project's code is trusted as it is now: ``"trusted"``, ``"changed"`` (trusted before
        the code changed) or ``"unknown"`` (never trusted, or a copy); ``"trusted"`` for one with no code."""
        references = Session.code_references(path)
        return trust_status(path, references) if references else TRUSTED

    def _rebase(self, new_base: Path) -> None:
        """Rewrite relative paths of the sources so that they stay valid next to the new file."""
        self.project.model = self.project.model.absolute(self.base_dir).relative_to(new_base)
        for role, spec in list(self.project.data.items()):
            self.project.data[role] = spec.absolute(self.base_dir).relative_to(new_base)
        for key, field_name in (("metric", "name"), ("finetune", "loss")):  # user functions in files
            setting = self.project.settings.get(key)
            if isinstance(setting, dict) and isinstance(setting.get(field_name), str):
                moved = relative_entrypoint(absolute_entrypoint(setting[field_name], self.base_dir), new_base)
                self.project.settings[key] = {**setting, field_name: moved}
        export = self.project.settings.get("export")
        if isinstance(export, dict) and isinstance(export.get("path"), str):  # exports stay where they were
            self.project.settings["export"] = {**export, "path": relative_path(
                absolute_path(export["path"], self.base_dir), new_base)}
        for record in self.project.exports:
            record.path = relative_path(absolute_path(record.path, self.base_dir), new_base) or record.path
        self.base_dir = new_base
        self._data.clear()

    def _check_digests(self) -> None:
        recorded = {Path(d.path).name: d for d in self.project.model_digests}
        for digest in self._loaded.digests:
            old = recorded.get(Path(digest.path).name)
            if old is not None and old.sha256 != digest.sha256:
                self.file_changes.append(f"{digest.path} changed since the project was saved (sha256 "
                                         f"{old.sha256[:12]}... is now {digest.sha256[:12]}...); its calibration may "
                                         "no longer fit: recalibrate.")
        for message in self.file_changes:
            logger.warning(message)

    # ----- data -------------------------------------------------------------------------------

    def data(self, role: str = "calibration") -> DataSource:
        """The opened data source for ``role`` (evaluation falls back to calibration data; training data to
        all of the calibration data, shuffled)."""
        if role == "evaluation" and "evaluation" not in self.project.data:
            role = "calibration"
        if role == "training" and "training" not in self.project.data and "calibration" in self.project.data:
            spec = DataSpec.from_dict({**self.project.data["calibration"].to_dict(), "num_batches": None,
                                       "shuffle": True})
            cached = self._data.get("training")
            if cached is None or cached.spec != spec:  # follows a change of the calibration data
                self._data["training"] = open_data(spec, trust_code=self.trust_code, base_dir=self.base_dir)
            return self._data["training"]
        if role not in self.project.data:
            raise SessionError(f"The project has no {role} data.")
        if role not in self._data:
            self._data[role] = open_data(self.project.data[role], trust_code=self.trust_code, base_dir=self.base_dir)
        return self._data[role]

    def set_data(self, role: str, spec: DataSpec) -> None:
        """Replace a data source; the new inputs must fit the model (new calibration data is run through it
        once, as :meth:`create` does). A refused source leaves the project's data as it was."""
        source = open_data(spec, trust_code=self.trust_code, base_dir=self.base_dir)
        if self.project.input_spec is not None:
            check_input(self.project.input_spec, source.input_spec(), spec.label)
        previous = self.project.data.get(role), self._data.get(role)
        self.project.data[role] = spec
        self._data[role] = source
        if role == "calibration":
            try:
                self.check_forward()
            except SourceError:
                for store, old in ((self.project.data, previous[0]), (self._data, previous[1])):
                    if old is None:
                        store.pop(role, None)
                    else:
                        store[role] = old
                raise
        self._changed(SessionEvent.DATA, role=role)

    def sample_inputs(self, batch: int = 1) -> Any:
        """The first ``batch`` samples of the calibration data, on the session's device: a tensor, or a dict
        of keyword inputs (``input_ids``, ``attention_mask``...)."""
        inputs, _ = next(iter(self.data("calibration").batches(limit=1)))
        return first_samples(to_device(inputs, self.device), batch)

    def _example_inputs(self):
        """One sample, for the functional rewrite's check of traced modules; None without usable data."""
        try:
            return self.sample_inputs(batch=1)
        except Exception as error:  # no data yet, or data the model cannot take: build without the check
            logger.info("No sample input to check traced modules with: %s", error)
            return None

    def check_forward(self) -> None:
        """Run the float model on one sample batch; its error names the inputs' shapes and dtypes."""
        sample = self.sample_inputs(batch=2)
        try:
            with torch.no_grad():
                run_model(self.float_model, (sample, None), self.device)
        except Exception as error:
            raise SourceError(f"The model ({self.project.model.label}) failed on a sample input of shape "
                              f"{input_shapes(*model_inputs((sample, None)))} from "
                              f"{self.project.data['calibration'].label}: {type(error).__name__}: {error}") from error

    # ----- layers -----------------------------------------------------------------------------

    def _init_layers(self) -> None:
        self._quant_model = None
        self.project.layers = {}
        self._sync_layers()

    def _sync_layers(self) -> None:
        """Make sure every quantizable layer of the model has a decision (new ones: quantize)."""
        base, folding = self._fold_base()
        model = build_quantized(base, self.project, self.device, folding=folding, with_decisions=False,
                                example_inputs=self._example_inputs()).model
        decisions = dict(self.project.layers)
        layers: dict[str, LayerDecision] = {}
        for name, module_type, _ in quantizable(model):
            layers[name] = decisions.get(name) or LayerDecision(name, module_type, True)
        dropped = [name for name in decisions if name not in layers]
        if dropped:
            logger.warning("Layers no longer in the model, their settings dropped: %s", ", ".join(dropped[:10]))
        self.project.layers = layers
        self._quant_model = None

    def layers(self) -> list[LayerView]:
        """Every quantizable layer with its decision, descriptors, amax and sensitivity rank."""
        return views.layer_views(self)

    def tree(self) -> ModelTree:
        """The module tree of the quantized model (names, types, parameters, quantizer states)."""
        return describe_model(self.quantized_model())

    def select(self, *, names: Iterable[str] | None = None, patterns: Iterable[str] | None = None,
               types: Iterable[str] | None = None, subtree: str | None = None) -> list[str]:
        """Quantizable layers matching any of the criteria (regex patterns match like the ignore policy)."""
        chosen: list[str] = []
        all_names = list(self.project.layers)
        if names is not None:
            unknown = [n for n in names if n not in self.project.layers]
            if unknown:
                raise SessionError(f"Not quantizable layers of this model: {', '.join(unknown[:10])}.")
            chosen += list(names)
        if patterns is not None:
            matcher = ignore_matcher(list(patterns))
            chosen += [n for n in all_names if matcher(n) is not None]
        if types is not None:
            wanted = {t.removeprefix("Quant") for t in types}
            chosen += [n for n, d in self.project.layers.items() if d.type.removeprefix("Quant") in wanted]
        if subtree is not None:
            prefix = subtree.rstrip(".")
            chosen += [n for n in all_names if n == prefix or n.startswith(prefix + ".")]
        return list(dict.fromkeys(chosen))

    def ignore_preview(self, patterns: Iterable[str]) -> list[str]:
        """The layers an ignore policy (list of regexes) would leave in float, without changing anything."""
        try:
            return self.select(patterns=[p for p in patterns if p])
        except (ValueError, TypeError) as error:
            raise SessionError(str(error)) from error

    def apply_ignore_policy(self, patterns: Iterable[str], quantize_others: bool) -> list[str]:
        """Leave the layers matching any of ``patterns`` in float (the matching of :meth:`ignore_preview`);
        with ``quantize_others``, quantize every other layer. One edit (the model is rebuilt once, when next
        used); returns the ignored layers.

        Raises:
            SessionError: no pattern, an invalid regex, or a pattern that matches no layer (named); the
                layers are then as they were.
        """
        patterns = [p for p in patterns if p]
        if not patterns:
            raise SessionError("Give at least one pattern of layers to leave in float.")
        matches = {pattern: self.ignore_preview([pattern]) for pattern in patterns}
        unmatched = [pattern for pattern, names in matches.items() if not names]
        if unmatched:
            raise SessionError(f"No quantizable layer matches {', '.join(map(repr, unmatched))}; the names are as in "
                               "the model tree, matched from their start.")
        ignored = self.ignore_preview(patterns)
        self.set_quantize(ignored, False)
        if quantize_others:
            left_in_float = set(ignored)
            self.set_quantize([name for name in self.project.layers if name not in left_in_float], True)
        return ignored

    def set_quantize(self, names: Iterable[str], quantize: bool) -> list[str]:
        """Quantize or leave in float; returns the layers whose decision changed."""
        changed = []
        for name in names:
            if name not in self.project.layers:
                raise SessionError(f"{name!r} is not a quantizable layer of this model.")
            decision = self.project.layers[name]
            if decision.quantize != quantize:
                decision.quantize = quantize
                changed.append(name)
        if changed:
            self._invalidate()
            self._changed(SessionEvent.LAYERS, names=changed)
        return changed

    def set_descriptor(self, names: Iterable[str], role: str, **fields: Any) -> list[str]:
        """Change descriptor fields of the ``role`` ("input" or "weight") quantizer of layers.

        Fields are validated like :class:`QuantDescriptor`'s and against what TensorRT builds
        (:func:`~workbench.quant.tensorrt_rules.tensorrt_check`): a descriptor it cannot use raises
        SessionError with the reason; one that only simulates (4-bit) is set and explained in :attr:`notes`.
        The layer's current descriptor (override or default) is the starting point, so one call can
        change just ``num_bits``.
        """
        sim_only: dict[str, list[str]] = {}  # note -> layers
        if role not in ("input", "weight"):
            raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
        model = self.quantized_model()
        modules = dict(model.named_modules())
        updates: dict[str, dict[str, Any]] = {}
        for name in list(names):
            if name not in self.project.layers:
                raise SessionError(f"{name!r} is not a quantizable layer of this model.")
            module = modules.get(name)
            current = getattr(self.project.layers[name], f"{role}_desc")
            if current is None:
                quantizer = role_quantizer(module, role)
                if quantizer is None:
                    raise SessionError(f"{name} has no {role} quantizer.")
                current = descriptor_of(quantizer)
            updated = dict(current)
            updated.update(fields)
            updated.pop("name", None)
            try:
                made = make_descriptor(updated)
            except (TypeError, ValueError) as error:
                raise SessionError(f"{name}: {error}") from error
            verdict = tensorrt_check(role, made.num_bits, made.axis, self.project.layers[name].type)
            if verdict.error:  # refused when set, not at export
                raise SessionError(f"{name}: {verdict.error}")
            if verdict.sim_only:
                sim_only.setdefault(verdict.sim_only, []).append(name)
            if updated != current:
                updates[name] = jsonable(updated)
        # applied only once every layer validated: an error leaves all of them as they were
        for name, updated in updates.items():
            setattr(self.project.layers[name], f"{role}_desc", updated)
        self.notes = [f"{', '.join(layers)}: {note}" for note, layers in sim_only.items()]
        changed = list(updates)
        if changed:
            self._invalidate()
            self._changed(SessionEvent.LAYERS, names=changed)
        return changed

    def reset_descriptor(self, names: Iterable[str], role: str | None = None) -> list[str]:
        """Back to the layer type's default descriptor (both roles unless ``role`` is given)."""
        changed = []
        for name in names:
            decision = self.project.layers.get(name)
            if decision is None:
                raise SessionError(f"{name!r} is not a quantizable layer of this model.")
            for which in ("input", "weight") if role is None else (role,):
                if getattr(decision, f"{which}_desc") is not None:
                    setattr(decision, f"{which}_desc", None)
                    changed.append(name)
        changed = list(dict.fromkeys(changed))
        if changed:
            self._invalidate()
            self._changed(SessionEvent.LAYERS, names=changed)
        return changed

    def descriptors(self, names: Iterable[str], role: str) -> dict[str, dict[str, Any] | None]:
        """The descriptor fields each layer's ``role`` quantizer uses: its override, else the default it was built with.

        None for a layer without a quantizer for that role (a pooling layer has no weight quantizer).
        """
        if role not in ("input", "weight"):
            raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
        modules = dict(self.quantized_model().named_modules())
        result: dict[str, dict[str, Any] | None] = {}
        for name in names:
            decision = self.project.layers.get(name)
            if decision is None:
                raise SessionError(f"{name!r} is not a quantizable layer of this model.")
            quantizer = role_quantizer(modules.get(name), role)
            override = getattr(decision, f"{role}_desc")
            result[name] = None if quantizer is None else dict(override) if override is not None \
                else descriptor_of(quantizer)
        return result

    def layer_shapes(self) -> dict[str, dict[str, Any]]:
        """Input, output and weight shapes of the float model's modules, from one sample input (computed once).

        Keys are module names; values ``{"inputs": [shape, ...], "output": shape | None, "weight": shape | None}``.
        Functional layers (an fx-inserted add) are not modules of the float model and have no entry.
        """
        if self._layer_shapes is None:
            self._layer_shapes = views.layer_shapes(self.float_model, self.sample_inputs(batch=1))
        return self._layer_shapes

    def set_setting(self, key: str, value: Any) -> None:
        """Change one project setting (see :meth:`set_settings`)."""
        self.set_settings({key: value})

    def set_settings(self, changes: dict[str, Any]) -> None:
        """Change project settings (rules, pins, defaults, functional, calibration, metric, export, device,
        fold_bn, finetune) together.

        Every key and value is checked first: an unknown key or a bad value raises :class:`SessionError`
        and leaves the project as it was. Then all are applied, with one rebuild of the quantized model
        (when a setting it is built from changed). Values equal to the current ones change nothing.
        """
        if not isinstance(changes, dict):
            raise SessionError(f"settings are changed with a mapping of name to value, got {type(changes).__name__}.")
        checked = {key: _checked(key, value) for key, value in changes.items()}
        checked = {key: value for key, value in checked.items() if value != self.project.settings.get(key)}
        if not checked:
            return
        previous = {key: copy.deepcopy(self.project.settings.get(key)) for key in checked}
        previous_device = self.device
        try:
            if "device" in checked:
                self.set_device(checked["device"])
            self.project.settings.update(checked)
            if "functional" in checked:  # functional quantizers add or remove layers
                self._sync_layers()
        except Exception:
            # checked values can still fail to build (a pin naming no quantizer): back to how it was
            self.project.settings.update(previous)
            if self.device != previous_device:
                self.set_device(str(previous_device))
            self._quant_model = None
            raise
        if checked.keys() & REBUILD_SETTINGS:
            self._invalidate()
        self._changed(SessionEvent.SETTINGS, keys=sorted(checked))
        if checked.keys() & REBUILD_SETTINGS:
            self._changed(SessionEvent.LAYERS, names=list(self.project.layers))

    def update_setting(self, key: str, **fields: Any) -> None:
        """Change some fields of a mapping setting (rules, functional, calibration, export, metric, finetune),
        keeping the others: ``update_setting("rules", maxpool=False)``. Checked as :meth:`set_settings`."""
        current = self.project.settings.get(key)
        if not isinstance(current, dict):
            raise SessionError(f"{key!r} is not a setting with fields; settings with fields are "
                               f"{', '.join(k for k, v in DEFAULT_SETTINGS.items() if isinstance(v, dict))}.")
        self.set_settings({key: {**current, **fields}})

    def add_pins(self, pairs: Iterable[Sequence[str]]) -> None:
        """Share one quantizer between each pair of quantizers or layers (TensorRT scale sharing).

        The names are checked by building the model: a pin naming no quantizer raises SessionError and
        leaves the pins as they were.
        """
        previous = list(self.project.settings.get("pins") or [])
        self.set_setting("pins", previous + [list(pair) for pair in pairs])
        try:
            self.quantized_model()
        except Exception as error:
            self.project.settings["pins"] = previous
            self._quant_model = None
            raise SessionError(f"pins: {error}") from error

    def set_device(self, device: str) -> None:
        """Move the models to ``device`` (``cpu``, ``cuda``, ``cuda:N``); SessionError if there is none such."""
        target = torch.device(_checked("device", device))
        self.device = target
        self.project.settings["device"] = str(target)
        self.float_model.to(target)
        self._folded = None  # its folded weights are its own tensors, on the old device
        if self._quant_model is not None:
            self._quant_model.to(target)

    def _join(self, context: DistContext | None) -> DistContext:
        """The job's context; on nccl the models move to this rank's GPU (the project keeps its device setting)."""
        context = context or SINGLE
        if context.backend == "nccl" and context.device is not None and context.device != self.device:
            setting = self.project.settings.get("device")
            self.set_device(str(context.device))
            self.project.settings["device"] = setting
        return context

    def _invalidate(self) -> None:
        self._quant_model = None
        self.dirty = True

    def _changed(self, kind: SessionEvent, **data: Any) -> None:
        """The project changed: unsaved, and every listener is told what changed."""
        self.dirty = True
        self.events.emit(kind, **data)

    # ----- building the quantized model -------------------------------------------------------

    def quantized_model(self) -> nn.Module:
        """The quantized model for the current decisions, calibrated as far as the project knows."""
        if self._quant_model is None:
            started = time.perf_counter()
            base, folding = self._fold_base()
            built = build_quantized(base, self.project, self.device, folding=folding,
                                    example_inputs=self._example_inputs())
            self._quant_model, self.build_report = built.model, built.report
            self.last_build_s = time.perf_counter() - started
        return self._quant_model

    @property
    def needs_rebuild(self) -> bool:
        """True after a decision changed: the next use rebuilds the quantized model (``last_build_s`` says
        how long the last build took, so a front end can do it in the background when it is slow)."""
        return self._quant_model is None

    def _fold_base(self) -> tuple[nn.Module, FoldReport | None]:
        """The model quantized models are built from: the float model, with BatchNorm folded when the
        project says so (computed once; see :func:`fold_base`)."""
        if not self.project.settings.get("fold_bn", True):
            return self.float_model, None
        if self._folded is None:
            self._folded = fold_base(self.float_model, self.project.input_spec, self.device)
        return self._folded

    def folded_layers(self) -> dict[str, str]:
        """layer -> the BatchNorm folded into it, in the quantized model (empty when folding is off)."""
        self.quantized_model()
        folding = self.build_report.folding
        return dict(folding.folded_into) if folding is not None else {}

    # ----- jobs -------------------------------------------------------------------------------

    def calibrate(self, *, method: str | None = None, num_batches: int | None = None,
                  percentile: float | None = None, progress: ProgressCallback | None = None,
                  cancel: CancelToken | None = None, context: DistContext | None = None) -> CalibrationResult:
        """Calibrate on the calibration data and store the result (amax and histograms) in the project.

        With a distributed ``context`` (torchrun, ``--workers``) this process calibrates on its share
        of the batches and every rank ends with the merged, one-process result; only rank 0 should
        save the project (the session never saves on its own).
        """
        context = self._join(context)
        options = dict(self.project.settings["calibration"])
        method = method or options.get("method") or DEFAULT_AMAX_METHOD.value
        num_batches = num_batches if num_batches is not None else options.get("num_batches")
        percentile = percentile if percentile is not None else options.get("percentile", PERCENTILE.default)
        model = self.quantized_model()
        available = self.data("calibration").num_batches
        if available is not None:  # progress totals count the batches that really run
            num_batches = available if num_batches is None else min(num_batches, available)
        result = calibrate(model, self.data("calibration").batches(), num_batches=num_batches, method=method,
                           percentile=percentile, device=self.device, progress=progress, cancel=cancel,
                           context=context)
        quantizers = quantizer_names(model)
        records: dict[str, QuantizerRecord] = {}
        for name, quantizer in quantizers.items():
            item = result.quantizers.get(name) or _shared_result(result, quantizers, quantizer)
            if item is None:
                continue
            state = quantizer._calibrator.state() if quantizer._calibrator is not None else None
            records[name] = QuantizerRecord.from_calibration(item, name=name, calibrator_state=state,
                                                             descriptor=descriptor_of(quantizer))
        self.project.calibrations.append(CalibrationRecord.from_result(
            result, id=self.project.next_id(self.project.calibrations), created=now_iso(), quantizers=records,
            folded=sorted(self.folded_layers())))
        self._changed(SessionEvent.CALIBRATION)
        return result

    def recompute_amax(self, names: Iterable[str], method: str, percentile: float | None = None) -> dict[str, float]:
        """Switch quantizers to another amax method using their stored histograms (no pass over data).

        ``names`` are quantizer names (``layer._input_quantizer``) or layer names (their histogram
        quantizers). Returns the new amax per quantizer; the current calibration record is updated.
        """
        run = self.project.current_calibration
        if run is None:
            raise SessionError("Nothing is calibrated yet: calibrate first.")
        try:  # one check of the method and its parameter, before any quantizer changes
            method = AmaxMethod.parse(method).value
            percentile = PERCENTILE.check(percentile if percentile is not None else run.percentile)
        except ValueError as error:
            raise SessionError(str(error)) from None
        quantizers = quantizer_names(self.quantized_model())
        targets = []
        for name in names:
            if name in quantizers:
                targets.append(name)
            else:
                targets += [q for q in quantizers if layer_of(q)[0] == name]
        updated = {}
        for name in targets:
            quantizer = quantizers[name]
            if not isinstance(quantizer._calibrator, HistogramCalibrator):
                continue
            if quantizer._calibrator.calib_hist is None:
                raise SessionError(f"{name} has no histogram (it was not calibrated): calibrate first.")
            quantizer.load_calib_amax(method, percentile=percentile)
            quantizer._buffers["_amax"] = quantizer._amax.to(self.device)
            record = run.quantizers.get(name)
            if record is not None:
                record.amax = quantizer._amax.detach().cpu().numpy().astype(np.float32)
                record.method = method
            updated[name] = float(quantizer._amax.max())
            if self.project.current_finetune is not None:  # a range learned while fine-tuning gives way
                self.project.current_finetune.amax.pop(name, None)
        if not updated:
            raise SessionError("None of these quantizers has a histogram calibrator; use calib_method 'histogram'.")
        self._changed(SessionEvent.CALIBRATION, quantizers=list(updated))
        return updated

    def histogram(self, quantizer_name: str) -> dict[str, Any] | None:
        """Histogram counts, bin edges and the amax every method gives, for plotting; None without one."""
        quantizer = quantizer_names(self.quantized_model()).get(quantizer_name)
        if quantizer is None:
            raise SessionError(f"{quantizer_name!r} is not a quantizer of this model.")
        run = self.project.current_calibration
        return views.histogram_of(quantizer, run.quantizers.get(quantizer_name) if run else None)

    def weight_ranges(self, layer: str) -> np.ndarray | None:
        """Per-output-channel max |w| of a layer's weight (for the bar plot), or None without weights."""
        return views.weight_ranges(dict(self.quantized_model().named_modules()).get(layer))

    def metric(self):
        """The project's metric as a workbench.analysis Metric (entry points need trust)."""
        setting = self.project.settings.get("metric") or {}
        return self._metric(setting.get("name", "sqnr"), setting.get("direction"))

    def _metric(self, metric: Any, direction: str | None = None):
        """A metric by name, entry point or object; a metric file next to the project is found from any
        working directory, and user code runs only with the session's trust."""
        from workbench.analysis import get_metric

        return get_metric(metric, direction, trust_code=self.trust_code, base_dir=self.base_dir)

    def _analysis_batches(self) -> list:
        source = self.data("evaluation")
        return list(source.batches())

    def sensitivity(self, *, scheme: str = "one-off", metric: Any = None, units: Any = None,
                    num_batches: int | None = None, progress: ProgressCallback | None = None,
                    cancel: CancelToken | None = None, context: DistContext | None = None):
        """Rank layers by how much quantizing them costs; the result is stored in the project.

        With a distributed ``context`` the units are shared among the ranks (see :meth:`calibrate`).
        """
        from workbench.analysis import sensitivity as run_sensitivity

        context = self._join(context)
        model = self._require_calibrated()
        result = run_sensitivity(model, self._analysis_batches(), metric if metric is not None else self.metric(),
                                 scheme=scheme, units=units, num_batches=num_batches, progress=progress,
                                 cancel=cancel, output=self.project.settings.get("output"), context=context)
        self.project.sensitivity.append(SensitivityRecord(self.project.next_id(self.project.sensitivity), now_iso(),
                                                          result.to_dict()))
        self._changed(SessionEvent.SENSITIVITY)
        return result

    def latest_sensitivity(self):
        from workbench.analysis import SensitivityResult

        if not self.project.sensitivity:
            return None
        return SensitivityResult.from_dict(self.project.sensitivity[-1].data)

    def fallback(self, *, tolerance: float | None = None, target: float | None = None, max_units: int | None = None,
                 metric: Any = None, apply: bool = False, use_ranking: bool = True,
                 progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                 context: DistContext | None = None):
        """Search which layers to leave in float to get within ``tolerance`` of FP32 (or reach ``target``).

        With a distributed ``context`` the ranks measure candidate sets in parallel (see :meth:`calibrate`).
        """
        from workbench.analysis import fallback_search

        context = self._join(context)
        model = self._require_calibrated()
        ranking = self.latest_sensitivity() if use_ranking else None
        result = fallback_search(model, self._analysis_batches(), metric if metric is not None else self.metric(),
                                 tolerance=tolerance, target=target, max_units=max_units, ranking=ranking,
                                 apply=False, progress=progress, cancel=cancel,
                                 output=self.project.settings.get("output"), context=context)
        record = FallbackRecord(self.project.next_id(self.project.fallbacks), now_iso(), result.to_dict())
        self.project.fallbacks.append(record)
        if apply:
            self.apply_fallback(result)
            record.applied = True
        self._changed(SessionEvent.FALLBACK, applied=apply)
        return result

    def apply_fallback(self, result: Any) -> list[str]:
        """Leave the layers a fallback search chose in float (a layer decision, saved with the project).

        ``result`` is a FallbackResult, or units / layer names.
        """
        names: list[str] = []
        for unit in getattr(result, "chosen", result):
            names += self.layers_of(unit)
        names = list(dict.fromkeys(names))
        self.set_quantize(names, False)
        return names

    def layers_of(self, unit: Any) -> list[str]:
        """The quantizable layers a sensitivity or fallback unit switches (a Unit, a UnitResult or a name).

        A unit is named by its quantizers (``block.add._input1_quantizer``); the views select and
        ignore layers, so they map units to layers through here.
        """
        quantizers = getattr(unit, "quantizers", None)
        layers = [layer_of(q)[0] for q in quantizers] if quantizers else [getattr(unit, "name", unit)]
        return [layer for layer in dict.fromkeys(layers) if layer in self.project.layers]

    def latest_fallback(self):
        """The last fallback search stored in the project (None if there was none)."""
        from workbench.analysis import FallbackResult

        if not self.project.fallbacks:
            return None
        return FallbackResult.from_dict(self.project.fallbacks[-1].data)

    def evaluate(self, metric: Any = None, num_batches: int | None = None, *,
                 progress: ProgressCallback | None = None, cancel: CancelToken | None = None):
        """The metric's FP32 and INT8 values (and the output SQNR) on the evaluation data.

        ``metric``: a Metric, a built-in name or an entry point (user code needs trust; a relative file
        is found next to the project); default the project's. FP32 is the float model as loaded, INT8 the
        calibrated quantized model. Returns a :class:`workbench.analysis.Evaluation`; the project is not changed.
        """
        from workbench.analysis import evaluate_models

        model = self._require_calibrated()
        chosen = self.metric() if metric is None else self._metric(metric)
        batches = self._analysis_batches()
        if num_batches:
            batches = batches[:num_batches]
        return evaluate_models(self.float_model, model, batches, chosen, progress=progress, cancel=cancel,
                               output=self.project.settings.get("output"))

    def export(self, path: str | Path | None = None, *, opset: int | None = None, dynamic_batch: bool | None = None,
               amax_json: bool | None = None, calibration_cache: bool | None = None, remember: bool = True,
               force: bool = False):
        """Write QDQ ONNX (validated) next to the project or at ``path``; the report is stored in the project.

        ``path`` is taken from the working directory; the stored path is relative to the project's folder.
        An existing file is replaced only when this project wrote it and it is unchanged, or with ``force``
        (see :mod:`workbench.session.exports`). ``remember=False`` (a preview, e.g. for the graph view)
        leaves the project as it was: the export settings, the export history and the unsaved-changes
        flag are not touched.
        """
        from workbench.export import export_qdq_onnx

        settings = dict(self.project.settings["export"])
        opset = opset or settings.get("opset", 17)
        dynamic_batch = settings.get("dynamic_batch", True) if dynamic_batch is None else dynamic_batch
        amax_json = settings.get("amax_json", False) if amax_json is None else amax_json
        calibration_cache = settings.get("calibration_cache", False) if calibration_cache is None else calibration_cache
        target = Path(path).expanduser().resolve() if path is not None else self.default_export_path()
        if remember:  # a preview writes where the app chose (a folder of its own), not over the user's files
            check_overwrite(target, self.project.exports, self._project_dir(), force)
        model = self._require_calibrated()
        try:
            report = export_qdq_onnx(model, self.sample_inputs(batch=1), target, opset=opset,
                                     dynamic_batch=dynamic_batch, output=self.project.settings.get("output"),
                                     amax_json_path=target.with_suffix(".amax.json") if amax_json else None,
                                     calibration_cache_path=target.with_suffix(".calib.cache") if calibration_cache
                                     else None)
        except OSError as error:  # a full disk, a read-only folder: name the file, not "internal error"
            where = error.filename or target
            raise SessionError(f"{where}: cannot be written ({error.strerror or error}); nothing was exported "
                               f"to {target}.") from error
        if not remember:
            return report
        stored = stored_export_path(target, self._project_dir())
        settings.update({"path": stored, "opset": opset, "dynamic_batch": dynamic_batch, "amax_json": amax_json,
                         "calibration_cache": calibration_cache})
        self.project.settings["export"] = settings
        self.project.exports.append(ExportRecord(self.project.next_id(self.project.exports), now_iso(), stored,
                                                 {"opset": opset, "dynamic_batch": dynamic_batch,
                                                  "sha256": export_digest(target)},
                                                 jsonable(report.to_dict())))
        self._changed(SessionEvent.EXPORT, path=str(target))
        return report

    def overwrite_refusal(self, path: str | Path | None = None) -> str | None:
        """Why :meth:`export` to ``path`` (default: the project's) would refuse without ``force``; None if it would not."""
        target = Path(path).expanduser().resolve() if path is not None else self.default_export_path()
        try:
            check_overwrite(target, self.project.exports, self._project_dir(), force=False)
        except SessionError as error:
            return str(error)
        return None

    def export_path(self, record: ExportRecord) -> str:
        """Where an export of the history lies (its stored path is relative to the project's folder)."""
        return absolute_path(record.path, self._project_dir()) or record.path

    def _project_dir(self) -> Path:
        return self.path.parent if self.path is not None else self.base_dir

    # ----- TensorRT: lint before building, the engine's report after -------------------------

    def lint(self):
        """Fusion hazards TensorRT's Q/DQ rules predict for the project as it exports now."""
        return tensorrt.lint(self)

    def apply_fix(self, fix) -> list[str]:
        """Apply a lint warning's fix (a pin, quantize, leave in float, a placement rule)."""
        return tensorrt.apply_fix(self, fix)

    def import_engine_report(self, layer_info: str | Path, profile: str | Path | None = None, *,
                             remember: bool = True):
        """trtexec's layer information (and profile) mapped onto the layers; kept in the project."""
        return tensorrt.import_engine(self, layer_info, profile, remember=remember)

    def latest_engine_report(self):
        return tensorrt.latest_engine_report(self)

    def default_export_path(self) -> Path:
        """Where ``export`` writes without a path: the project's export setting (relative to the project's
        folder), else ``<project>.qdq.onnx`` next to it."""
        stem = self.path.stem if self.path is not None else (self.project.name or "model")
        return resolve_export_path(None, self.project.settings["export"].get("path"), self._project_dir(),
                                   f"{stem}.qdq.onnx")

    def finetune(self, *, epochs: int | None = None, lr: float | None = None, optimizer: str | None = None,
                 schedule: str | None = None, loss: str | None = None, learn_amax: Sequence[str] | str | None = None,
                 momentum: float | None = None, weight_decay: float | None = None,
                 steps_per_epoch: int | None = None, amp: bool | None = None, metric: Any = None,
                 progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
                 on_step: Any = None, on_epoch: Any = None):
        """Quantization-aware fine-tuning of the calibrated model (see :func:`workbench.training.finetune`).

        Options not given come from the project's ``finetune`` setting, and the ones given are stored
        there. Trains on the training data (default: all of the calibration data, shuffled) and keeps
        the best epoch on the evaluation data by the project's metric (or ``metric``). amax stays as
        calibrated unless ``learn_amax`` names quantizers (regexes). Cancel is checked between steps and
        leaves the best model so far. The float model keeps its weights: the quantized model trains
        copies. The result (history and the resulting weights) is stored in the project, and export uses
        the fine-tuned weights; a run cancelled before its first epoch changes nothing and is not stored.
        """
        from workbench.training import finetune as run_finetune

        options = dict(DEFAULT_SETTINGS["finetune"])
        options.update(self.project.settings.get("finetune") or {})
        given = {"epochs": epochs, "lr": lr, "optimizer": optimizer, "schedule": schedule, "loss": loss,
                 "momentum": momentum, "weight_decay": weight_decay, "steps_per_epoch": steps_per_epoch, "amp": amp,
                 "learn_amax": [learn_amax] if isinstance(learn_amax, str) else learn_amax}
        options.update({key: value for key, value in given.items() if value is not None})
        loss_name = options.get("loss") or "cross_entropy"
        if ":" in str(loss_name) and not self.trust_code:
            raise TrustRequired(f"The loss {loss_name} is user code; trust it first (--trust-code).")
        # a loss file next to the project is found from any working directory (the setting keeps it relative)
        loss_spec = absolute_entrypoint(loss_name, self.base_dir) if ":" in str(loss_name) else loss_name
        model = self._require_calibrated()
        result = run_finetune(
            model, self.data("training"), loss_spec, epochs=options["epochs"], lr=options["lr"],
            schedule=options["schedule"], optimizer=options["optimizer"], momentum=options["momentum"],
            weight_decay=options["weight_decay"], steps_per_epoch=options["steps_per_epoch"],
            eval_batches=self._analysis_batches(), metric=metric if metric is not None else self.metric(),
            progress=progress, cancel=cancel, on_step=on_step, on_epoch=on_epoch, device=self.device,
            amp=options["amp"], learn_amax=options["learn_amax"] or None, trust_code=self.trust_code)
        self.project.settings["finetune"] = options
        self._changed(SessionEvent.SETTINGS, keys=["finetune"])
        if result.epochs_completed == 0 and not result.changed:
            return result  # cancelled before an epoch finished: the model is as it was
        quantizers = quantizer_names(model)
        own = {id(p) for q in quantizers.values() for p in q.parameters()}
        weights = {name: to_numpy(p) for name, p in model.named_parameters() if id(p) not in own}
        run = self.project.current_calibration
        amax: dict[str, np.ndarray] = {}
        for name, quantizer in quantizers.items():  # ranges that differ from the calibration: learned ones
            record = run.quantizers.get(name) if run is not None else None
            current = quantizer._buffers.get("_amax")
            if record is not None and current is not None and not np.array_equal(
                    to_numpy(current), np.asarray(record.amax, dtype=np.float32)):
                amax[name] = to_numpy(current)
        for old in self.project.finetunes:  # one set of weights per project: the active run's
            old.active, old.weights, old.amax = False, {}, {}
        self.project.finetunes.append(FinetuneRecord(
            id=self.project.next_id(self.project.finetunes), created=now_iso(), data=result.to_dict(),
            calibration_id=run.id if run is not None else None, folded=sorted(self.folded_layers()),
            active=True, weights=weights, amax=amax))
        self.build_report.finetune = f"fine-tuned weights of run {self.project.finetunes[-1].id} in use"
        self._changed(SessionEvent.FINETUNE, run=self.project.finetunes[-1].id)
        return result

    def finetune_history(self) -> list[Any]:
        """Every stored fine-tune as a :class:`workbench.training.FinetuneResult` (no model), oldest first."""
        from workbench.training import FinetuneResult

        return [FinetuneResult.from_dict(record.data) for record in self.project.finetunes]

    def reset_finetune(self) -> bool:
        """Back to the calibrated model's own weights (the fine-tune history stays); False if none was in use."""
        if self.project.current_finetune is None:
            return False
        for record in self.project.finetunes:
            record.active, record.weights, record.amax = False, {}, {}
        self._invalidate()
        self._changed(SessionEvent.FINETUNE, run=None)
        return True

    def _require_calibrated(self) -> nn.Module:
        """The quantized model, once calibrated. Quantizers the last calibration never reached (no data flowed
        through them) keep no amax: export leaves them in float and says so. Any other quantizer without amax
        (never calibrated, or stale after its descriptor changed) is refused: calibrate first."""
        model = self.quantized_model()
        run = self.project.current_calibration
        unreached = set(run.unused) if run is not None else set()
        missing = [name for name, q in quantizer_names(model).items()
                   if not q._disabled and q._if_quant and not q._learn_amax and not hasattr(q, "_amax")
                   and name not in unreached]  # stale after a descriptor change, or never calibrated
        if missing:
            raise SessionError(f"{len(missing)} quantizers are not calibrated ({', '.join(missing[:5])}"
                               f"{'...' if len(missing) > 5 else ''}): calibrate first.")
        return model

    # ----- summary ----------------------------------------------------------------------------

    def summary(self, layers: list[LayerView] | None = None) -> dict[str, Any]:
        """A JSON-able overview for ``workbench show`` (``layers``: :meth:`layers`, when the caller has them)."""
        return views.summary(self, layers)

def _moved_hint(project: Project, base_dir: Path) -> str:
    """For a project opened from another folder than it was saved in: where its relative paths led before."""
    saved_in = Path(project.saved_in) if project.saved_in else None
    if saved_in is None or saved_in == base_dir.resolve():
        return ""
    return (f" Relative paths in a project are taken from its own folder ({base_dir}); it was saved in {saved_in}: "
            "copy its code and data along with it, or open it there.")


def _code_references(project: Project, base_dir: Path) -> list[CodeReference]:
    return code_references(project.model, project.data, project.settings, base_dir)


def _checked(key: str, value: Any) -> Any:
    """A setting's value as :func:`checked_setting` checks it, plus whether its metric exists; SessionError if not."""
    try:
        checked = checked_setting(key, value)
        if key == "metric":
            from workbench.analysis import get_metric

            get_metric(checked.get("name"), checked.get("direction"))  # the name, an entry point's form; imports nothing
    except (SettingsError, ValueError, TypeError) as error:
        raise SessionError(str(error)) from None
    return checked


def _shared_result(result: CalibrationResult, quantizers: dict[str, TensorQuantizer], quantizer: TensorQuantizer):
    """The calibration result of a quantizer reached under another name (shared by a placement rule)."""
    for name, other in quantizers.items():
        if other is quantizer and name in result.quantizers:
            return result.quantizers[name]
    return None
