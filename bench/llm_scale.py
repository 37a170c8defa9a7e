"""LLaMA-shaped bf16 decoders through the command line, as a deployment engineer runs them: per step the
wall time, the peak resident memory, the peak over the bf16 weights, and the time over a plain bf16 forward of
the same calibration batches.

Checkpoints (random weights, ``save_pretrained`` in bf16 safetensors) are written once under ``--root`` and
reused. Each step runs in its own fresh process (``python -m workbench STEP ...``), whose peak RSS comes from
``resource.getrusage(RUSAGE_SELF)`` at its exit; the plain forward runs in a fresh process too (transformers'
``from_pretrained`` in bf16, then the model on the same token batches). Run one size at a time on a shared
machine: the 1.1B row peaks at several GiB.

    python bench/llm_scale.py [--sizes 0.1B,0.5B,1.1B] [--precision int4w] [--root /tmp/llm_scale]
                              [--steps new,show,set,calibrate,calibrate-sequential,export] [--batches 2]
                              [--batch-size 4] [--seq 128]

``plain-export`` is a plain ``torch.onnx.export`` of the float bf16 model (no Q/DQ, weights as external data);
``export-int8`` and ``export-int4w`` set that precision and calibrate ``--sequential`` (not measured), then export
(a lazily opened checkpoint's weights streamed from it, :mod:`workbench.export.streamed_export`); their last column
also gives the time over the plain export.

``calibrate-sequential`` is ``calibrate --sequential`` (one block at a time, the same amax; its output SQNR takes
one more walk over the blocks where the whole-model ``calibrate`` takes two more passes).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name -> LlamaConfig sizes (hidden, intermediate, layers, heads, kv heads); vocab 32000 as LLaMA 2
SIZES = {"0.1B": (768, 2048, 12, 12, 12), "0.5B": (1280, 3456, 22, 20, 20), "1.1B": (2048, 5632, 22, 32, 4),
         "7B": (4096, 11008, 32, 32, 32)}
VOCAB = 32000

# this process's own peak: VmHWM, which starts afresh at exec; ru_maxrss keeps the peak of the process that forked
# it (the bench itself, 2.4 GiB after writing the 1.1B checkpoint, showed as every step's peak)
_PEAK = """
import resource
def peak_kib():
    try:
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""

_STEP = _PEAK + """
import sys, time
from workbench.cli import main
started = time.perf_counter()
code = main(sys.argv[1:])
print(json.dumps({"code": code, "wall_s": time.perf_counter() - started, "peak_kib": peak_kib()}), file=sys.stderr)
sys.exit(code)
"""

_FORWARD = _PEAK + """
import json, sys, time
import numpy as np, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
ids = torch.from_numpy(np.load(sys.argv[2]))
size = int(sys.argv[3]); count = int(sys.argv[4])
started = time.perf_counter()
with torch.no_grad():
    for i in range(count):
        model(input_ids=ids[i * size:(i + 1) * size])
print(json.dumps({"wall_s": time.perf_counter() - started, "peak_kib": peak_kib()}))
"""


# a plain torch.onnx.export of the same float bf16 model (torch.export-based, weights as external data): what the
# export rows' time is measured against (issue 37: within 1.5x)
_PLAIN_EXPORT = _PEAK + """
import json, sys, time
import numpy as np, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
model.config.use_cache = False
ids = torch.from_numpy(np.load(sys.argv[2]))[:1]
started = time.perf_counter()
torch.onnx.export(model, (), sys.argv[3], kwargs={"input_ids": ids}, dynamo=True, external_data=True,
                  optimize=True)
print(json.dumps({"wall_s": time.perf_counter() - started, "peak_kib": peak_kib()}))
"""


def write_checkpoint(root: Path, name: str, seq: int, rows: int) -> tuple[Path, Path, int]:
    """The bf16 checkpoint folder of ``name`` (written once) and its token ids; returns them and the bytes of the
    bf16 weights."""
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = root / f"llama-{name}"
    ids = root / f"ids-{seq}.npy"
    if not ids.exists():
        np.save(ids, np.random.default_rng(0).integers(0, VOCAB, (rows, seq)).astype(np.int64))
    if not (folder / "config.json").exists():
        hidden, inter, layers, heads, kv = SIZES[name]
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                             tie_word_embeddings=False)
        torch.manual_seed(0)
        with torch.device("cpu"):
            model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(folder, safe_serialization=True, max_shard_size="2GB")
        del model
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return folder, ids, weights


