"""Issue 38, case 6 on the command line: under torchrun, a rank that hangs while starting is named by rank 0,
as a job error (exit 2, "error:"), not an "internal error" blaming rank 0 with the store's keys."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from worker_code import write_worker_code

from workbench import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# the command, with rank 1 stuck before it joins the job (as if stopped while importing)
HANGS_WHILE_STARTING = textwrap.dedent("""
    import os, sys, time
    if os.environ.get("RANK") == "1":
        time.sleep(600)
    from workbench import cli
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_a_rank_hanging_while_starting_is_named_by_rank_0(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_worker_code(tmp_path, batches=4)
    project = tmp_path / "tiny.qwb"
    assert cli.main(["new", str(project), "--model", "net.py:make", "--data", "data.py:batches",
                     "--trust-code"]) == 0
    before = project.read_bytes()
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_WHILE_STARTING)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WORKBENCH_DIST_TIMEOUT="5")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), "calibrate", str(project), "--trust-code"], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert ("workbench: rank 0: error: rank 1 did not answer within 5 s: it never joined the 2-process job"
            in done.stderr), done.stderr
    assert "internal error" not in done.stderr and "DistStoreError" not in done.stderr
    assert project.read_bytes() == before
