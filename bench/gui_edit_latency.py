"""Time from a descriptor edit to a ready window: on a 3.5M-parameter BERT classifier and on the demo CNN.

Run: ``python bench/gui_edit_latency.py [--repeat N] [--hidden 128 --layers 2 --vocab 24000]``. Uses the
offscreen platform unless ``QT_QPA_PLATFORM`` says otherwise; needs ``transformers`` for the BERT row.

For each model the real main window opens a calibrated project; then the time is taken from the Apply of an
edit of one Linear/Conv, through the controller as the layer panel and the tree's menus do, until the window
is ready again: no job running, the tree and the layer panel refreshed. Three edits: a descriptor edit (the
weight bits), a reset to the default descriptor (after an untimed descriptor edit) and a precision change
(fp8 and int8 in turn). Two paths are measured for each in the same run: the edit as it is applied now (the
edited quantizers swapped in place) and the edit followed by a full rebuild of the quantized model (what
the edit cost before: tracing, placement rules, restoring calibration). Prints the medians and their ratio;
nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("WORKBENCH_NO_WEBENGINE", "1")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def wait(app: QApplication, condition, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get ready in time")
        app.processEvents()
        time.sleep(0.001)


def ready(window) -> bool:
    return (not window.controller.busy and not window.tree._refresh.scheduled()
            and not window.layer_panel._refresh.scheduled() and not window.layer_panel._plot_timer.isActive())


def bert_folder(folder: Path, hidden: int, layers: int, vocab: int) -> tuple[Path, Path, int]:
    import numpy as np
    import torch
    import transformers

    config = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=4 * hidden, max_position_embeddings=128,
                                     num_labels=2, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(folder / "bert")
    ids = np.random.default_rng(0).integers(0, vocab, size=(32, 64)).astype(np.int64)
    np.savez(folder / "tokens.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    return folder / "bert", folder / "tokens.npz", sum(p.numel() for p in model.parameters())


# the edits timed: (row label, the edit through the controller for the n-th run, an untimed step before it)
EDITS = {
    "descriptor": lambda c, layer, n: c.set_descriptor([layer], "weight", {"num_bits": (6, 8)[n % 2]}),
    "reset": lambda c, layer, n: c.reset_descriptor([layer]),
    "precision": lambda c, layer, n: c.set_precision([layer], ("fp8", "int8")[n % 2]),
}
BEFORE = {"reset": lambda c, layer, n: c.set_descriptor([layer], "weight", {"num_bits": 6})}


def measure(app, window, layer: str, repeat: int, edit: str = "descriptor") -> tuple[list[float], list[float]]:
    """(in-place times, edit + rebuild times) in seconds of ``edit``, each run changing something."""
    controller = window.controller
    in_place, rebuilt = [], []
    for i in range(repeat):
        for mode in ("in place", "rebuild"):
            session = controller.session
            run = 2 * i + (mode == "rebuild")
            if edit in BEFORE:
                assert BEFORE[edit](controller, layer, run) is not None, "the step before the edit was refused"
                wait(app, lambda: ready(window))
                session.quantized_model()  # the step's own rebuild (if any) is not the edit's
            started = time.perf_counter()
            changed = EDITS[edit](controller, layer, run)
            if mode == "rebuild":
                session._invalidate()  # what an edit did before: the quantized model built again
                controller._forget_views()
                controller.layers_changed.emit()
            wait(app, lambda: ready(window))
            if mode == "rebuild":
                session.quantized_model()  # the rebuild itself, when the window's views did not need it yet
            elapsed = time.perf_counter() - started
            assert changed is not None, "the edit was refused"
            (in_place if mode == "in place" else rebuilt).append(elapsed)
    return in_place, rebuilt


def open_project(app, window, model, data) -> None:
    controller = window.controller
    assert controller.new_project(model, data)
    wait(app, lambda: controller.session is not None and ready(window))
    assert controller.calibrate(method="max")
    wait(app, lambda: controller.session.project.current_calibration is not None and ready(window))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=24000)
    args = parser.parse_args()

    from workbench.app.main_window import MainWindow
    from workbench.sources.data_source import DataSpec
    from workbench.sources.model_source import ModelSpec

    app = QApplication.instance() or QApplication(sys.argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        cases = [("demo digits CNN", ModelSpec("demo", "digits"),
                  DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2), "block.conv1", None)]
        try:
            bert, tokens, params = bert_folder(Path(folder), args.hidden, args.layers, args.vocab)
            cases.append((f"BERT ({params / 1e6:.1f}M parameters)", ModelSpec("hf", str(bert)),
                          DataSpec("tensors", str(tokens), batch_size=8, num_batches=2),
                          "bert.encoder.layer.0.attention.self.query", params))
        except ImportError:
            print("transformers is not installed: the BERT row is left out")
        for label, model, data, layer, _ in cases:
            settings = QSettings(str(Path(folder) / f"{len(rows)}.ini"), QSettings.Format.IniFormat)
            window = MainWindow(settings=settings)
            window.resize(1400, 900)
            window.show()
            try:
                open_project(app, window, model, data)
                window.controller.select([layer])
                wait(app, lambda w=window: ready(w))
                for edit in EDITS:
                    in_place, rebuilt = measure(app, window, layer, args.repeat, edit)
                    rows.append((label, edit, statistics.median(in_place), statistics.median(rebuilt)))
            finally:
                if window.controller.session is not None:
                    window.controller.session.dirty = False  # closing would ask about unsaved changes
                window.shutdown()
                window.close()
    print(f"edit to a ready window (median of {args.repeat}; load: {os.getloadavg()[0]:.2f})")
    print(f"{'model':<28} {'edit':<11} {'in place':>10} {'edit + rebuild':>15} {'ratio':>7}")
    for label, edit, fast, slow in rows:
        print(f"{label:<28} {edit:<11} {fast * 1000:>8.0f} ms {slow * 1000:>12.0f} ms {slow / fast:>6.1f}x")


if __name__ == "__main__":
    main()