def run_step(args: list[str]) -> dict:
    """One ``workbench`` command in a fresh process: its exit code, wall time and peak RSS (KiB)."""
    # the checkpoints open lazily whatever their size (by default only those over 512 MiB do): the export rows
    # measure the streamed route (workbench/export/streamed_export.py)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "WORKBENCH_LAZY_OPEN": os.environ.get("WORKBENCH_LAZY_OPEN", "always")}
    done = subprocess.run([sys.executable, "-c", "import json\n" + _STEP, *args], capture_output=True, text=True,
                          env=env)
    last = [line for line in done.stderr.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {"code": done.returncode, "wall_s": float("nan"), "peak_kib": 0}
    if result["code"] != 0:  # the command's own last words (not the bench's JSON line), on either stream
        said = [line for line in (done.stderr + "\n" + done.stdout).strip().splitlines() if not line.startswith("{")]
        result["error"] = (said or ["killed"])[-1][:200]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.1B")
    parser.add_argument("--precision", default="int4w")
    parser.add_argument("--root", default="/tmp/llm_scale")
    parser.add_argument("--steps", default="new,show,set,calibrate,calibrate-sequential,export",
                        help="also: plain-export (torch.onnx.export of the float model), export-int8 and "
                             "export-int4w (set that precision and calibrate --sequential first, unmeasured; then "
                             "the export, measured against plain-export)")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    steps = args.steps.split(",")
    print("| size | step | wall s | peak RSS GiB | peak / bf16 weights | time / bf16 forward |")
    print("|---|---|---|---|---|---|")
    for name in args.sizes.split(","):
        folder, ids, weights = write_checkpoint(root, name, args.seq, args.batches * args.batch_size)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        forward = json.loads(subprocess.run([sys.executable, "-c", _FORWARD, str(folder), str(ids),
                                             str(args.batch_size), str(args.batches)], capture_output=True,
                                            text=True, env=env, check=True).stdout.strip().splitlines()[-1])
        gib = 1024 ** 3
        print(f"| {name} | plain bf16 forward ({args.batches} x {args.batch_size} x {args.seq}) | "
              f"{forward['wall_s']:.1f} | {forward['peak_kib'] * 1024 / gib:.2f} | "
              f"{forward['peak_kib'] * 1024 / weights:.2f} | 1.00 |", flush=True)
        project = root / f"llama-{name}.qwb"
        output = root / f"llama-{name}-{args.precision}.onnx"
        commands = {"new": ["new", project, "--model", f"hf:{folder}", "--data", ids, "--batch-size",
                            args.batch_size, "--num-batches", args.batches, "--output-key", "logits", "--force"],
                    "show": ["show", project],
                    "set": ["set", project, "--type", "Linear", "--precision", args.precision],
                    "calibrate": ["calibrate", project, "--method", "max"],
                    "calibrate-sequential": ["calibrate", project, "--method", "max", "--sequential"],
                    "export": ["export", project, "-o", output, "--force"]}
        plain = None
        for step in steps:
            if step == "plain-export":
                plain = json.loads(subprocess.run(
                    [sys.executable, "-c", _PLAIN_EXPORT, str(folder), str(ids), str(root / f"plain-{name}.onnx")],
                    capture_output=True, text=True, env=env, check=True).stdout.strip().splitlines()[-1])
                print(f"| {name} | plain torch.onnx.export (bf16, no Q/DQ) | {plain['wall_s']:.1f} | "
                      f"{plain['peak_kib'] * 1024 / gib:.2f} | {plain['peak_kib'] * 1024 / weights:.2f} | "
                      f"{plain['wall_s'] / forward['wall_s']:.2f} (1.00 of plain export) |", flush=True)
                continue
            if step.startswith("export-"):
                precision = step.split("-", 1)[1]
                for prepare in (["set", project, "--type", "Linear", "--precision", precision],
                                ["calibrate", project, "--method", "max", "--sequential"]):
                    prepared = run_step([str(a) for a in prepare])
                    if prepared["code"]:
                        print(f"| {name} | {step} (failed to {prepare[0]}: {prepared.get('error')}) | | | | |")
                        break
                commands[step] = ["export", project, "-o", root / f"llama-{name}-{precision}.onnx", "--force"]
            started = time.perf_counter()
            result = run_step([str(a) for a in commands[step]])
            wall = result.get("wall_s") or time.perf_counter() - started
            peak = result["peak_kib"] * 1024
            tail = f" (failed: {result['error']})" if result["code"] else ""
            versus = f" ({wall / plain['wall_s']:.2f} of plain export)" if plain and "export" in step else ""
            print(f"| {name} | {step}{tail} | {wall:.1f} | {peak / gib:.2f} | {peak / weights:.2f} | "
                  f"{wall / forward['wall_s']:.2f}{versus} |", flush=True)


if __name__ == "__main__":
    main()
