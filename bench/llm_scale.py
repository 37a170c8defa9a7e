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
                              [--batch-size 4] [--seq 128] [--workers 2]

``calibrate-sequential`` is ``calibrate --sequential`` (one block at a time, the same amax; its output SQNR takes
one more walk over the blocks where the whole-model ``calibrate`` takes two more passes). ``calibrate-workers`` and
``calibrate-sequential-workers`` are the same with ``--workers N`` (issue 37 point 5). Every ``calibrate*`` step is
also sampled from outside (psutil, every 0.1 s): per process (the command, and each worker it starts) the peak RSS,
USS (memory only that process holds) and PSS (its share of the pages it shares): a second table shows them against
the one-process step's. Pages of the page cache a process maps count in its RSS whoever else maps them; USS is what a
rank really adds. The 0.1B and 0.5B checkpoints are under the lazy-open threshold: with ``WORKBENCH_LAZY_OPEN=always``
in the environment they open lazily as a 7B would.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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


_SAMPLE_S = 0.1


def _vmhwm_bytes(pid: int) -> int:
    """A process's peak RSS so far (VmHWM), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return 1024 * int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return 0


def run_sampled(args: list[str]) -> tuple[dict, list[dict]]:
    """:func:`run_step`, with the command's process and the worker processes it starts (the launcher spawns them:
    ``spawn_main`` in their command line) sampled every :data:`_SAMPLE_S`: per process, in the order they started,
    the most RSS (VmHWM), USS and PSS seen, in bytes."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([sys.executable, "-c", "import json\n" + _STEP, *args], stdout=subprocess.DEVNULL,
                                   stderr=err, text=True, env=env)
        peaks: dict[int, dict] = {}
        workers: dict[int, bool] = {}  # pid -> whether it is a worker (its command line, read once)
        root = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                children = root.children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                if child.pid not in workers:
                    try:
                        workers[child.pid] = "spawn_main" in " ".join(child.cmdline())
                    except psutil.Error:
                        continue
            for sampled in [root] + [c for c in children if workers.get(c.pid)]:
                try:
                    info = sampled.memory_full_info()
                except psutil.Error:
                    continue
                peak = peaks.setdefault(sampled.pid, {"rss": 0, "uss": 0, "pss": 0})
                peak["rss"] = max(peak["rss"], _vmhwm_bytes(sampled.pid), info.rss)
                peak["uss"] = max(peak["uss"], info.uss)
                peak["pss"] = max(peak["pss"], info.pss)
            time.sleep(_SAMPLE_S)
        err.seek(0)
        stderr = err.read()
    last = [line for line in stderr.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {"code": process.returncode, "wall_s": float("nan"), "peak_kib": 0}
    if result["code"] != 0:
        result["error"] = (stderr.strip().splitlines() or ["killed"])[-2 if last else -1][:200]
    main_peak = peaks.pop(process.pid, {"rss": 0, "uss": 0, "pss": 0})
    main_peak["rss"] = max(main_peak["rss"], result["peak_kib"] * 1024)  # its own last word on its peak
    return result, [dict(main_peak, role="command")] + [dict(peaks[pid], role=f"rank {rank}")
                                                       for rank, pid in enumerate(sorted(peaks))]


def run_step(args: list[str]) -> dict:
    """One ``workbench`` command in a fresh process: its exit code, wall time and peak RSS (KiB)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, "-c", "import json\n" + _STEP, *args], capture_output=True, text=True,
                          env=env)
    last = [line for line in done.stderr.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {"code": done.returncode, "wall_s": float("nan"), "peak_kib": 0}
    if result["code"] != 0:
        result["error"] = (done.stderr.strip().splitlines() or ["killed"])[-2 if last else -1][:200]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.1B")
    parser.add_argument("--precision", default="int4w")
    parser.add_argument("--root", default="/tmp/llm_scale")
    parser.add_argument("--steps", default="new,show,set,calibrate,calibrate-sequential,export")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="processes of the calibrate-*workers steps")
    args = parser.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    steps = args.steps.split(",")
    sampled: list[tuple[str, str, dict, list[dict]]] = []
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
                    "calibrate-workers": ["calibrate", project, "--method", "max", "--workers", args.workers],
                    "calibrate-sequential-workers": ["calibrate", project, "--method", "max", "--sequential",
                                                     "--workers", args.workers],
                    "export": ["export", project, "-o", output, "--force"]}
        for step in steps:
            started = time.perf_counter()
            if step.startswith("calibrate"):
                result, processes = run_sampled([str(a) for a in commands[step]])
                sampled.append((name, step, result, processes))
            else:
                result = run_step([str(a) for a in commands[step]])
            wall = result.get("wall_s") or time.perf_counter() - started
            peak = result["peak_kib"] * 1024
            if step.endswith("-workers"):  # its largest rank (the command itself only launches them)
                peak = max([process["rss"] for process in processes[1:]], default=peak)
            tail = f" (failed: {result['error']})" if result["code"] else ""
            print(f"| {name} | {step}{tail} | {wall:.1f} | {peak / gib:.2f} | {peak / weights:.2f} | "
                  f"{wall / forward['wall_s']:.2f} |", flush=True)
    if sampled:
        print_processes(sampled)


def print_processes(sampled: list[tuple[str, str, dict, list[dict]]]) -> None:
    """Per process of each calibrate step: peak RSS, USS and PSS, and each against the one-process step's (the
    same step without ``-workers``)."""
    gib = 1024 ** 3
    single = {(name, step): processes[0] for name, step, _, processes in sampled if not step.endswith("-workers")}
    walls = {(name, step): result.get("wall_s") for name, step, result, _ in sampled}
    print()
    print("| size | step | process | wall / one process | peak RSS GiB | peak USS GiB | peak PSS GiB | "
          "RSS / one process | USS / one process | PSS / one process |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, step, result, processes in sampled:
        reference = single.get((name, step.removesuffix("-workers")))
        one_wall = walls.get((name, step.removesuffix("-workers")))
        wall = f"{result['wall_s'] / one_wall:.2f}" if one_wall and result.get("wall_s") else "-"
        for process in processes:
            if step.endswith("-workers") and process["role"] == "command":
                continue  # the launcher: it holds no model
            ratios = [f"{process[k] / reference[k]:.2f}" if reference and reference[k] else "-"
                      for k in ("rss", "uss", "pss")]
            print(f"| {name} | {step} | {process['role']} | {wall} | {process['rss'] / gib:.2f} | "
                  f"{process['uss'] / gib:.2f} | {process['pss'] / gib:.2f} | {' | '.join(ratios)} |", flush=True)


if __name__ == "__main__":
    main()
