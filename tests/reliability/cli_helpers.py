"""Shared by the CLI reliability tests: a tiny user model, data files, and running the CLI in-process
or as a real process that can be held just before it saves."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from workbench import cli

ROOT = Path(__file__).resolve().parents[2]

MODEL_CODE = textwrap.dedent("""
    import sys
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

    def make():
        torch.manual_seed(0)
        return Net()

    def chatty():
        print("hello from the factory")
        return make()

    def exits():
        sys.exit(0)

    def exits_with_text():
        sys.exit("bye")

    class Quitter(nn.Module):
        def __init__(self):
            super().__init__()
            sys.exit(4)
""")


def write_model(folder: Path) -> Path:
    path = folder / "net.py"
    path.write_text(MODEL_CODE)
    return path


def write_data(folder: Path, name: str = "x.npy", fill: float | None = None, channels: int = 3,
               samples: int = 8) -> Path:
    data = np.random.default_rng(0).standard_normal((samples, channels, 6, 6)).astype(np.float32)
    if fill is not None:
        data[:] = fill
    path = folder / name
    np.save(path, data)
    return path


def run(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def new_project(tmp_path: Path, capsys, *extra) -> Path:
    model = write_model(tmp_path)
    data = write_data(tmp_path)
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{model}:make", "--data", data, "--batch-size", "4",
                       "--trust-code", *extra)
    assert code == 0, err
    return project


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


# A CLI process that stops just before its save until a "go" file appears: two processes then
# interleave the same way on every run (both loaded, one saves, then the other).
HELD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import workbench.session.core as core

    real = core.save_project

    def held(project, path, **kwargs):
        Path(os.environ["WB_READY"]).touch()
        while not Path(os.environ["WB_GO"]).exists():
            time.sleep(0.02)
        return real(project, path, **kwargs)

    core.save_project = held
    from workbench import cli
    sys.exit(cli.main(sys.argv[1:]))
""")


def as_in_a_terminal() -> None:
    """For ``Popen(preexec_fn=)``: Ctrl-C's default action in the child, as a terminal's foreground command has
    it. A test run started as a script's background job (``pytest ... &``) ignores SIGINT, exec keeps an ignored
    signal ignored, and a command started so leaves it ignored (``workbench.cli.common.Progress``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_held(folder: Path, tag: str, *args) -> tuple[subprocess.Popen, Path, Path]:
    """Start ``workbench ARGS`` in a process held before its save; (process, ready file, go file)."""
    ready, go = folder / f"{tag}.ready", folder / f"{tag}.go"
    env = {**os.environ, "WB_READY": str(ready), "WB_GO": str(go), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-c", HELD, *map(str, args)], cwd=folder, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, ready, go


def wait_ready(process: subprocess.Popen, ready: Path, timeout: float = 300) -> None:
    """Wait until the held process reached its save (or fail with its output if it ended first)."""
    import time

    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the process ended before its save (exit {process.returncode}): {err}{out}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the process did not reach its save")
        time.sleep(0.05)


def run_process(folder: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
