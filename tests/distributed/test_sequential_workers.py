"""Sequential calibration split over ranks (issue 37 point 5): each rank walks the blocks on its share of the batches
with one block's weights resident, the ranks merge each block's statistics, and the result is one process's.

First with ranks as threads (the arithmetic, against one process, several methods), then as the user runs it:
``workbench calibrate --workers 2 --sequential`` on a tiny LLaMA checkpoint opened lazily from safetensors, with a
counting hook in every worker process recording how many weight bytes it ever held.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from test_merge import run_ranks
from torch import nn

from workbench import cli
from workbench.quant import QuantDescriptor, TensorQuantizer, replace_to_quantization_module
from workbench.quant.algorithms.calibrate import CalibrationError
from workbench.quant.algorithms.sequential import calibrate_sequential, find_blocks

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "transformers"))
import models  # noqa: E402  (tests/transformers/models.py: the tiny HF builders)


def quantized_llama(histogram: bool) -> nn.Module:
    torch.manual_seed(0)
    model = models.hf_llama()
    descriptor = QuantDescriptor(calib_method="histogram") if histogram else QuantDescriptor()
    replace_to_quantization_module(model, quant_desc_input=descriptor)
    return model


def token_batches(n: int = 3) -> list[dict]:
    batches = [{"input_ids": models.tokens(8, 32, 50, seed=i)} for i in range(n)]  # histograms thick enough
    batches[-1]["input_ids"] = batches[-1]["input_ids"] % 7  # another range: the ranks' histograms differ in width
    return batches


def quantizer_state(model: nn.Module) -> dict:
    """Every quantizer's amax and (histograms) counts and edges."""
    state = {}
    for name, q in model.named_modules():
        if isinstance(q, TensorQuantizer):
            hist = getattr(q.calibrator, "calib_hist", None)
            state[name] = (None if q.amax is None else q.amax.clone(),
                           None if hist is None else (hist.clone(), q.calibrator.calib_bin_edges.clone()))
    return state


def assert_same(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for name, (amax, hist) in expected.items():
        assert (amax is None) == (got[name][0] is None), name
        if amax is not None:
            assert torch.equal(amax, got[name][0]), name
        if hist is not None:
            assert torch.equal(hist[0], got[name][1][0]) and torch.equal(hist[1], got[name][1][1]), name


class CountingResidency:
    """A lazily opened checkpoint in miniature that counts: a released module's parameters go to meta (their values
    kept aside, as the file keeps them), and the most parameter bytes ever in memory at once are recorded."""

    def __init__(self, model: nn.Module) -> None:
        self.saved: dict[str, dict] = {}
        self.loaded_blocks: list[str] = []
        self.most = 0
        found = find_blocks(model)
        for name, module in found.items + found.outside:
            self.release(name, module)
        self.model = model

    def resident_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if not p.is_meta)

    def release(self, name: str, module: nn.Module) -> None:
        kept = {}
        for sub_name, sub in module.named_modules():
            for key, parameter in list(sub.named_parameters(recurse=False)):
                kept[(sub_name, key)] = parameter.detach().clone()
                sub.register_parameter(key, nn.Parameter(parameter.detach().to("meta"), False))
        self.saved[name] = kept

    def load(self, name: str, module: nn.Module) -> None:
        subs = dict(module.named_modules())
        for (sub_name, key), value in self.saved.pop(name).items():
            subs[sub_name].register_parameter(key, nn.Parameter(value, requires_grad=False))
        self.loaded_blocks.append(name)
        self.most = max(self.most, self.resident_bytes())


