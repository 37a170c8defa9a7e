"""Round 2, items 8 and 9: ranks compare a digest of their data, settings and model before they merge, and
refuse to merge different data (it merged silently: 11 of 21 amax differed from one process); a rank that
does not answer is the one named, on a multi-node layout too."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from worker_code import write_worker_code

from workbench import cli
from workbench.quant.algorithms.distributed import DistContext, RanksDisagree

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


class Gathered(DistContext):
    """A rank whose all_gather returns what the test says the ranks hold."""

    def __init__(self, values):
        super().__init__(rank=0, world_size=len(values))
        self.values = values

    def all_gather(self, value):
        return [value] + self.values[1:]


def test_check_same_groups_the_ranks_by_what_they_hold():
    context = Gathered([{"data": "a" * 40, "settings": "s"}, {"data": "b" * 40, "settings": "s"},
                        {"data": "a" * 40, "settings": "s"}])
    with pytest.raises(RanksDisagree) as caught:
        context.check_same({"data": "a" * 40, "settings": "s"}, "calibration")
    assert caught.value.part == "data" and caught.value.groups == [[0, 2], [1]]
    assert str(caught.value).startswith("The ranks of this calibration do not have the same data (ranks 0, 2: "
                                        "aaaaaaaaaaaa; rank 1: bbbbbbbbbbbb); nothing was merged")
    Gathered([{"data": "a"}, {"data": "a"}]).check_same({"data": "a"}, "calibration")  # the same: no error


def env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WORKBENCH_DIST_TIMEOUT": "60", **extra}


@pytest.fixture
def project(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_worker_code(tmp_path, batches=4)
    # as if each node had its own copy of the data file, and node 1's differs: rank 1 reads other values
    data = (tmp_path / "data.py").read_text().replace("manual_seed(5)",
                                                     "manual_seed(5 + (os.environ.get('RANK') == '1'))")
    (tmp_path / "data.py").write_text(data)
    path = tmp_path / "tiny.qwb"
    code = cli.main([str(a) for a in ("new", path, "--model", "net.py:make", "--data", "data.py:batches",
                                      "--trust-code")])
    assert code == 0, capsys.readouterr().err
    return path


@pytest.mark.parametrize("command", [["calibrate"], ["sensitivity", "--metric", "mse"]])
def test_ranks_with_different_data_refuse_to_merge(project, tmp_path, command):
    if command[0] == "sensitivity":  # a calibrated project first (in one process: the same data everywhere)
        assert cli.main(["calibrate", str(project), "--trust-code"]) == 0
    before = project.read_bytes()
    done = subprocess.run([sys.executable, "-m", "workbench", *command, str(project), "--workers", "2",
                           "--trust-code"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env())
    assert done.returncode != 0, done.stdout
    assert "do not have the same" in done.stderr and "data (rank 0: " in done.stderr \
        and "; rank 1: " in done.stderr, done.stderr
    assert "nothing was merged" in done.stderr and "Traceback" not in done.stderr
    assert project.read_bytes() == before


HANG = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, os.environ["JOBS"])
    from workbench.quant.algorithms.distributed import init_from_env

    context = init_from_env()
    if context.rank == 1:
        time.sleep(60)  # alive but stuck: only the others' timeout ends the job (bounded: never left behind)
    try:
        context.all_gather(context.rank)
    except Exception as error:
        print(f"rank {context.rank}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
""")


def test_a_hung_rank_is_named_on_a_multi_node_layout(tmp_path):
    """Two torchrun 'nodes' of one process each (as on two machines): node 0's rank names rank 1."""
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # node 1's output is not read: its stuck worker (in a session of its own under torchrun) would hold a pipe
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                               f"127.0.0.1:{port}", "--rdzv-id", "hang", "--max-restarts", "0", str(script)],
                              env=env(WORKBENCH_DIST_TIMEOUT="5", JOBS=str(Path(__file__).parent)), cwd=tmp_path,
                              stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                              stderr=subprocess.PIPE if i == 0 else subprocess.DEVNULL, text=True,
                              start_new_session=True)
             for i in range(2)]
    try:  # node 0's rank gives up after the timeout; node 1's stays stuck until it is stopped
        _, errors = nodes[0].communicate(timeout=240)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, 9)
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
    assert "RankNotAnswering: rank 1 did not answer within 5 s: it never reached gathering results" in errors, errors
    assert "rank 0: RankNotAnswering" in errors
