"""Issue 38, case 5: Ctrl-C under ``--workers`` after rank 0 saved must not say "the project was not changed".

The model's module (trusted test code, run in every worker) wraps the session's save so that rank 0 marks
the moment its save is done and then lingers; the test sends Ctrl-C to the whole process group right then.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from cli_helpers import ROOT, as_in_a_terminal, run, write_data

from workbench.project.store import file_revision

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length

LINGERS = textwrap.dedent("""
    import os, time
    import torch
    from torch import nn

    if "WB_SAVED" in os.environ:
        import workbench.session.core as core
        real = core.save_project

        def save_then_linger(project, path, **kwargs):
            report = real(project, path, **kwargs)
            open(os.environ["WB_SAVED"], "a").close()
            time.sleep(30)  # the interrupt comes now: after the save, before the job ends
            return report

        core.save_project = save_then_linger

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(108, 2)

        def forward(self, x):
            return self.fc(x.flatten(1))

    def make():
        torch.manual_seed(0)
        return Net()
""")


def test_ctrl_c_after_the_save_says_the_result_was_saved(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "lingers.py").write_text(LINGERS)
    data = write_data(tmp_path, samples=8)
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{tmp_path}/lingers.py:make", "--data", data,
                       "--batch-size", "2", "--trust-code")
    assert code == 0, err
    before = file_revision(project)
    saved = tmp_path / "saved"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WB_SAVED": str(saved)}
    process = subprocess.Popen([sys.executable, "-m", "workbench", "calibrate", project, "--workers", "2",
                                "--method", "max"], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               preexec_fn=as_in_a_terminal)
    try:
        deadline = time.monotonic() + 240
        while not saved.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the job never saved"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err
    assert file_revision(project) == before + 1  # the save landed
    assert "not changed" not in err, err
    assert "its result was saved" in err and f"revision {before + 1}" in err, err
