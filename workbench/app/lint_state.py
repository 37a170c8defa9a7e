"""The GUI's fusion lint: the last lint's warnings, whether the project changed since, and its fixes.

Linting is the session's (:meth:`workbench.session.Session.lint`: a preview export checked against
TensorRT's Q/DQ placement rules); the controller runs it as a job and applies a warning's fix as an
edit. This object keeps the result for the views (the tree's warning icons, the lint list) and marks it
stale when the layers, settings or calibration change, so that no view shows an old prediction as
current. Applying a fix lints again once the edit is done.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from workbench.app.controller import Controller

__all__ = ["LintState", "NOT_CALIBRATED"]

NOT_CALIBRATED = ("Lint predicts TensorRT's fusions from the exported graph, and the project exports only once "
                  "it is calibrated: calibrate first.")


class LintState(QObject):
    """What the last lint found (``warnings``; None: not linted since the project opened).

    Signals:
        changed: warnings, staleness or the reason lint could not run changed.
    """

    changed = Signal()

    def __init__(self, controller: Controller) -> None:
        super().__init__(controller)
        self._controller = controller
        self.warnings: list[Any] | None = None  # workbench.export.lint.LintWarning
        self.stale = False      # the project changed since the warnings were computed
        self.problem = ""       # why lint could not run (shown instead of warnings)
        self._after_calibration = False
        controller.session_changed.connect(self.clear)
        for signal in (controller.layers_changed, controller.settings_changed, controller.calibration_changed):
            signal.connect(self.mark_stale)
        controller.calibration_changed.connect(self._calibrated)

    # ----- reading ------------------------------------------------------------------------------

    def by_module(self) -> dict[str, list[Any]]:
        """The warnings naming each module (a warning names one or more)."""
        found: dict[str, list[Any]] = {}
        for warning in self.warnings or ():
            for module in warning.modules:
                found.setdefault(module, []).append(warning)
        return found

    def fixes_for(self, names: list[str]) -> list[Any]:
        """The fixes (:class:`~workbench.export.lint.LintFix`) of warnings naming any of ``names``, each once."""
        wanted = set(names)
        fixes: list[Any] = []
        for warning in self.warnings or ():
            if warning.fix is not None and wanted & set(warning.modules) and warning.fix not in fixes:
                fixes.append(warning.fix)
        return fixes

    def calibrated(self) -> bool:
        session = self._controller.session
        return session is not None and session.project.current_calibration is not None

    # ----- running --------------------------------------------------------------------------------

    def run(self, *, calibrate_first: bool = False) -> bool:
        """Lint in the background; without calibration, say why not (or calibrate first, then lint)."""
        if self._controller.session is None:
            return self._controller.lint(self._done)  # the controller says "open a project first"
        if not self.calibrated():
            if calibrate_first and self._controller.calibrate():
                self._after_calibration = True
                return True
            self.problem = NOT_CALIBRATED
            self.changed.emit()
            return False
        return self._controller.lint(self._done)

    def apply(self, fix: Any) -> list[str] | None:
        """Apply ``fix`` through the controller; then lint again (the old warnings are stale by now)."""
        changed = self._controller.apply_fix(fix)
        if changed is None:  # refused or failed: the controller showed why
            return None
        self.mark_stale()
        self.run()
        return changed

    def clear(self) -> None:
        self.warnings, self.stale, self.problem, self._after_calibration = None, False, "", False
        self.changed.emit()

    def mark_stale(self, *_args: Any) -> None:
        if self.warnings is not None and not self.stale:
            self.stale = True
            self.changed.emit()

    def _done(self, warnings: list[Any]) -> None:
        self.warnings, self.stale, self.problem = list(warnings), False, ""
        self.changed.emit()

    def _calibrated(self) -> None:
        if self._after_calibration and self.calibrated() and not self._controller.busy:
            self._after_calibration = False
            self.run()
