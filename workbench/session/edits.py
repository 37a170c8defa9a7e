"""The Session's edits: what changes an open project's decisions without running a job.

:class:`SessionEdits` sits between :class:`~workbench.session.reading.SessionReading` (what the front ends read) and
:class:`~workbench.session.core.Session` (construction, saving and the jobs). Here: the data sources, which layers
are quantized, their descriptors and precisions, the settings and the device, and applying what a search or a lint
warning proposes. Each edit is checked before anything changes, goes into the live quantized model in place where
a rebuild would give the same model, and tells the listeners what changed.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from workbench.project.settings import REBUILD_SETTINGS
from workbench.quant.algorithms.precision import Precision
from workbench.session import analysis, configure, data_sources, decisions, layer_edits, recalibration, tensorrt
from workbench.session import ladder as ladder_job
from workbench.session.build import build_quantized, restore_calibration
from workbench.session.errors import SessionError
from workbench.session.events import EventEmitter, SessionEvent
from workbench.session.reading import SessionReading
from workbench.sources.data_source import DataSpec
from workbench.sources.lazy_checkpoint import move_keeping_meta

__all__ = ["SessionEdits"]


class SessionEdits(SessionReading):
    """The edits of an open project; the state is the Session's (set in its ``__init__``)."""

    dirty: bool
    events: EventEmitter
    notes: list[str]
    _ladder_undo: dict[str, Any] | None
    _ladder_undo_run: Any

    def set_data(self, role: str, spec: DataSpec) -> None:
        """Replace a data source; the new inputs must fit the model (new calibration data is run through it
        once, as :meth:`create` does). A refused source leaves the project's data as it was."""
        self._data.replace(self.project, role, spec, trust_code=self.trust_code, base_dir=self.base_dir,
                           check=self.check_forward)
        self._changed(SessionEvent.DATA, role=role)

    def check_forward(self) -> None:
        """Run the float model on one sample batch; its error names the inputs' shapes and dtypes."""
        sample = self.sample_inputs(batch=2)
        # on shapes only the inputs are on meta already (None: left where they are)
        self._sample_run(lambda inputs: data_sources.check_forward(
            self.float_model, inputs, self.device if inputs is sample else None, self.project),
            sample, "the check of the sample input")

    def _init_layers(self) -> None:
        self._quant_model = None
        self.project.layers = {}
        self._sync_layers()

    def _sync_layers(self) -> None:
        """Make sure every quantizable layer of the model has a decision (new ones: quantize)."""
        base, folding = self._fold_base()
        example = self._example_inputs()
        model = self._sample_run(lambda inputs: build_quantized(base, self.project, self.device, folding=folding,
                                                                with_decisions=False, example_inputs=inputs,
                                                                settings=self.settings).model,
                                 example, "finding the quantizable layers")
        self.project.layers = decisions.synced_layers(self.project.layers, model)
        self._quant_model = None

    def apply_ignore_policy(self, patterns: Iterable[str], quantize_others: bool) -> list[str]:
        """Leave the layers matching any of ``patterns`` in float (the matching of :meth:`ignore_preview`);
        with ``quantize_others``, quantize every other layer. One edit (the model is rebuilt once, when next
        used); returns the ignored layers.

        Raises:
            SessionError: no pattern, an invalid regex, or a pattern that matches no layer (named); the
                layers are then as they were.
        """
        ignored = decisions.ignored_layers(self.project, patterns)
        self.set_quantize(ignored, False)
        if quantize_others:
            left_in_float = set(ignored)
            self.set_quantize([name for name in self.project.layers if name not in left_in_float], True)
        return ignored

    def set_quantize(self, names: Iterable[str], quantize: bool) -> list[str]:
        """Quantize or leave in float; returns the layers whose decision changed."""
        changed = decisions.set_quantize(self.project, names, quantize)
        if changed:
            self._invalidate()
            self._changed(SessionEvent.LAYERS, names=changed)
        return changed

    def set_descriptor(self, names: Iterable[str], role: str, **fields: Any) -> list[str]:
        """Change descriptor fields of the ``role`` ("input" or "weight") quantizer of layers.

        Fields are validated like :class:`QuantDescriptor`'s and against what TensorRT builds
        (:func:`~workbench.quant.algorithms.tensorrt_rules.tensorrt_check`): a descriptor it cannot use raises
        SessionError with the reason; one that only simulates (4-bit) is set and explained in :attr:`notes`.
        The layer's current descriptor (override or default) is the starting point, so one call can
        change just ``num_bits``.
        """
        if role not in ("input", "weight"):
            raise SessionError(f"role must be 'input' or 'weight', got {role!r}.")
        return self._edited(layer_edits.edit_descriptor(self.project, self.quantized_model(), names, role, fields,
                                                        self.settings.defaults))

    def set_precision(self, names: Iterable[str], precision: Precision | str, *, block_size: int | None = None,
                      fp8_weight_per_channel: bool = True) -> list[str]:
        """Run layers in ``precision`` (the precisions of :mod:`workbench.quant.algorithms.precision`): their
        descriptors and quantize flag become that precision's, in one edit. Returns the layers changed.
        ``block_size`` (int4w): 64 or 128 dividing each layer's input features; None: the largest that does.

        Raises:
            SessionError: an unknown precision or layer, or one that does not apply to a layer (named).
        """
        return self._edited(layer_edits.edit_precision(
            self.project, self.quantized_model(), self.settings.defaults, names, precision, block_size=block_size,
            fp8_weight_per_channel=fp8_weight_per_channel))

    def _edited(self, edit: layer_edits.LayerEdit) -> list[str]:
        """An edit of layers' decisions is done: its new descriptors go into the live quantized model in place
        where a rebuild would give the same model (:func:`layer_edits.apply_in_place`), else the model is rebuilt
        when next used; listeners hear of the layers changed."""
        if edit.notes is not None:
            self.notes = edit.notes
        if edit.changed:
            if self.needs_rebuild or not layer_edits.apply_in_place(
                    self._quant_model, self.project, edit, defaults=self.settings.defaults, report=self.build_report,
                    device=self.device):
                self._invalidate()
            self._changed(SessionEvent.LAYERS, names=edit.changed)
        return edit.changed

    def reset_descriptor(self, names: Iterable[str], role: str | None = None) -> list[str]:
        """Back to the layer type's default descriptor (both roles unless ``role`` is given)."""
        return self._edited(layer_edits.reset_descriptor(self.project, names, role))

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
        checked = configure.changed_settings(self.settings, changes)
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
        self.set_settings({key: configure.updated_section(self.settings, key, fields)})

    def add_pins(self, pairs: Iterable[Sequence[str]]) -> None:
        """Share one quantizer between each pair of quantizers or layers (TensorRT scale sharing).

        The names are checked by building the model: a pin naming no quantizer raises SessionError and
        leaves the pins as they were.
        """
        previous = self.settings.stored("pins")
        self.set_setting("pins", previous + [list(pair) for pair in pairs])
        try:
            self.quantized_model()
        except Exception as error:
            self.project.settings["pins"] = previous
            self._quant_model = None
            raise SessionError(f"pins: {error}") from error

    def set_device(self, device: str) -> None:
        """Move the models to ``device`` (``cpu``, ``cuda``, ``cuda:N``); SessionError if there is none such."""
        target = torch.device(configure.checked_value("device", device))
        self.device = target
        self.project.settings["device"] = str(target)
        self._loaded.to(target)
        self._folded = None  # its folded weights are its own tensors, on the old device
        if self._quant_model is not None:
            move_keeping_meta(self._quant_model, target)

    def _invalidate(self) -> None:
        self._quant_model = None
        self.dirty = True

    def _changed(self, kind: SessionEvent, **data: Any) -> None:
        """The project changed: unsaved, and every listener is told what changed."""
        self.dirty = True
        self.events.emit(kind, **data)

    def apply_precisions(self, precisions: dict[str, str]) -> list[str]:
        """Set each layer to its precision (a ladder's mix), one :meth:`set_precision` per precision; layers
        marked ``custom``, and layers already in their precision (their descriptors as they are, hand edits
        included), keep their decisions. Returns the layers changed."""
        own = {name: (p.value if p is not None else "custom") for name, p in self.precisions().items()}
        changing = {name: p for name, p in precisions.items() if own.get(name) != p}
        groups = decisions.precision_groups(self.project, changing)
        return [name for precision, names in groups.items() for name in self.set_precision(names, precision)]

    def apply_ladder(self, result: Any = None, *, keep_hand_edits: bool = False) -> list[ladder_job.MixChange]:
        """Set the layers to a ladder's mix (the last search's by default): only the layers whose precision changes
        (:meth:`ladder_changes`; with ``keep_hand_edits``, not those set by hand). The search shows as applied,
        also after a save and reopen; :meth:`undo_ladder_apply` puts the decisions back. Returns the changes."""
        result = result if result is not None else self.latest_ladder()
        if result is None:
            raise SessionError("no ladder search to apply: run one first (workbench sensitivity --ladder).")
        changes, edit = ladder_job.apply_mix(self.project, self.quantized_model(), self.settings.defaults,
                                             result.precisions, self.precisions(), keep_hand_edits=keep_hand_edits)
        run = self.project.current_calibration
        self._edited(edit)
        ladder_job.mark_applied(self.project, result.precisions, True)
        result.applied = True
        self._ladder_undo = edit.before
        self._ladder_undo_run = run
        self._changed(SessionEvent.FALLBACK, applied=True)
        return changes

    def undo_ladder_apply(self) -> list[str]:
        """Put back the layers' decisions from before the last :meth:`apply_ladder` of this session; the search
        shows as not applied again. Returns the layers restored.

        Raises:
            SessionError: no ladder was applied since the project was opened (or it was undone already).
        """
        if not self._ladder_undo:
            raise SessionError("nothing to undo: no ladder mix was applied since the project was opened.")
        edit = ladder_job.restore_layers(self.project, self._ladder_undo)
        before_run, self._ladder_undo, self._ladder_undo_run = self._ladder_undo_run, None, None
        ladder_job.mark_applied(self.project, None, False)
        # the calibration from before the Apply comes back with its layers (the Apply's own recalibration
        # described the mix, and left the restored layers to recalibrate)
        restored = recalibration.restored_run(self.project, before_run)
        if restored is not None:
            self.project.calibrations.append(restored)
        self._edited(edit)
        if restored is not None:
            self._load_calibration(restored)
            self._changed(SessionEvent.CALIBRATION)
        self._changed(SessionEvent.FALLBACK, applied=False)
        return edit.changed

    def _load_calibration(self, run: Any) -> None:
        """Give the live quantized model the amax of ``run`` (the current calibration), as a rebuild would; a model
        with a fine-tune's learned ranges is rebuilt instead (they are laid over the calibration)."""
        if self._quant_model is None:
            return
        if self.project.current_finetune is not None:
            self._invalidate()
            return
        restore_calibration(self._quant_model, run, self.build_report, self.device)

    def apply_fallback(self, result: Any) -> list[str]:
        """Leave the layers a fallback search chose in float (a layer decision, saved with the project).

        ``result`` is a FallbackResult, or units / layer names.
        """
        names = analysis.fallback_layers(self.project, result)
        self.set_quantize(names, False)
        if analysis.is_latest_fallback(self.project, result):
            self.project.fallbacks[-1].applied = True  # reopened, the search shows as applied (its Apply is done)
            self._changed(SessionEvent.FALLBACK, applied=True)
        return names

    def apply_fix(self, fix) -> list[str]:
        """Apply a lint warning's fix (a pin, quantize, leave in float, a placement rule)."""
        plan = tensorrt.plan_fix(fix, self.settings)
        if plan.quantize is not None:
            return self.set_quantize(plan.layers, plan.quantize)
        if plan.settings:
            self.set_settings(plan.settings)
        return plan.changed
