"""Issue 38, case 4 and its family: a weights file whose tensors are of another kind than the parameters.

``load_state_dict`` casts silently, so int32 weights truncated a float model to zeros (top-1 at chance,
"output SQNR inf"). The kind must match (float, int, bool, complex); another width of the same kind
(fp16 weights for an fp32 model) loads, exactly.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch
from cli_helpers import ROOT, write_model
from safetensors.torch import load_file, save_file

from workbench.sources.errors import SourceError
from workbench.sources.model_source import ModelSpec, load_model


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.bn = torch.nn.BatchNorm1d(2)


def weights(tmp_path, suffix, change):
    torch.manual_seed(0)
    state = Net().state_dict()
    state.update(change(state))
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path


MODEL = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.bn = torch.nn.BatchNorm1d(2)
    def forward(self, x):
        return self.bn(self.fc(x))
def make():
    return Net()
"""

WRONG = {
    "int32 weight": (lambda s: {"fc.weight": (s["fc.weight"] * 100).to(torch.int32)},
                     "fc.weight: file int32 vs model float32"),
    "bool bias": (lambda s: {"fc.bias": s["fc.bias"] > 0}, "fc.bias: file bool vs model float32"),
    "float counter": (lambda s: {"bn.num_batches_tracked": torch.tensor(3.0)},
                      "bn.num_batches_tracked: file float32 vs model int64"),
    "complex weight": (lambda s: {"fc.weight": s["fc.weight"].to(torch.complex64)},
                       "fc.weight: file complex64 vs model float32"),
}


@pytest.mark.parametrize("case, suffix", [(case, suffix) for case in WRONG for suffix in (".safetensors", ".pt")
                                          if (case, suffix) != ("complex weight", ".safetensors")])
def test_a_weight_of_another_kind_is_refused_naming_both(tmp_path, suffix, case):
    change, named = WRONG[case]
    (tmp_path / "m.py").write_text(MODEL)
    path = weights(tmp_path, suffix, change)
    with pytest.raises(SourceError) as caught:
        load_model(ModelSpec("entrypoint", f"{tmp_path / 'm.py'}:make", weights=str(path)), trust_code=True)
    assert str(path) in str(caught.value) and "dtype mismatches (1)" in str(caught.value)
    assert named in str(caught.value)


def test_half_weights_load_exactly_into_a_float_model(tmp_path):
    (tmp_path / "m.py").write_text(MODEL)
    path = weights(tmp_path, ".safetensors", lambda s: {"fc.weight": s["fc.weight"].half()})
    loaded = load_model(ModelSpec("entrypoint", f"{tmp_path / 'm.py'}:make", weights=str(path)), trust_code=True)
    assert loaded.model.fc.weight.dtype == torch.float32
    assert torch.equal(loaded.model.fc.weight, load_file(str(path))["fc.weight"].float())


@pytest.mark.slow
def test_the_demo_refuses_int_weights_in_its_resources(tmp_path):
    """The issue's own case: the demo's safetensors with fc.weight as int32 (a copy of the resources)."""
    shutil.copytree(ROOT / "resources" / "demo", tmp_path / "resources" / "demo")
    target = tmp_path / "resources" / "demo" / "digits_cnn.safetensors"
    state = load_file(str(target))
    state["fc.weight"] = state["fc.weight"].to(torch.int32)
    save_file(state, str(target))
    write_model(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "WORKBENCH_RESOURCES": str(tmp_path / "resources")}
    done = subprocess.run([sys.executable, "-m", "workbench", "new", "d.qwb", "--model", "demo:digits", "--data",
                           "demo:digits:train"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "internal error" not in done.stderr
    assert "fc.weight: file int32 vs model float32" in done.stderr
    assert not (tmp_path / "d.qwb").exists()
