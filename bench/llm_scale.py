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
                              [--batch-size 4] [--seq|--tokens 128] [--no-forward] [--repo CHECKOUT]
                              [--lazy-open auto|always|never] [--workers 2]

``plain-export`` is a plain ``torch.onnx.export`` of the float bf16 model (no Q/DQ, weights as external data, static
shapes); ``plain-export-dynamic`` the same with batch and sequence axes free, as the product's files have them
(torch.export's symbolic shapes alone double its time: 19.5 -> 37.7 CPU s on the 70M);
``export-int8`` and ``export-int4w`` set that precision and calibrate ``--sequential`` (not measured), then export
(a lazily opened checkpoint's weights streamed from it, :mod:`workbench.export.streamed_export`); their last column
also gives the time over the plain export.

The 7B row (13.5 GB of bf16 weights, written once, shard by shard) on a 24 GB machine: a small calibration and no
whole-model step, ``python bench/llm_scale.py --sizes 7B --batches 1 --batch-size 1 --tokens 32 --no-forward
--lazy-open auto --steps new,set,calibrate-sequential,export`` (``plain-export`` is skipped with a line saying why
where the weights exceed half the memory available: ``from_pretrained`` alone holds them all).

``calibrate-sequential`` is ``calibrate --sequential`` (one block at a time, the same amax; its output SQNR takes
one more walk over the blocks, as the whole-model ``calibrate`` takes one more pass: the float outputs are the
collecting pass's). A ``calibrate*`` row's last column is the calibration job's own time (its summary's) over the
plain forward: the wall time also holds the imports, opening the project and saving it, which the plain forward's
time (the forwards alone) does not. Every export step also prints where its time went (a second table: the
reference forwards, torch.export, the translation, the optimizer, writing, INT4 folding, the checker, the ONNX
runs, the parity batches, the headline), from timers around the export's functions (inclusive times, wall and
CPU seconds: the machine is shared, and CPU time is what compares across runs; the plain export's CPU time too).
``calibrate-smoothquant`` and ``calibrate-smoothquant-sequential`` are the same with ``--smoothquant 0.5`` (use
``--precision int8``): the smoothing planned on the whole model, or one block at a time (the same scales) before
the calibration walks the blocks; ``calibrate-awq`` and ``calibrate-awq-sequential`` likewise with ``--awq on``
(``--precision int4w``). ``--lazy-open always`` opens checkpoints under 512 MiB (the 0.1B one) lazily too, as
larger ones open by default, so that a sequential step reads each block's weights when it runs.
``fallback``/``fallback-sequential`` and ``ladder``/``ladder-sequential`` (``--ladder``, default int8,fp8,float)
search the calibrated project for the output SQNR 3 dB above the start, by whole-model passes (after a one-off
ranking) or one block at a time (:mod:`workbench.analysis.block_search`); run them after a ``calibrate*`` step.
``calibrate-workers`` and ``calibrate-sequential-workers`` are ``calibrate`` and ``calibrate-sequential`` with
``--workers N`` (issue 37 point 5). Every ``calibrate*`` step is also sampled from outside (psutil, every 0.1 s): per
process (the command, and each worker it starts) the peak RSS, USS (memory only that process holds) and PSS (its
share of the pages it shares): a second table shows them against the one-process step's. Pages of the page cache a
process maps count in its RSS whoever else maps them; USS is what a rank really adds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name -> LlamaConfig sizes (hidden, intermediate, layers, heads, kv heads); vocab 32000 as LLaMA 2; 70M: for
# profiling (the 0.1B's ratios, faster; its blocks hold over half the weights, as sequential calibration needs)
SIZES = {"70M": (512, 1408, 12, 8, 8), "0.1B": (768, 2048, 12, 12, 12), "0.5B": (1280, 3456, 22, 20, 20),
         "1.1B": (2048, 5632, 22, 32, 4),
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
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "wall_s": time.perf_counter() - started, "peak_kib": peak_kib(),
                  "cpu_s": usage.ru_utime + usage.ru_stime, "parts": globals().get("_TIMES", {})}), file=sys.stderr)