def share_bytes(model: nn.Module) -> tuple[int, int]:
    """A rank's share (the modules outside the blocks and the largest block) and the whole model, in bytes."""
    found = find_blocks(model)

    def size(module: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    return sum(size(m) for _, m in found.outside) + max(size(m) for _, m in found.items), whole


@pytest.mark.parametrize("method,histogram", [("entropy", True), ("max", False), ("percentile", True),
                                              ("auto", True)])
def test_two_thread_ranks_give_one_process_amax_holding_one_block_each(method, histogram):
    model = quantized_llama(histogram)
    one = copy.deepcopy(model)
    expected = calibrate_sequential(one, token_batches(), num_batches=None, method=method)
    expected_state = quantizer_state(one)
    share, whole = share_bytes(model)
    assert share < whole

    def job(context):
        mine = copy.deepcopy(model)
        residency = CountingResidency(mine)
        result = calibrate_sequential(mine, token_batches(), num_batches=None, method=method, residency=residency,
                                      context=context)
        most, blocks = residency.most, list(residency.loaded_blocks)
        return result, quantizer_state(mine), most, blocks

    for result, state, most, blocks in run_ranks(2, job):
        assert_same(expected_state, state)
        assert result.num_batches == expected.num_batches == 3
        assert {n: q.method for n, q in result.quantizers.items()} == \
            {n: q.method for n, q in expected.quantizers.items()}
        assert result.unused == expected.unused
        # signal and noise summed per rank then over the ranks: the same sums, up to the order of additions
        assert result.sqnr_batches == 3 and result.output_sqnr_db == pytest.approx(expected.output_sqnr_db, abs=1e-6)
        assert 0 < most <= share  # never more than the outside modules and one block
        assert [n for n in blocks if n.startswith("model.layers.")][:2] == ["model.layers.0", "model.layers.1"]


def test_a_rank_without_a_batch_still_merges_and_a_failing_batch_is_named_globally():
    model = quantized_llama(histogram=True)
    one = copy.deepcopy(model)
    calibrate_sequential(one, token_batches(1), num_batches=None, method="entropy", report_sqnr=False)

    def job(context):  # rank 1 gets no batch at all: it contributes nothing, and still takes part in every merge
        mine = copy.deepcopy(model)
        return calibrate_sequential(mine, token_batches(1), num_batches=None, method="entropy", report_sqnr=False,
                                    context=context), quantizer_state(mine)

    for result, state in run_ranks(2, job):
        assert result.num_batches == 1
        assert_same(quantizer_state(one), state)

    batches = token_batches(3)
    batches[1] = {"input_ids": torch.full((8, 32), 10_000)}  # out of the vocabulary: rank 1's first batch fails

    def failing(context):
        return calibrate_sequential(copy.deepcopy(model), batches, num_batches=None, method="max", context=context)

    with pytest.raises(CalibrationError, match="batch 1") as caught:
        run_ranks(2, failing)
    assert caught.value.batch_index == 1


# ----- as the user runs it: worker processes on a checkpoint opened lazily -----------------------------------------

# Imported by every Python process that finds it on PYTHONPATH (the worker processes too): counts the weight bytes
# the lazily opened checkpoint holds, and writes the most it ever held to RESIDENCY_DIR/rank-N.json.
COUNTING_HOOK = """
import json, os
from pathlib import Path

folder = os.environ.get("RESIDENCY_DIR")
if folder:  # the launcher sets RANK in a worker once it runs, after this import
    from workbench.sources import lazy_checkpoint

    held = {"now": 0, "most": 0, "blocks": []}
    load, release = lazy_checkpoint.LazyCheckpoint._load, lazy_checkpoint.LazyCheckpoint._release

    def write():
        if os.environ.get("RANK") is not None:
            Path(folder, f"rank-{os.environ['RANK']}.json").write_text(json.dumps(held))

    def counted_load(self, parameters):
        held["now"] += sum(p.numel() * p.element_size() for p in parameters if p.is_meta)
        held["most"] = max(held["most"], held["now"])
        load(self, parameters)
        write()

    def counted_release(self, parameters):
        held["now"] -= sum(p.numel() * p.element_size() for p in parameters if not p.is_meta)
        release(self, parameters)
        write()

    def counted_block(original):
        def wrapped(self, name, module):
            if name.startswith("model.layers."):
                held["blocks"].append(name)
            return original(self, name, module)
        return wrapped

    lazy_checkpoint.LazyCheckpoint._load = counted_load
    lazy_checkpoint.LazyCheckpoint._release = counted_release
    lazy_checkpoint.LazyCheckpoint.load = counted_block(lazy_checkpoint.LazyCheckpoint.load)
"""


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def lazy_project(tmp_path, capsys, monkeypatch):
    """A tiny bf16 LLaMA saved as safetensors, opened lazily through ``hf:`` (as the lazy-open tests do)."""
    pytest.importorskip("accelerate")
    from workbench.sources import model_source

    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    folder = tmp_path / "llama"
    model = models.hf_llama().to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (4, 8)).astype(np.int64))
    project = tmp_path / "p.qwb"
    code, _, err = run_cli(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                           "--batch-size", "2", "--output-key", "logits", "--force")
    assert code == 0, err
    assert run_cli(capsys, "set", project, "--type", "Linear", "--input-desc", "calib_method=histogram")[0] == 0
    return project, share_bytes(model)


