"""Time of the ladder's Apply in the desktop app, from the click to a calibrated, ready window: on a 3.5M BERT
classifier and a GPT-2 of the same width.

Run: ``python bench/ladder_apply_latency.py [--repeat N] [--hidden 128 --layers 2 --vocab 24000] [--method auto]``.
Uses the offscreen platform unless ``QT_QPA_PLATFORM`` says otherwise; needs ``transformers``.

The real main window opens a calibrated project (the project's calibration method, ``auto`` by default as a new
project has it). A ladder mix is applied through the controller as the sensitivity tab's Apply does: the edit
(in place for a change between quantized precisions; a rebuild when a layer goes to or from float) and then the
calibration of the new precisions. Two ways to calibrate are measured in the same run, alternating: the whole
model (what Apply did before) and only the layers whose quantizers changed (what it does now; the same amax).
Two mixes: a quarter of the GEMMs to FP8 (no rebuild), and the same plus one layer to float (a rebuild). Between
runs the Apply is undone and the whole model calibrated again, untimed. Prints medians and ratios; nothing is
asserted.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gui_edit_latency import bert_folder, ready, wait  # noqa: E402


class Mix:
    """A ladder result as Apply reads it."""

    def __init__(self, precisions: dict[str, str]) -> None:
        self.precisions, self.applied = precisions, False


def gpt2_folder(folder: Path, hidden: int, layers: int, vocab: int) -> tuple[Path, Path, int]:
    import numpy as np
    import torch
    import transformers

    config = transformers.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=128,
                                     bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder / "gpt2")
    ids = np.random.default_rng(0).integers(0, vocab, size=(32, 64)).astype(np.int64)
    np.savez(folder / "gpt2_tokens.npz", input_ids=ids)
    return folder / "gpt2", folder / "gpt2_tokens.npz", sum(p.numel() for p in model.parameters())


def mixes(session) -> dict[str, dict[str, str]]:
    """The two mixes: every fourth GEMM to FP8; and that plus the last of them to float."""
    own = {name: (p.value if p is not None else "custom") for name, p in session.precisions().items()}
    gemms = [name for name, word in own.items() if word == "int8"]
    fp8 = dict(own) | {name: "fp8" for name in gemms[1::4]}
    with_float = dict(fp8) | {gemms[-1]: "float"}
    return {"to FP8": fp8, "to FP8 + 1 float": with_float}


def timed_apply(app, window, mix: dict[str, str], partial: bool) -> tuple[float, float]:
    """(edit until the model is updated, then the calibration until the window is ready) in seconds."""
    controller = window.controller
    started = time.perf_counter()
    assert controller.apply_ladder(Mix(mix)) is not None, "Apply was refused"
    wait(app, lambda: not controller.busy)
    controller.session.quantized_model()  # the edit's rebuild, when no view asked for the model yet
    edited = time.perf_counter()
    assert (controller.calibrate_applied() if partial else controller.calibrate())
    wait(app, lambda: not controller.busy and ready(window))
    return edited - started, time.perf_counter() - edited


def reset(app, window) -> None:
    controller = window.controller
    assert controller.undo_ladder_apply() is not None
    wait(app, lambda: ready(window))
    assert controller.calibrate()
    wait(app, lambda: not controller.busy and ready(window))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=24000)
    parser.add_argument("--method", default=None, help="the projects' calibration method (default: a new project's)")
    args = parser.parse_args()

    from workbench.app.main_window import MainWindow
    from workbench.sources.data_source import DataSpec
    from workbench.sources.model_source import ModelSpec

    app = QApplication.instance() or QApplication(sys.argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        cases = []
        for name, make in (("BERT", bert_folder), ("GPT-2", gpt2_folder)):
            model, tokens, params = make(Path(folder), args.hidden, args.layers, args.vocab)
            cases.append((f"{name} ({params / 1e6:.1f}M)", ModelSpec("hf", str(model)),
                          DataSpec("tensors", str(tokens), batch_size=8)))
        for label, model, data in cases:
            settings = QSettings(str(Path(folder) / f"{len(rows)}.ini"), QSettings.Format.IniFormat)
            window = MainWindow(settings=settings)
            window.resize(1400, 900)
            window.show()
            controller = window.controller
            try:
                assert controller.new_project(model, data)
                wait(app, lambda c=controller, w=window: c.session is not None and ready(w))
                if args.method:
                    controller.session.update_setting("calibration", method=args.method)
                method = controller.session.settings.calibration.method.value
                assert controller.calibrate()
                wait(app, lambda c=controller, w=window: c.session.project.current_calibration is not None and ready(w))
                for mix_label, mix in mixes(controller.session).items():
                    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                    for _ in range(args.repeat):
                        for partial in (False, True):
                            times[partial].append(timed_apply(app, window, mix, partial))
                            reset(app, window)
                    rows.append((label, method, mix_label,
                                 *(statistics.median(t[i] for t in times[p]) for p in (False, True) for i in (0, 1))))
            finally:
                if controller.session is not None:
                    controller.session.dirty = False  # closing would ask about unsaved changes
                window.shutdown()
                window.close()
    print(f"ladder Apply to a calibrated, ready window (median of {args.repeat}; load {os.getloadavg()[0]:.2f})")
    print(f"{'model':<16} {'method':<8} {'mix':<18} {'edit':>8} {'whole model':>12} {'changed only':>13} "
          f"{'Apply before':>13} {'Apply now':>10} {'ratio':>6}")
    for label, method, mix_label, edit, whole, edit2, changed in rows:
        before, now = edit + whole, edit2 + changed
        print(f"{label:<16} {method:<8} {mix_label:<18} {edit2 * 1000:>5.0f} ms {whole * 1000:>9.0f} ms "
              f"{changed * 1000:>10.0f} ms {before * 1000:>10.0f} ms {now * 1000:>7.0f} ms {before / now:>5.1f}x")


if __name__ == "__main__":
    main()
