"""Screenshots of the sensitivity, graph and export-report views on the calibrated demo.

Run under a display (Xvfb works: ``Xvfb :98 -screen 0 1400x900x24 & DISPLAY=:98 python
bench/gui_screenshots.py OUT_DIR``) or offscreen. It drives the real widgets through the controller:
create the demo project, calibrate, run sensitivity and a fallback search, export, show netron.
Prints where each PNG went; nothing is asserted (tests do that), this is for looking.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the PNGs")
    parser.add_argument("--only", nargs="*", default=["sensitivity", "export-report", "graph"])
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=820)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if "graph" in args.only:  # QtWebEngine wants its settings before the QApplication exists
        from workbench.app.graph_tab import prepare_application
        prepare_application()
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    from workbench.app.controller import Controller
    from workbench.sources.data_source import DataSpec
    from workbench.sources.model_source import ModelSpec

    controller = Controller()
    controller.error.connect(lambda title, message, details: print(f"ERROR {title}: {message}\n{details}"))

    def wait_for(signal, timeout_s: float = 120.0):
        loop = QEventLoop()
        got: list = []

        def done(*values):
            got.append(values)
            loop.quit()

        signal.connect(done)
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        loop.exec()
        signal.disconnect(done)
        if not got:
            raise TimeoutError(f"no {signal} in {timeout_s} s")
        return got[0]

    def settle(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.02)

    controller.new_project(ModelSpec("demo", "digits"),
                           DataSpec("demo", "digits", split="train", batch_size=64, num_batches=4),
                           DataSpec("demo", "digits", split="test", batch_size=256))
    wait_for(controller.session_changed)
    controller.calibrate(method="entropy")
    wait_for(controller.calibration_changed)

    def shoot(widget, name: str) -> None:
        path = args.out / f"{name}.png"
        widget.grab().save(str(path))
        print(f"{name}: {path} ({path.stat().st_size // 1024} KiB)")

    if "sensitivity" in args.only:
        from workbench.app.sensitivity_tab import SensitivityTab
        tab = SensitivityTab(controller)
        tab.resize(args.width, args.height)
        tab.show()
        tab.run_sensitivity()
        wait_for(controller.sensitivity_changed)
        tab.run_fallback()
        wait_for(controller.fallback_changed)
        tab.bar_clicked(1)
        settle(0.5)
        shoot(tab, "sensitivity")

    report = None
    if "export-report" in args.only or "graph" in args.only:
        folder = Path(tempfile.mkdtemp(prefix="workbench-shots-"))
        controller.export(folder / "digits.qdq.onnx", amax_json=True, calibration_cache=True)
        (report,) = wait_for(controller.export_finished)

    if "export-report" in args.only:
        from workbench.app.export_dialog import ExportReportDialog
        dialog = ExportReportDialog(report)
        dialog.show()
        settle(0.5)
        shoot(dialog, "export-report")

    if "graph" in args.only:
        from workbench.app.graph_tab import GraphTab
        graph = GraphTab(controller)
        graph.resize(args.width, args.height)
        graph.show_file(report.path)
        graph.show()
        deadline = time.monotonic() + 60
        while graph.page_state not in ("graph", "expired", "error", "browser") and time.monotonic() < deadline:
            settle(0.2)
        settle(1.5)  # let the graph finish its layout
        print("graph state:", graph.page_state)
        shoot(graph, "graph")
        graph.shutdown()
    controller.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb" if os.environ.get("DISPLAY") else "offscreen")
    sys.exit(main())
