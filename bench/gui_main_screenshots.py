"""Screenshots of the main window's views on the demo project (or ``--bert``: a 3.5M-parameter BERT), for the README
(``resources/screenshots``).

Run under an X display, e.g.::

    Xvfb :99 -screen 0 1600x1000x24 &
    DISPLAY=:99 python bench/gui_main_screenshots.py resources/screenshots

It drives the real window the way a user would (open the demo, calibrate, select a layer, filter the
tree, open each tab and dialog) and grabs the whole screen with ImageMagick's ``import -window root``
after each step, so popups and dialogs are in the picture. Prints each file written; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEMO_NAMES = {"float": "block.conv2", "histogram": "block.conv1", "filter": "conv",
              "several": ["stem.0", "block.conv1", "expand.0"], "patterns": r"^fc$" + "\n" + r".*add$"}
BERT_NAMES = {"float": "bert.encoder.layer.1.output.dense", "histogram": "bert.encoder.layer.0.attention.self.query",
              "filter": "query", "several": [f"bert.encoder.layer.{i}.attention.self.query" for i in (0, 1)],
              "patterns": r"classifier" + "\n" + r".*\.output\.dense$"}


def bert_project(folder: Path) -> tuple[Path, Path]:
    """A 3.5M-parameter BERT classifier saved with save_pretrained, and token ids named after its forward."""
    import numpy as np
    import torch
    import transformers

    config = transformers.BertConfig(vocab_size=24000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=512, max_position_embeddings=128, num_labels=2,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder / "bert")
    ids = np.random.default_rng(0).integers(0, 24000, size=(32, 64)).astype(np.int64)
    np.savez(folder / "tokens.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    return folder / "bert", folder / "tokens.npz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="names of the shots to take (default: all)")
    parser.add_argument("--bert", action="store_true",
                        help="a 3.5M-parameter BERT classifier (Hugging Face folder, token ids) instead of the demo")
    args = parser.parse_args(argv)
    if not os.environ.get("DISPLAY"):
        print("needs an X display (DISPLAY); start Xvfb first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    from PySide6.QtCore import QPoint, QSettings
    from PySide6.QtWidgets import QApplication, QMessageBox

    from workbench.app.main import create_application
    from workbench.app.main_window import MainWindow

    app = create_application()
    settings = QSettings(str(Path(tempfile.mkdtemp()) / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    screen = app.primaryScreen().geometry()
    window.setGeometry(screen)
    window.show()
    work = Path(tempfile.mkdtemp(prefix="shots-"))

    def pump(seconds: float = 0.3) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    def wait(condition, timeout: float = 180.0) -> None:
        end = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > end:
                raise TimeoutError("timed out")
            app.processEvents()
            time.sleep(0.01)
        pump()

    def shot(name: str) -> None:
        if args.only and name not in args.only:
            return
        pump(0.6)
        target = args.out / f"{name}.png"
        subprocess.run(["import", "-window", "root", str(target)], check=True)
        print(f"{target} ({target.stat().st_size // 1024} KB)")

    idle = lambda: not window.controller.busy  # noqa: E731
    names = BERT_NAMES if args.bert else DEMO_NAMES
    if args.bert:
        from workbench.sources.data_source import DataSpec
        from workbench.sources.model_source import ModelSpec

        folder, tokens = bert_project(work)
        window.controller.new_project(ModelSpec("hf", str(folder)), DataSpec("tensors", str(tokens), batch_size=8,
                                                                             num_batches=4), base_dir=work)
    else:
        window.open_demo()
    wait(lambda: window.controller.session is not None and idle() and window.tree.model.node_count() > 0)
    window.controller.session.project.settings["export"]["path"] = str(work / "model.qdq.onnx")
    shot("main-window")  # the project, ready to calibrate
    window.controller.set_quantize([names["float"]], False)
    wait(idle)  # a big model rebuilds in the background; the Calibrate action is off meanwhile
    window.calibrate_action.trigger()
    wait(idle)
    window.controller.select([names["histogram"]])
    wait(lambda: window.layer_panel.histogram_item is not None)
    shot("layer-panel")  # tree with a partial container, histogram with amax lines, weight ranges

    # the tree filtered, several layers selected, the context menu open
    window.tree.filter_edit.setText(names["filter"])
    window.tree.apply_filter()
    window.controller.select(names["several"])
    pump()
    view = window.tree.view
    rect = view.visualRect(window.tree.proxy.mapFromSource(window.tree.model.index_of(names["several"][1])))
    menu = window.tree.context_menu()
    menu.popup(view.viewport().mapToGlobal(QPoint(rect.center().x(), rect.bottom())))
    shot("tree-context-menu")
    menu.close()
    window.tree.filter_edit.clear()
    window.tree.apply_filter()

    patterns = window.tree.ignore_pattern_dialog()
    patterns.editor.setPlainText(names["patterns"])
    patterns.update_preview()
    shot("ignore-by-pattern")
    patterns.reject()

    window.controller.select(names["several"][:2])
    dialog = window.tree.set_descriptor_dialog()
    shot("set-descriptor")
    dialog.reject()

    settings_dialog = window.settings_dialog()
    if settings_dialog is not None:
        shot("project-settings")  # calibration, metric, export defaults and device in one dialog
        settings_dialog.reject()

    for title in ("Sensitivity", "Graph", "Fine-tune"):
        tab = window.extra_tabs.get(title)
        if tab is None:
            print(f"no {title} tab in this build")
            continue
        if title == "Sensitivity":
            window.controller.sensitivity()
            wait(idle)
            tab.fallback_panel.run_fallback()  # the search's plot: metric against units left in float
            wait(idle)
        if title == "Graph":
            window.export()
            wait(idle)
            report = window.export_report_dialog
            if report is not None:
                shot("window-export-report")
                report.close()
        if title == "Fine-tune":
            if args.bert:
                continue  # token ids without labels: nothing to fine-tune on
            tab.run()  # two short epochs, so the plots and the table have something to show
            wait(idle)
        window.tabs.setCurrentWidget(tab)
        if title == "Graph":
            wait(lambda t=tab: getattr(t, "page_state", "graph") not in ("loading", "empty"), timeout=60)
            pump(2.0)
        shot("window-" + title.lower())
    window.tabs.setCurrentIndex(0)

    window.controller.session.dirty = False  # the wizard would ask about unsaved changes first
    wizard = window.new_project()
    shot("new-project-wizard")
    wizard.next()
    shot("new-project-wizard-data")
    wizard.reject()

    bad = work / "broken.qwb"
    bad.write_text("not a project")
    window.open_project(bad)
    wait(lambda: bool(window.error_dialogs))
    box = window.error_dialogs[-1]
    details = next((b for b in box.buttons() if box.buttonRole(b) == QMessageBox.ButtonRole.ActionRole), None)
    if details is not None:
        details.click()  # "Show Details…"
    shot("error-dialog")
    box.close()

    window.controller.session.dirty = False
    window.close()
    QApplication.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