sys.exit(code)
"""

# An export step's time per part (the export's functions wrapped with timers, by the names their callers look them
# up by): inclusive times, so nested parts (the parity batches' forwards inside validation) are also in their
# parent's; calls counted. Printed by the bench as a second table under the export rows.
_BREAKDOWN = """
import importlib, time
_PARTS = [
    ("workbench.cli.jobs", "open_project", "open the project (build the model, quantizers, calibration)"),
    ("workbench.export.onnx_export", "run_references", "reference outputs: fake-quant forwards (sample, batch 2, "
     "sequence +1)"),
    ("torch.export", "export", "trace: torch.export"),
    ("torch.onnx", "export", "translate: torch.onnx.export of the program"),
    ("torch.onnx._internal.exporter._onnx_program.ONNXProgram", "optimize", "optimizer (onnxscript)"),
    ("workbench.export.exporters", "_graph_only", "graph and initializers written (onnx_ir.save)"),
    ("workbench.export.capture", "fold_int4_casts", "INT4 casts folded and packed"),
    ("workbench.export.onnx_export", "capture", "capture in all"),
    ("workbench.export.onnx_export", "post_process_graph", "Q/DQ named and counted"),
    ("workbench.export.file_checks", "stage", "file staged (written beside the target)"),
    ("onnx.checker", "check_model", "onnx.checker"),
    ("workbench.export.file_checks", "piecewise_session", "validation: block pieces planned"),
    ("workbench.export.blockwise_validation.PiecewiseSession", "run", "validation: ONNX runs, block by block"),
    ("workbench.export.file_checks", "block_rows", "validation: block rows (their fake-quant inputs and outputs)"),
    ("workbench.export.parity_checks", "run_reference", "validation: parity batch fake-quant forward"),
    ("workbench.export.file_checks", "batch_checks", "validation: parity batches (forward and ONNX run)"),
    ("workbench.export.onnx_export", "validate", "validation in all"),
    ("workbench.export.onnx_export", "_commit", "file committed"),
    ("workbench.export.onnx_export", "_write_side_files", "side files"),
    ("workbench.session.exports", "headline", "headline: the evaluation (float, and quantized where no parity "
     "batch ran it)"),
]
_TIMES = {}


def _timed(owner, attr, label):
    original = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        started, cpu = time.perf_counter(), time.process_time()  # CPU too: on a loaded machine wall times swing
        try:
            return original(*args, **kwargs)
        finally:
            spent, calls, used = _TIMES.get(label, (0.0, 0, 0.0))
            _TIMES[label] = (spent + time.perf_counter() - started, calls + 1, used + time.process_time() - cpu)
    setattr(owner, attr, wrapper)


for where, attr, label in _PARTS:
    try:
        if where.endswith((".ONNXProgram", ".PiecewiseSession")):
            path, name = where.rsplit(".", 1)
            owner = getattr(importlib.import_module(path), name)
        else:
            owner = importlib.import_module(where)
        _timed(owner, attr, label)
    except (ImportError, AttributeError):
        pass
"""

_FORWARD = _PEAK + """
import json, sys, time
import numpy as np, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
ids = torch.from_numpy(np.load(sys.argv[2]))
size = int(sys.argv[3]); count = int(sys.argv[4])
before = resource.getrusage(resource.RUSAGE_SELF)
cpu_before = before.ru_utime + before.ru_stime  # the forwards' own CPU time, as their wall time
started = time.perf_counter()
with torch.no_grad():
    for i in range(count):
        model(input_ids=ids[i * size:(i + 1) * size])
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - started, "peak_kib": peak_kib(),
                  "cpu_s": usage.ru_utime + usage.ru_stime - cpu_before}))
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
# "dynamic": batch and sequence axes free, as the product's files have them (torch.export then reasons on symbols)
dynamic = {"dynamic_shapes": {"input_ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}}} \
    if sys.argv[4] == "dynamic" else {}
before = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
torch.onnx.export(model, (), sys.argv[3], kwargs={"input_ids": ids}, dynamo=True, external_data=True,
                  optimize=True, **dynamic)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - started, "peak_kib": peak_kib(),
                  "cpu_s": usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime}))
