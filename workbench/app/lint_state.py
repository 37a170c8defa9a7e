"""The GUI's fusion lint: the last lint's warnings, whether the project changed since, and its fixes.

Linting is the session's (:meth:`workbench.session.Session.lint`: a preview export checked against
TensorRT's Q/DQ placement rules); the controller runs it as a job and applies a warning's fix as an
edit. This object keeps the result for the views (the tree's warning icons, the lint list) and marks it
stale when the layers, settings or calibration change, so that no view shows an old prediction as
current. Applying a fix lints again once the edit is done.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QObject, Signal, SignalInstance

from workbench.app.jobs import JobRunner
from workbench.session import Session

__all__ = ["LintState", "LintHost", "NOT_CALIBRATED", "LINT_JOB"]

LINT_JOB = "Linting for TensorRT"  # the controller's job name (its failures are this state's too)
NOT_CALIBRATED = ("Lint predicts TensorRT's fusions from the exported graph, and the project exports only once "
                  "it is calibrated: calibrate first.")


class LintHost(Protocol):
    """What the lint state needs of its owner (the :class:`~workbench.app.controller.Controller`).

    Named here, below the controller, so that the controller's modules import this one and not the other way
    round: the state knows a shape, not the class that has it.
    """

    session: Session | None
    reloaded: bool
    jobs: JobRunner
    session_changed: SignalInstance
    layers_changed: SignalInstance
    settings_changed: SignalInstance
    calibration_changed: SignalInstance

    @property
    def busy(self) -> bool: ...

    def lint(self, on_done: Callable[[list[Any]], None]) -> bool: ...

    def calibrate(self, **options: Any) -> bool: ...

    def apply_fix(self, fix: Any) -> list[str] | None: ...


class LintState(QObject):
    """What the last lint found (``warnings``; None: not linted since the project opened).

    Signals:
        changed: warnings, staleness or the reason lint could not run changed.
    """

    changed = Signal()

    def __init__(self, controller: LintHost) -> None:
        super().__init__(controller if isinstance(controller, QObject) else None)
        self._controller = controller
        self.warnings: list[Any] | None = None  # workbench.export.lint.LintWarning
        self.stale = False      # the project changed since the warnings were computed
        self.problem = ""       # why lint could not run (shown instead of warnings)
        self.needs_calibration = False  # the problem is one calibrating solves
        self._after_calibration = False
        controller.session_changed.connect(self.clear)
        for signal in (controller.layers_changed, controller.settings_changed, controller.calibration_changed):
            signal.connect(self.mark_stale)
        controller.calibration_changed.connect(self._calibrated)
        controller.jobs.failed.connect(self._failed)
        controller.jobs.cancelled.connect(self._cancelled)

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

    def calibration_problem(self) -> str:
        """Why the project cannot be exported (so linted) for want of calibration; "" when it was calibrated.
        Quantizers calibrated with other settings are the lint job's to find (its error says which)."""
        session = self._controller.session
        if session is not None and session.project.current_calibration is None:
            return NOT_CALIBRATED
        return ""

    def calibrated(self) -> bool:
        return self._controller.session is not None and not self.calibration_problem()

    # ----- running --------------------------------------------------------------------------------

    def run(self, *, calibrate_first: bool = False) -> bool:
        """Lint in the background (``calibrate_first``: calibrate with the project's settings, then lint); never
        calibrated, say so instead."""
        if self._controller.session is None:
            return self._controller.lint(self._done)  # the controller says "open a project first"
        if calibrate_first:
            self._after_calibration = self._controller.calibrate()
            return self._after_calibration
        problem = self.calibration_problem()
        if problem:
            self.problem, self.needs_calibration = problem, True
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
        """A project opened: its saved lint (if any) shows, stale when the project changed since it ran."""
        # the same project read back after worker processes calibrated it still wants its lint afterwards
        after = self._after_calibration and self._controller.reloaded
        self.warnings, self.stale, self.problem, self._after_calibration = None, False, "", after
        self.needs_calibration = False
        session = self._controller.session
        latest = session.latest_lint() if session is not None else None
        if latest is not None:
            self.warnings, self.stale = list(latest[0]), latest[1]
        self.changed.emit()

    def mark_stale(self, *_args: Any) -> None:
        """The project changed: the warnings are stale unless it is back to the state they were computed on."""
        session = self._controller.session
        if self.warnings is None or session is None:
            return
        latest = session.latest_lint()
        stale = True if latest is None else latest[1]
        if stale != self.stale:
            self.stale = stale
            self.changed.emit()

    def _done(self, warnings: list[Any]) -> None:
        self.warnings, self.stale, self.problem, self.needs_calibration = list(warnings), False, "", False
        self.changed.emit()

    def _cancelled(self, _name: str, _error: BaseException) -> None:
        self._after_calibration = False  # a calibration cancelled: the user changed their mind about linting too

    def _failed(self, name: str, error: BaseException, _details: str) -> None:
        self._after_calibration = False  # a calibration that failed is no reason to lint later
        if name == LINT_JOB:  # the error dialog says it too; the TensorRT tab keeps saying it
            # mostly quantizers calibrated with other settings: calibrating again is on offer
            self.problem, self.needs_calibration = f"Lint could not run: {error}", True
            self.changed.emit()

    def _calibrated(self) -> None:
        if self._after_calibration and self.calibrated() and not self._controller.busy:
            self._after_calibration = False
            self.run()
