"""Issue 38, case 3: ``export --force`` replaces a user's old export, never the project's own inputs.

The demo project reads its weights and data from the resources folder; here that folder is a copy
(WORKBENCH_RESOURCES), so a regression would break the copy and not the checkout.
"""
import hashlib
import os
import shutil
import subprocess
import sys

import pytest
from cli_helpers import ROOT

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length


def workbench(folder, env, *args):
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    resources = folder / "resources"
    shutil.copytree(ROOT / "resources" / "demo", resources / "demo")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WORKBENCH_RESOURCES": str(resources)}
    for args in (("new", "d.qwb", "--model", "demo:digits", "--data", "demo:digits:train", "--eval-data",
                  "demo:digits:test"), ("calibrate", "d.qwb", "--method", "max", "--num-batches", "1")):
        done = workbench(folder, env, *args)
        assert done.returncode == 0, done.stderr
    return folder, env, resources / "demo"


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name, what", [("digits_cnn.safetensors", "one of the model's files"),
                                        ("digits.npz", "data (the built-in digits)")])
def test_force_never_replaces_the_demo_inputs(demo, name, what):
    folder, env, inputs = demo
    target = inputs / name
    before = digest(target)
    done = workbench(folder, env, "export", "d.qwb", "-o", target, "--force")
    assert done.returncode == 2, done.stdout + done.stderr
    assert what in done.stderr and "not even with --force" in done.stderr
    assert digest(target) == before
    assert sorted(p.name for p in inputs.iterdir()) == ["digits.npz", "digits_cnn.safetensors"]  # no side file
    assert workbench(folder, env, "show", "d.qwb").returncode == 0  # the project still opens