"""


def write_checkpoint(root: Path, name: str, seq: int, rows: int) -> tuple[Path, Path, int]:
    """The bf16 checkpoint folder of ``name`` (written once) and its token ids; returns them and the bytes of the
    bf16 weights.

    Written shard by shard (2 GiB each, with the index ``save_pretrained`` writes): the model is built on meta for
    its tensor names and shapes, and each shard's random weights (normal, std 0.02, as LLaMA's init; norms 1) are
    made, saved and dropped before the next, so a 7B checkpoint (13.5 GB) is never whole in memory."""
    import numpy as np
    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = root / f"llama-{name}"
    ids = root / f"ids-{seq}.npy"
    if not ids.exists():
        np.save(ids, np.random.default_rng(0).integers(0, VOCAB, (rows, seq)).astype(np.int64))
    if not (folder / "config.json").exists():
        hidden, inter, layers, heads, kv = SIZES[name]
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                             tie_word_embeddings=False, architectures=["LlamaForCausalLM"], dtype="bfloat16")
        with init_empty_weights():
            shapes = {key: tuple(t.shape) for key, t in LlamaForCausalLM._from_config(config).state_dict().items()}
        folder.mkdir(parents=True, exist_ok=True)
        generator = torch.Generator().manual_seed(0)
        shard_bytes, shards, shard, size, weight_map, total = 2 * 1024 ** 3, [], {}, 0, {}, 0

        def flush() -> None:
            nonlocal shard, size
            if shard:
                file = f"model-{len(shards) + 1:05d}.safetensors"
                save_file(shard, str(folder / file), metadata={"format": "pt"})
                shards.append(file)
                weight_map.update(dict.fromkeys(shard, file))
                shard, size = {}, 0

        for key, shape in shapes.items():
            if key.endswith("norm.weight"):
                tensor = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
            if size + tensor.numel() * 2 > shard_bytes:
                flush()
            shard[key] = tensor
            size += tensor.numel() * 2
            total += tensor.numel() * 2
        flush()
        count = len(shards)  # rename to save_pretrained's "-of-N" names now that N is known
        for index, file in enumerate(shards, 1):
            final = f"model-{index:05d}-of-{count:05d}.safetensors"
            (folder / file).rename(folder / final)
            weight_map = {key: final if value == file else value for key, value in weight_map.items()}
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        config.save_pretrained(folder)  # last: its config.json marks the folder complete
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return folder, ids, weights


_SAMPLE_S = 0.1


def _available() -> int:
    """Bytes of memory available now (MemAvailable), for the steps that must hold every weight."""
    with open("/proc/meminfo") as meminfo:
        return 1024 * int(next(line for line in meminfo if line.startswith("MemAvailable:")).split()[1])


def _vmhwm_bytes(pid: int) -> int:
    """A process's peak RSS so far (VmHWM), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return 1024 * int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return 0


