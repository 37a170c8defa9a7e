"""The longest event-loop stall of the main window while the demo model calibrates in the background.

Run: ``python bench/gui_responsiveness.py [--repeat N] [--batches N]``. Uses the offscreen platform
unless ``QT_QPA_PLATFORM`` says otherwise. A QTimer fires every 10 ms on the GUI thread and records
the gap between firings; the gaps over one idle second give the baseline, then the gaps while the
real window calibrates the demo project (histogram calibrators, entropy) through its toolbar action,
with progress reaching the status bar. Prints the longest gap and the share of late ticks, measured in
this run. The target is no gap over 100 ms; nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QElapsedTimer, QSettings, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


class GapRecorder:
    """Gaps between the firings of a 10 ms timer (the time the event loop could not run it)."""

    def __init__(self, interval_ms: int = 10) -> None:
        self.interval_ms = interval_ms
        self.gaps: list[float] = []
        self.clock = QElapsedTimer()
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.gaps = []
        self.clock.start()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        self.gaps.append(self.clock.restart() / 1.0)

    def summary(self) -> str:
        if not self.gaps:
            return "no ticks"
        gaps = sorted(self.gaps)
        late = sum(1 for g in gaps if g > 50)
        p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
        return (f"{len(gaps)} ticks, longest gap {gaps[-1]:.0f} ms, 99th percentile {p99:.0f} ms, "
                f"{late} gaps over 50 ms, {sum(1 for g in gaps if g > 100)} over 100 ms")


def wait(app: QApplication, condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get there in time")
        app.processEvents()
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="calibrations to measure")
    parser.add_argument("--batches", type=int, default=0, help="calibration batches (0: all of the demo's 22)")
    args = parser.parse_args()

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from workbench.app.main_window import MainWindow

    settings = QSettings(str(Path(tempfile.mkdtemp()) / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    window.show()
    window.open_demo()
    wait(app, lambda: window.controller.session is not None and not window.controller.busy
         and window.tree.model.node_count() > 0)
    session = window.controller.session
    # all the demo's training images (the project uses 8 batches): a longer job to watch
    from workbench.sources.data_source import DataSpec

    session.set_data("calibration", DataSpec("demo", "digits", split="train", batch_size=64,
                                             num_batches=args.batches or None))
    session.project.settings["calibration"]["num_batches"] = None
    window.controller.select(["block.conv1"])  # the layer panel redraws its histogram after each run

    recorder = GapRecorder()
    recorder.start()
    end = time.monotonic() + 1.0
    wait(app, lambda: time.monotonic() > end)
    recorder.stop()
    print(f"idle (1 s): {recorder.summary()}")

    progress_events = []
    window.controller.jobs.progress.connect(progress_events.append)
    worst = 0.0
    for run in range(1, args.repeat + 1):
        progress_events.clear()
        recorder.start()
        started = time.perf_counter()
        window.calibrate_action.trigger()
        wait(app, lambda: not window.controller.busy)
        elapsed = time.perf_counter() - started
        # keep measuring while the views refresh (tree rows, histogram) after the job
        settle_until = time.monotonic() + 0.3
        wait(app, lambda until=settle_until: time.monotonic() > until)
        recorder.stop()
        worst = max(worst, max(recorder.gaps, default=0.0))
        batches = progress_events[-1].total if progress_events else 0
        print(f"calibration {run}: {elapsed:.2f} s, {batches} batches, {len(progress_events)} progress updates; "
              f"{recorder.summary()}")
    print(f"longest event-loop stall while calibrating: {worst:.0f} ms (target: under 100 ms)")
    window.controller.session.dirty = False  # nothing to save: close without asking
    window.close()
    window.shutdown()


if __name__ == "__main__":
    main()
