"""Round 2, item 7: Ctrl-C exits 130 with one line, in one process and under --workers 2 (it printed a
31-line traceback and exited 1, the internal-error code). The terminal sends SIGINT to the whole process
group; the test does the same to a command started in a session of its own."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from cli_helpers import ROOT, as_in_a_terminal, run, write_data

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length

SLOW = textwrap.dedent("""
    import os, time
    import torch
    from torch import nn

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(108, 2)

        def forward(self, x):
            if "WB_STARTED" in os.environ:  # the job is under way: interrupt it now
                open(os.environ["WB_STARTED"], "a").close()
                time.sleep(0.2)
            return self.fc(x.flatten(1))

    def make():
        torch.manual_seed(0)
        return Slow()
""")


@pytest.fixture
def slow_project(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "slow.py").write_text(SLOW)
    data = write_data(tmp_path, samples=400)
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{tmp_path}/slow.py:make", "--data", data,
                       "--batch-size", "1", "--trust-code")
    assert code == 0, err
    return project


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_exits_130_with_one_line(slow_project, tmp_path, workers):
    started = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WB_STARTED": str(started)}
    before = slow_project.read_bytes()
    process = subprocess.Popen([sys.executable, "-m", "workbench", "calibrate", slow_project, "--workers",
                                str(workers), "--num-batches", "400"], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               preexec_fn=as_in_a_terminal)
    try:
        deadline = time.monotonic() + 240
        while not started.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    lines = err.strip().splitlines()
    assert process.returncode == 130, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("workbench: ") and ("interrupted" in lines[0] or "cancelled" in lines[0]), err
    assert out == ""
    assert slow_project.read_bytes() == before


def test_a_job_started_with_ctrl_c_ignored_keeps_ignoring_it(monkeypatch):
    """A command started as a script's background job (SIGINT ignored, which exec keeps) does not take Ctrl-C
    back for its job: its parent asked for it to run on; a foreground command's Ctrl-C still cancels."""
    import argparse

    from workbench.cli.common import Progress

    args = argparse.Namespace(json=True)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Progress(args, "calibrating"):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with Progress(args, "calibrating") as progress:
            assert signal.getsignal(signal.SIGINT) == progress._interrupt
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs in this thread between bytecodes
            assert progress.cancel.is_set()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