def run_sampled(args: list[str], repo: Path = REPO) -> tuple[dict, list[dict]]:
    """:func:`run_step`, with the command's process and the worker processes it starts (the launcher spawns them:
    ``spawn_main`` in their command line) sampled every :data:`_SAMPLE_S`: per process, in the order they started,
    the most RSS (VmHWM), USS and PSS seen, in bytes."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen([sys.executable, "-c", "import json\n" + _STEP, *args], stdout=out,
                                   stderr=err, text=True, env=env, cwd=repo)
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
        out.seek(0)
        stdout = out.read()
    last = [line for line in stderr.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {"code": process.returncode, "wall_s": float("nan"), "peak_kib": 0}
    # the calibration job's own time (its summary: "... calibrated (max) on 2 batches in 61.20 s"), without the
    # imports, opening the project and saving it that the wall time holds (the plain forward's time holds none)
    job = re.search(r"calibrated \(\S+\) on \d+ batches in ([0-9.]+) s", stdout)
    result["job_s"] = float(job.group(1)) if job else float("nan")
    if result["code"] != 0:
        result["error"] = (stderr.strip().splitlines() or ["killed"])[-2 if last else -1][:200]
    main_peak = peaks.pop(process.pid, {"rss": 0, "uss": 0, "pss": 0})
    main_peak["rss"] = max(main_peak["rss"], result["peak_kib"] * 1024)  # its own last word on its peak
    return result, [dict(main_peak, role="command")] + [dict(peaks[pid], role=f"rank {rank}")
                                                       for rank, pid in enumerate(sorted(peaks))]


def run_step(args: list[str], repo: Path = REPO, breakdown: bool = False) -> dict:
    """One ``workbench`` command of the checkout ``repo`` in a fresh process: its exit code, wall time (of the
    command, and of the whole process with its imports) and peak RSS (KiB); with ``breakdown``, also the time of
    each part of an export (``parts``: label -> [seconds, calls], see :data:`_BREAKDOWN`)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    started = time.perf_counter()
    script = "import json\n" + (_BREAKDOWN if breakdown else "") + _STEP
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, cwd=repo)
    process = time.perf_counter() - started
    last = [line for line in done.stderr.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {"code": done.returncode, "wall_s": float("nan"), "peak_kib": 0}
    result["process_s"] = process
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
                        help="also: plain-export and plain-export-dynamic (torch.onnx.export of the float model, "
                             "static or dynamic batch and sequence), export-int8 and "
                             "export-int4w (set that precision and calibrate --sequential first, unmeasured; then "
                             "the export, measured against plain-export)")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq", "--tokens", dest="seq", type=int, default=128,
                        help="tokens per sample (--tokens 32 with --batches 1 --batch-size 1: the 7B row's small "
                             "calibration)")
    parser.add_argument("--no-forward", action="store_true",
                        help="skip the plain bf16 forward (it loads the whole model: a 7B one needs 14+ GiB)")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="the checkout whose workbench runs the steps (another one's: a before/after row)")
    parser.add_argument("--lazy-open", choices=("auto", "always", "never"), default="auto",
                        help="WORKBENCH_LAZY_OPEN for the workbench steps")
    parser.add_argument("--workers", type=int, default=2, help="processes of the calibrate-*workers steps")
    parser.add_argument("--ladder", help="the ladder of the ladder steps (default: int8,fp8,float for --precision "
                                         "int8, else PRECISION,int8,float)")
    args = parser.parse_args()
    os.environ["WORKBENCH_LAZY_OPEN"] = args.lazy_open
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    steps = args.steps.split(",")
    sampled: list[tuple[str, str, dict, list[dict]]] = []
    breakdowns: list[tuple[str, str, dict]] = []
    # "cpu s": the step's process's CPU time, imports included (one thread: what its wall time is on a quiet
    # machine; on the shared one the wall time is several times that)
    # "job / bf16 forward": a calibrate step's own job time (its summary's), without the imports, opening and saving
    print("| size | step | wall s | process s | cpu s | peak RSS GiB | peak / bf16 weights | time / bf16 forward | "
          "job / bf16 forward |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.sizes.split(","):
        folder, ids, weights = write_checkpoint(root, name, args.seq, args.batches * args.batch_size)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        gib = 1024 ** 3
        forward = {"wall_s": float("nan")}
        if not args.no_forward:
            forward = json.loads(subprocess.run([sys.executable, "-c", _FORWARD, str(folder), str(ids),
                                                 str(args.batch_size), str(args.batches)], capture_output=True,
                                                text=True, env=env, check=True).stdout.strip().splitlines()[-1])
            print(f"| {name} | plain bf16 forward ({args.batches} x {args.batch_size} x {args.seq}) | "
                  f"{forward['wall_s']:.1f} | | {forward['cpu_s']:.1f} (forwards only) | "
                  f"{forward['peak_kib'] * 1024 / gib:.2f} | "
                  f"{forward['peak_kib'] * 1024 / weights:.2f} | 1.00 | |", flush=True)
        project = root / f"llama-{name}.qwb"
        output = root / f"llama-{name}-{args.precision}.onnx"
        # a ladder of two rungs, PRECISION,float, would be the fallback search again
        ladder = args.ladder or ("int8,fp8,float" if args.precision == "int8" else f"{args.precision},int8,float")
        commands = {"new": ["new", project, "--model", f"hf:{folder}", "--data", ids, "--batch-size",
                            args.batch_size, "--num-batches", args.batches, "--output-key", "logits", "--force"],
                    "show": ["show", project],
                    "set": ["set", project, "--type", "Linear", "--precision", args.precision],
                    "calibrate": ["calibrate", project, "--method", "max"],
                    "calibrate-sequential": ["calibrate", project, "--method", "max", "--sequential"],
                    "calibrate-smoothquant": ["calibrate", project, "--method", "max", "--smoothquant", "0.5"],
                    "calibrate-smoothquant-sequential": ["calibrate", project, "--method", "max", "--smoothquant",
                                                         "0.5", "--sequential"],
                    "calibrate-awq": ["calibrate", project, "--method", "max", "--awq", "on"],
                    "calibrate-awq-sequential": ["calibrate", project, "--method", "max", "--awq", "on",
                                                 "--sequential"],
                    "calibrate-workers": ["calibrate", project, "--method", "max", "--workers", args.workers],
                    "calibrate-sequential-workers": ["calibrate", project, "--method", "max", "--sequential",
                                                     "--workers", args.workers],
                    "export": ["export", project, "-o", output, "--force"],
                    # the searches (issue 37 point 3), from the calibrated project, for the output SQNR 3 dB above
                    # the start: whole-model passes (a one-off ranking first), or one block at a time
                    "fallback": ["sensitivity", project, "--metric", "sqnr", "--tolerance", "3"],
                    "fallback-sequential": ["sensitivity", project, "--sequential", "--tolerance", "3"],
                    "ladder": ["sensitivity", project, "--metric", "sqnr", "--ladder", ladder, "--tolerance", "3",
                               "--revisit-pins"],
                    "ladder-sequential": ["sensitivity", project, "--sequential", "--ladder", ladder, "--tolerance",
                                          "3", "--revisit-pins"]}
        plain = plain_dynamic = None
        for step in steps:
            if step in ("plain-export", "plain-export-dynamic"):
                if weights > _available() / 2:  # from_pretrained holds the weights, the exporter more than as much
                    print(f"| {name} | plain torch.onnx.export (skipped: {weights / gib:.1f} GiB of bf16 weights, "
                          f"{_available() / gib:.1f} GiB available) | | | | | | | |", flush=True)
                    continue
                shapes = "dynamic" if step.endswith("dynamic") else "static"
                measured = json.loads(subprocess.run(
                    [sys.executable, "-c", _PLAIN_EXPORT, str(folder), str(ids), str(root / f"plain-{name}.onnx"),
                     shapes], capture_output=True, text=True, env=env, check=True).stdout.strip().splitlines()[-1])
                if shapes == "dynamic":
                    plain_dynamic = measured
                else:
                    plain = measured
                print(f"| {name} | plain torch.onnx.export (bf16, no Q/DQ, {shapes} shapes) | "
                      f"{measured['wall_s']:.1f} | | "
                      f"{measured['cpu_s']:.1f} | "
                      f"{measured['peak_kib'] * 1024 / gib:.2f} | {measured['peak_kib'] * 1024 / weights:.2f} | "
                      f"{measured['wall_s'] / forward['wall_s']:.2f} | |", flush=True)
                continue
            if step.startswith("export-"):
                precision = step.split("-", 1)[1]
                for prepare in (["set", project, "--type", "Linear", "--precision", precision],
                                ["calibrate", project, "--method", "max", "--sequential"]):
                    prepared = run_step([str(a) for a in prepare], args.repo)
                    if prepared["code"]:
                        print(f"| {name} | {step} (failed to {prepare[0]}: {prepared.get('error')}) | | | | | | | |")
                        break
                commands[step] = ["export", project, "-o", root / f"llama-{name}-{precision}.onnx", "--force"]
            started = time.perf_counter()
            if step.startswith("calibrate"):
                result, processes = run_sampled([str(a) for a in commands[step]], args.repo)
                result["process_s"] = time.perf_counter() - started
                sampled.append((name, step, result, processes))
            else:
                result = run_step([str(a) for a in commands[step]], args.repo, breakdown="export" in step)
                if result.get("parts"):
                    breakdowns.append((name, step, result))
            wall = result.get("wall_s") or time.perf_counter() - started
            peak = result["peak_kib"] * 1024
            if step.endswith("-workers"):  # its largest rank (the command itself only launches them)
                peak = max([process["rss"] for process in processes[1:]], default=peak)
            # a search that misses its goal exits 3 with its result saved: a measured row
            missed = result["code"] == 3 and step.startswith(("fallback", "ladder"))
            tail = " (goal not reached)" if missed else f" (failed: {result['error']})" if result["code"] else ""
            versus = ""
            if plain and "export" in step:  # wall over wall; CPU over CPU (the machine is shared: CPU holds better)
                versus = (f" ({wall / plain['wall_s']:.2f} of plain export; cpu "
                          f"{result.get('cpu_s', float('nan')) / plain['cpu_s']:.2f})")
            if plain_dynamic and "export" in step:
                versus += f" (cpu {result.get('cpu_s', float('nan')) / plain_dynamic['cpu_s']:.2f} of dynamic plain)"
            job = f"{result['job_s'] / forward['wall_s']:.2f} ({result['job_s']:.1f} s)" if "job_s" in result else ""
            print(f"| {name} | {step}{tail} | {wall:.1f} | {result['process_s']:.1f} | "
                  f"{result.get('cpu_s', float('nan')):.1f} | {peak / gib:.2f} | "
                  f"{peak / weights:.2f} | {wall / forward['wall_s']:.2f}{versus} | {job} |", flush=True)
    if sampled:
        print_processes(sampled)
    if breakdowns:
        print_breakdowns(breakdowns)


def print_breakdowns(breakdowns: list[tuple[str, str, dict]]) -> None:
    """Per export step, where its time went (inclusive: a part's children are in it too) and each part's share
    of the command's wall time."""
    print()
    print("| size | step | part | calls | wall s | cpu s | share of the command's cpu |")
    print("|---|---|---|---|---|---|---|")
    for name, step, result in breakdowns:
        cpu = result.get("cpu_s", float("nan"))
        for label, (spent, calls, used) in result["parts"].items():
            print(f"| {name} | {step} | {label} | {calls} | {spent:.1f} | {used:.1f} | {used / cpu:.0%} |")
        print(f"| {name} | {step} | the command (imports included) | 1 | {result['wall_s']:.1f} | {cpu:.1f} | "
              "100% |", flush=True)


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