@pytest.mark.slow
@pytest.mark.parametrize("sequential", [True, False], ids=["sequential", "whole-model-mapped"])
def test_two_workers_equal_one_process_and_hold_their_share(lazy_project, capsys, tmp_path, sequential):
    """``calibrate --workers 2`` on a lazily opened checkpoint: with ``--sequential`` each rank holds the modules
    outside the blocks and one block at most; without, each maps the checkpoint (the whole model, shared)."""
    project, (share, whole) = lazy_project
    single = project.with_name("single.qwb")
    single.write_bytes(project.read_bytes())
    flags = ["--sequential"] if sequential else []
    code, out, err = run_cli(capsys, "calibrate", single, *flags, "--method", "entropy", "--json")
    assert code == 0, err
    expected = json.loads(out)

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(COUNTING_HOOK))
    counts = tmp_path / "counts"
    counts.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", WORKBENCH_DIST_TIMEOUT="60", RESIDENCY_DIR=str(counts))
    done = subprocess.run([sys.executable, "-m", "workbench", "calibrate", str(project), "--workers", "2", *flags,
                           "--method", "entropy", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["world_size"] == 2 and result["batches"] == expected["batches"] == 2
    assert result["quantizers"].keys() == expected["quantizers"].keys() and expected["quantizers"]
    for name, item in expected["quantizers"].items():
        assert result["quantizers"][name]["amax"] == item["amax"], name
        assert result["quantizers"][name]["samples"] == item["samples"], name

    for rank in (0, 1):
        held = json.loads((counts / f"rank-{rank}.json").read_text())
        if sequential:
            assert held["blocks"][:2] == ["model.layers.0", "model.layers.1"]  # each rank walked every block
            assert 0 < held["most"] <= share < whole, (rank, held, share, whole)  # never the whole model
        else:  # the whole model, as views of the file mapped once for both ranks (see the test below)
            assert held["most"] == whole


# ----- without --sequential: the weights mapped once for all the ranks of a machine ---------------------------------

def _mapped_regions(path: Path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``path`` (Linux's /proc/self/maps)."""
    regions = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            regions.append((low, high))
    return regions


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings from /proc")
def test_a_rank_materialises_views_of_the_mapped_checkpoint_with_the_eager_weights(tmp_path, monkeypatch):
    """A rank of a multi-process job that needs the whole model (calibrate --workers N without --sequential) maps the
    checkpoint instead of copying it: its weights are views of the file mapped copy-on-write, which the ranks of one
    machine share in the page cache; the values are the eager load's, and a write stays in the process."""
    pytest.importorskip("accelerate")
    from workbench.sources import model_source
    from workbench.sources.model_source import ModelSpec, load_model

    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    torch.manual_seed(0)
    folder = tmp_path / "llama"
    models.hf_llama().to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    file = (folder / "model.safetensors").resolve()
    before = file.read_bytes()
    spec = ModelSpec("hf", str(folder))
    reference = dict(load_model(spec).model.named_parameters())  # every weight read into memory

    single = load_model(spec, lazy=True)
    single.materialise()  # one process: read into its own memory, as before
    assert not _mapped_regions(file)

    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun and --workers set it in each rank
    loaded = load_model(spec, lazy=True)
    loaded.materialise()
    regions = _mapped_regions(file)
    assert regions
    parameters = dict(loaded.model.named_parameters())
    assert parameters.keys() == reference.keys()
    for name, parameter in parameters.items():
        assert not parameter.is_meta and parameter.dtype == torch.bfloat16
        assert torch.equal(parameter.view(torch.int16), reference[name].view(torch.int16)), name
        assert any(low <= parameter.data_ptr() < high for low, high in regions), name  # in the mapping, not a copy
    with torch.no_grad():
        parameters["model.layers.0.mlp.up_proj.weight"].mul_(2)  # copy-on-write: the file is unchanged
    assert file.read_bytes() == before
