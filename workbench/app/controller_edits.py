"""The controller's edits: one change to the session on the GUI thread, queued while a job runs.

A mixin of :class:`workbench.app.controller.Controller` (its signals and state live there). Each edit
holds the session's events until it is done, then the views hear of it once; when rebuilding the
quantized model after the edit is slow, the rebuild goes to the worker and the window stays live.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer

from workbench.app.formatting import count_text
from workbench.session.errors import EngineNotThisModel

__all__ = ["EditsMixin", "SLOW_REBUILD_S", "UPDATE_JOB"]

# Rebuilding the quantized model after an edit goes to the worker thread when it took longer than this.
SLOW_REBUILD_S = 0.3
UPDATE_JOB = "Updating the model"


class EditsMixin:
    """Edits of the open session (``Controller`` mixes this in)."""

    def refuse_if_busy(self, what: str) -> bool:
        """True (and an error dialog saying why) while a job runs: the session belongs to the job."""
        if self.busy:
            self.error.emit(what, f"Wait for '{self.jobs.job_name}' to finish, or cancel it.", "")
        return self.busy

    def _edit(self, what: str, fn: Callable[[], Any]) -> Any:
        """Apply one change to the session; the views hear of it (the session's events) once the
        quantized model is rebuilt, in the worker when that is slow."""
        if self.session is None:
            return None
        if self.busy:
            # the session belongs to the job: the edit waits for its end rather than being refused
            self._queued_edits.append((what, fn, self.session))
            self.log.emit("info", f"{what}: waits for '{self.jobs.job_name}' to finish")
            return None
        self._holding += 1
        try:
            result = fn()
        except Exception as error:  # noqa: BLE001 - a bad value from the user: show it, keep the state
            self._holding -= 1
            self._tell()  # what did change before the error (one of several edits) is still told
            self.error.emit(what, str(error), "")
            return None
        self._holding -= 1
        session = self.session
        if session.needs_rebuild and session.last_build_s > SLOW_REBUILD_S:
            # a big model takes seconds to rebuild (tracing): do it in the worker, the window stays live
            def rebuild(progress, cancel):
                progress(0, 1, "updating the quantized model")
                return self._prepare_views(session, progress)

            self._start(UPDATE_JOB, rebuild, lambda _: None)
            return result
        self._tell()
        return result

    def _run_queued_edits(self, busy: bool) -> None:
        if not busy and self._queued_edits:
            # after the finished job's own completion (its views refreshed), in the order they were asked for
            QTimer.singleShot(0, self._apply_queued_edits)

    def _apply_queued_edits(self) -> None:
        while self._queued_edits and not self.busy:
            what, fn, session = self._queued_edits.pop(0)
            if session is self.session:  # a project opened meanwhile drops the old one's edits
                self._edit(what, fn)

    @property
    def queued_edits(self) -> list[str]:
        """What edits wait for the running job, in order."""
        return [what for what, _, _ in self._queued_edits]

    def set_quantize(self, names: Iterable[str], quantize: bool) -> list[str] | None:
        names = list(names)
        return self._edit("Quantize" if quantize else "Ignore", lambda: self.session.set_quantize(names, quantize))

    def set_descriptor(self, names: Iterable[str], role: str, fields: dict[str, Any]) -> list[str] | None:
        names = list(names)
        return self._edit("Set descriptor", lambda: self.session.set_descriptor(names, role, **fields))

    def set_precision(self, names: Iterable[str], precision: str) -> list[str] | None:
        """Run layers in ``precision`` (a :class:`workbench.quant.algorithms.precision.Precision` value) as one edit."""
        names = list(names)
        return self._edit("Set precision", lambda: self.session.set_precision(names, precision))

    def reset_descriptor(self, names: Iterable[str], role: str | None = None) -> list[str] | None:
        names = list(names)
        return self._edit("Reset to default", lambda: self.session.reset_descriptor(names, role))

    def set_setting(self, key: str, value: Any) -> None:
        self._edit("Settings", lambda: self.session.set_setting(key, value))

    def update_setting(self, key: str, fields: dict[str, Any]) -> None:
        """Change some fields of the setting ``key`` and keep the others (a dialog that shows only some)."""
        fields = dict(fields)
        self._edit("Settings", lambda: self.session.update_setting(key, **fields))

    def set_settings(self, changes: dict[str, Any]) -> None:
        """Change several settings as one edit (one rebuild): a second edit would be refused while the
        first one's background rebuild runs, so a dialog's changes go together or not at all."""
        changes = dict(changes)
        if changes:
            self._edit("Settings", lambda: self.session.set_settings(changes))

    def apply_ignore_policy(self, patterns: Iterable[str], quantize_others: bool) -> list[str] | None:
        """Leave the layers matching ``patterns`` in float (and quantize all others when ``quantize_others``),
        as one edit; returns the layers left in float, None when refused."""
        patterns = list(patterns)
        return self._edit("Ignore by pattern", lambda: self.session.apply_ignore_policy(patterns, quantize_others))

    def recompute_amax(self, names: Iterable[str], method: str, percentile: float | None = None) -> dict | None:
        names = list(names)
        return self._edit("Change amax method", lambda: self.session.recompute_amax(names, method, percentile))

    def apply_fallback(self, result: Any) -> list[str] | None:
        return self._edit("Apply fallback", lambda: self.session.apply_fallback(result))

    def apply_precisions(self, precisions: dict[str, str]) -> list[str] | None:
        """Set every layer to its precision (a ladder search's mix), as one edit; calibrate afterwards."""
        precisions = dict(precisions)
        return self._edit("Apply precisions", lambda: self.session.apply_precisions(precisions))

    def precision_problems(self, names: Iterable[str], precision: str) -> dict[str, str]:
        """Why ``precision`` does not fit each of ``names`` it cannot be set on; no edit."""
        if self.session is None:
            return {}
        return self.session.precision_problems(list(names), precision)

    def ladder_changes(self, result: Any = None) -> list[Any]:
        """What applying a ladder's mix changes (layer, precision now and then, whether set by hand); no edit."""
        if self.session is None:
            return []
        return self.session.ladder_changes(result)

    def apply_ladder(self, result: Any = None, *, keep_hand_edits: bool = False) -> list[Any] | None:
        """Set the layers a ladder's mix changes, as one edit (``keep_hand_edits``: not those set by hand); the
        search shows as applied; :meth:`undo_ladder_apply` puts them back. Calibrate afterwards."""
        return self._edit("Apply precisions",
                          lambda: self.session.apply_ladder(result, keep_hand_edits=keep_hand_edits))

    def undo_ladder_apply(self) -> list[str] | None:
        """Put back the layers' decisions from before the last ladder Apply."""
        return self._edit("Undo apply", lambda: self.session.undo_ladder_apply())

    def reset_finetune(self) -> bool | None:
        """Drop the fine-tuned weights: the quantized model goes back to the calibrated weights."""
        return self._edit("Discard fine-tuning", lambda: self.session.reset_finetune())

    def import_engine_report(self, layer_info: str | Path, profile: str | Path | None = None, *,
                             onnx_file: str | Path | None = None, force: bool = False,
                             refused: list[str] | None = None) -> Any:
        """Read trtexec's layer information (and profile) into the project; the Engine views follow.

        ``onnx_file`` / ``force``: as ``engine-report --onnx`` / ``--force``. With ``refused`` (a list), an engine
        that does not look like this model's is not an error dialog: its message is appended for the caller to
        offer the ways on (map through the ONNX file, report anyway)."""
        def run() -> Any:
            try:
                return self.session.import_engine_report(layer_info, profile, onnx_file=onnx_file, force=force)
            except EngineNotThisModel as error:
                if refused is None:
                    raise
                refused.append(str(error))
                return None

        report = self._edit("Import TensorRT report", run)
        if report is not None:
            self.log.emit("info", f"TensorRT report {Path(layer_info).name}: {report.mapping_text()} "
                                  f"{count_text(len(report.hazards), 'hazard')}")
            self.engine_changed.emit()
        return report

    def apply_fix(self, fix: Any) -> list[str] | None:
        """Apply a lint warning's fix (:class:`workbench.export.lint.LintFix`) as one edit; returns what changed,
        None when refused or failed (an error dialog says why)."""
        changed = self._edit(f"Fix: {fix.description}", lambda: self.session.apply_fix(fix))
        if changed is not None:
            self.log.emit("info", f"applied '{fix.description}': " + (", ".join(changed) or "nothing (already so)"))
        return changed
