"""Time of the ladder's Apply, from the click to a calibrated model: on a 3.5M BERT classifier and a GPT-2 of the
same width.

Run: ``python bench/ladder_apply_latency.py [--repeat N] [--hidden 128 --layers 2 --vocab 24000] [--method auto]
[--mix '1 attention float']``.
Needs ``transformers``.

What the sensitivity tab's Apply runs, through the Session as its controller calls it: the edit
(``Session.apply_ladder``: in place for a change between quantized precisions; a rebuild of the quantized model
when a layer goes to or from float) and then the calibration of the new precisions. Two ways to calibrate are
measured in the same run, alternating: the whole model (``Session.calibrate``, what Apply did before) and only the
layers whose quantizers changed (``Session.calibrate_applied``, what it does now; the same amax). Two mixes: every
fourth INT8 GEMM to FP8 (no rebuild), the same plus one layer to float (in place since issue 36 round 3), and one
attention layer to float (its product quantizers off in place; a rebuild before). Between runs the Apply is
undone and the whole model calibrated again, untimed. The projects calibrate with their own method (``auto``, as
a new project's) on 4 batches of 8 sequences of 64 tokens. Prints medians and ratios; nothing is asserted.
(The GUI's event loop is left out: a bench driving the window crashed in PySide6 after a few Apply/Undo rounds,
which the app itself, driven by hand under Xvfb, did not.)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gui_edit_latency import bert_folder  # noqa: E402


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
    """The three mixes: every fourth GEMM to FP8; that plus the last of them to float; and one attention (its
    query, key, value and probabilities quantizers) to float."""
    from workbench.quant.nn.modules.quant_attention import QuantSDPA

    own = {name: (p.value if p is not None else "custom") for name, p in session.precisions().items()}
    attention = [name for name, module in session.quantized_model().named_modules()
                 if isinstance(module, QuantSDPA) and name in own]
    gemms = [name for name, word in own.items() if word == "int8" and name not in attention]
    fp8 = dict(own) | {name: "fp8" for name in gemms[1::4]}
    with_float = dict(fp8) | {gemms[-1]: "float"}
    return {"to FP8": fp8, "to FP8 + 1 float": with_float, "1 attention float": dict(own) | {attention[0]: "float"}}


def timed_apply(session, mix: dict[str, str], partial: bool) -> tuple[float, float]:
    """(the edit with the model it needs, then the calibration) in seconds."""
    started = time.perf_counter()
    session.apply_ladder(Mix(mix))
    session.quantized_model()  # the edit's rebuild (the GUI's model update job)
    edited = time.perf_counter()
    if partial:
        session.calibrate_applied()
    else:
        session.calibrate()
    return edited - started, time.perf_counter() - edited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=24000)
    parser.add_argument("--method", default=None, help="the projects' calibration method (default: a new project's)")
    parser.add_argument("--mix", action="append", default=None,
                        help="only this mix (repeatable): 'to FP8', 'to FP8 + 1 float' or '1 attention float'")
    args = parser.parse_args()

    import numpy as np

    from workbench.session import Session
    from workbench.sources.data_source import DataSpec
    from workbench.sources.model_source import ModelSpec

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, make in (("BERT", bert_folder), ("GPT-2", gpt2_folder)):
            model, tokens, params = make(Path(folder), args.hidden, args.layers, args.vocab)
            session = Session.create(ModelSpec("hf", str(model)), DataSpec("tensors", str(tokens), batch_size=8,
                                                                            num_batches=4))
            if args.method:
                session.update_setting("calibration", method=args.method)
            method = session.settings.calibration.method.value
            session.calibrate()
            for mix_label, mix in mixes(session).items():
                if args.mix and mix_label not in args.mix:
                    continue
                times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                whole: dict[str, np.ndarray] = {}
                for _ in range(args.repeat):
                    for partial in (False, True):
                        times[partial].append(timed_apply(session, mix, partial))
                        amax = {k: r.amax for k, r in session.project.current_calibration.quantizers.items()}
                        if partial:  # the same amax as the whole calibration just before
                            assert amax.keys() == whole.keys() and all(np.array_equal(amax[k], whole[k]) for k in amax)
                        whole = amax
                        session.undo_ladder_apply()
                        session.calibrate()
                rows.append((f"{name} ({params / 1e6:.1f}M)", method, mix_label,
                             *(statistics.median(t[i] for t in times[p]) for p in (False, True) for i in (0, 1))))
    print(f"ladder Apply to a calibrated model (median of {args.repeat}; load {os.getloadavg()[0]:.2f})")
    print(f"{'model':<16} {'method':<8} {'mix':<18} {'edit':>8} {'whole model':>12} {'changed only':>13} "
          f"{'Apply before':>13} {'Apply now':>10} {'ratio':>6}")
    for label, method, mix_label, edit, whole_s, edit2, changed in rows:
        before, now = edit + whole_s, edit2 + changed
        print(f"{label:<16} {method:<8} {mix_label:<18} {edit2 * 1000:>5.0f} ms {whole_s * 1000:>9.0f} ms "
              f"{changed * 1000:>10.0f} ms {before * 1000:>10.0f} ms {now * 1000:>7.0f} ms {before / now:>5.1f}x")


if __name__ == "__main__":
    main()
