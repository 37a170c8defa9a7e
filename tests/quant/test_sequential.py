"""Sequential calibration (issue 37 point 3): one block's weights resident at a time, the same amax and histograms
as the whole-model run, activations spilled to disk over a budget."""
import copy
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.quant import QuantDescriptor, TensorQuantizer, quantizer_state, replace_to_quantization_module
from workbench.quant.algorithms.activation_store import ActivationStore, SpillFolder
from workbench.quant.algorithms.calibrate import CalibrationCancelled, calibrate
from workbench.quant.algorithms.sequential import (
    BlockCalibrationError,
    SequentialUnsupported,
    calibrate_sequential,
    find_blocks,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models  # noqa: E402  (tests/transformers/models.py: the tiny HF builders)


def quantized(build, histogram=True):
    torch.manual_seed(0)
    model = build()
    descriptor = QuantDescriptor(calib_method="histogram") if histogram else QuantDescriptor()
    replace_to_quantization_module(model, quant_desc_input=descriptor)
    return model


def token_batches(n=3):
    return [{"input_ids": models.tokens(2, 8, 50, seed=i)} for i in range(n)]


def quantizers(model):
    return {name: q for name, q in model.named_modules() if isinstance(q, TensorQuantizer)}


def assert_same_calibration(whole, sequential):
    """Every quantizer's amax and (histogram calibrators) histogram counts and edges: bit for bit."""
    a, b = quantizers(whole), quantizers(sequential)
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name].amax is None) == (b[name].amax is None), name
        if a[name].amax is not None:
            assert torch.equal(a[name].amax, b[name].amax), name
        hist_a = getattr(a[name].calibrator, "calib_hist", None)
        if hist_a is not None:
            assert torch.equal(hist_a, b[name].calibrator.calib_hist), name
            assert torch.equal(a[name].calibrator.calib_bin_edges, b[name].calibrator.calib_bin_edges), name
    assert quantizer_state(whole) == quantizer_state(sequential)


@pytest.mark.parametrize("build,method,histogram", [(models.hf_llama, "entropy", True),
                                                     (models.hf_llama, "max", False),
                                                     (models.hf_gpt2, "mse", True),
                                                     (models.hf_gpt2, "percentile", True)])
def test_amax_and_histograms_equal_the_whole_model_run(build, method, histogram):
    model = quantized(build, histogram)
    whole, sequential = copy.deepcopy(model), copy.deepcopy(model)
    expected = calibrate(whole, token_batches(), num_batches=None, method=method)
    result = calibrate_sequential(sequential, token_batches(), num_batches=None, method=method)
    assert_same_calibration(whole, sequential)
    # the output SQNR: the same sums, pooled over the same batches, from one more walk over the blocks
    assert (result.output_sqnr_db, result.sqnr_batches) == (expected.output_sqnr_db, expected.sqnr_batches)
    assert result.sqnr_batches == 3 and 0 < result.output_sqnr_db < 80
    assert result.quantizers.keys() == expected.quantizers.keys()
    assert any(name.startswith("lm_head") for name in result.quantizers)  # the modules after the blocks too
    assert result.unused == expected.unused
    assert result.num_batches == 3


def test_a_decoder_run_with_its_cache_on_gives_the_same_amax_and_sqnr():
    """use_cache=True (the default of real checkpoints): every block gets the model's DynamicCache; the sequential
    walks must neither keep every block's keys for every batch nor attend to an earlier walk's keys."""
    model = quantized(models.hf_llama)
    model.config.use_cache = True
    whole, sequential = copy.deepcopy(model), copy.deepcopy(model)
    expected = calibrate(whole, token_batches(), num_batches=None, method="entropy")
    result = calibrate_sequential(sequential, token_batches(), num_batches=None, method="entropy")
    assert_same_calibration(whole, sequential)
    assert result.output_sqnr_db == expected.output_sqnr_db


def test_blocks_found_in_decoders_and_encoders():
    assert find_blocks(models.hf_llama()).name == "model.layers"
    assert find_blocks(models.hf_gpt2()).name == "transformer.h"
    assert find_blocks(models.hf_bert()).name == "encoder.layer"
    llama = find_blocks(models.hf_llama())
    assert [name for name, _ in llama.items] == ["model.layers.0", "model.layers.1"]
    assert {name for name, _ in llama.outside} == {"lm_head", "model.embed_tokens", "model.norm", "model.rotary_emb"}


class MetaResidency:
    """A lazily opened checkpoint in miniature: a released module's parameters go to the meta device (its real
    values kept aside, as a checkpoint on disk keeps them) and come back on load. Records what is resident."""

    def __init__(self, blocks):
        self.blocks = set(blocks)
        self.saved = {}
        self.resident = set()
        self.loads = []

    def release(self, name, module):
        kept = {}
        for sub_name, sub in module.named_modules():
            for key, parameter in list(sub.named_parameters(recurse=False)):
                kept[(sub_name, key)] = parameter.detach().clone()
                sub.register_parameter(key, nn.Parameter(parameter.detach().to("meta"), parameter.requires_grad))
        self.saved[name] = kept
        self.resident.discard(name)

    def load(self, name, module):
        if name in self.blocks:
            assert not self.resident & self.blocks, f"{name} loaded while {self.resident & self.blocks} resident"
        subs = dict(module.named_modules())
        for (sub_name, key), value in self.saved.pop(name).items():
            subs[sub_name].register_parameter(key, nn.Parameter(value, requires_grad=False))
        self.resident.add(name)
        self.loads.append(name)


def test_one_block_resident_at_a_time_gives_the_same_amax():
    model = quantized(models.hf_llama)
    whole, lazy = copy.deepcopy(model), copy.deepcopy(model)
    calibrate(whole, token_batches(), num_batches=None, method="entropy", report_sqnr=False)

    found = find_blocks(lazy)
    residency = MetaResidency(name for name, _ in found.items)
    for name, module in found.items + found.outside:  # opened lazily: nothing in memory yet
        residency.release(name, module)
    seen = []

    def only_this_block(block_name):
        def hook(module, args):
            if all(p.device.type == "meta" for p in module.parameters()):
                return  # the capture pass stopping at the first block, or the tail pass replaying outputs
            for other_name, other in found.items:
                on_meta = {p.device.type == "meta" for p in other.parameters()}
                assert on_meta == ({False} if other is module else {True}), (block_name, other_name)
            seen.append(block_name)
        return hook

    for name, block in found.items:
        block.register_forward_pre_hook(only_this_block(name))
    calibrate_sequential(lazy, token_batches(), num_batches=None, method="entropy", residency=residency)

    # each block ran each batch once to collect, once more quantized for the output SQNR
    assert seen == (["model.layers.0"] * 3 + ["model.layers.1"] * 3) * 2
    assert residency.loads[-2:] == ["model.layers.0", "model.layers.1"]
    assert residency.resident == set()  # everything released again
    residency.blocks = set()  # the test itself loads them all back to compare
    for name, module in found.items + found.outside:
        residency.load(name, module)
    assert_same_calibration(whole, lazy)


def test_activations_spilled_under_a_tiny_budget_give_the_same_amax_and_leave_no_files(tmp_path, monkeypatch):
    model = quantized(models.hf_gpt2)
    whole, spilled = copy.deepcopy(model), copy.deepcopy(model)
    calibrate(whole, token_batches(), num_batches=None, method="entropy", report_sqnr=False)
    saves = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda value, path, **kw: (saves.append(Path(path)), real_save(value, path)))
    folder = tmp_path / "spill"
    calibrate_sequential(spilled, token_batches(), num_batches=None, method="entropy", budget_bytes=0,
                         spill_dir=folder)
    assert len(saves) >= 3 * 4  # each batch's context and hidden states, at every block boundary
    assert all(folder in path.parents for path in saves)
    assert list(folder.iterdir()) == []  # the temporary folder is gone
    assert_same_calibration(whole, spilled)


def test_a_failing_block_is_named_and_the_model_left_as_it_was():
    model = quantized(models.hf_llama)
    before = copy.deepcopy(model)

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch in the MLP")

    model.model.layers[1].mlp.forward = broken
    with pytest.raises(BlockCalibrationError, match=r"Block model\.layers\.1 failed on calibration batch 0.*"
                                                    "shape mismatch") as failure:
        calibrate_sequential(model, token_batches(), num_batches=None, method="entropy")
    assert failure.value.block == "model.layers.1"
    assert quantizer_state(model) == quantizer_state(before)
    for name, q in quantizers(model).items():
        assert q.amax is None, name
        assert getattr(q.calibrator, "calib_hist", None) is None, name


def test_cancel_leaves_the_model_unchanged():
    model = quantized(models.hf_llama)
    before = quantizer_state(model)
    cancel = threading.Event()

    def progress(done, total, message):
        if "model.layers.0" in message and "calibrated block" in message:
            cancel.set()

    with pytest.raises(CalibrationCancelled, match="model.layers.1"):
        calibrate_sequential(model, token_batches(), num_batches=None, method="max", progress=progress,
                             cancel=cancel)
    assert quantizer_state(model) == before
    assert all(q.amax is None for q in quantizers(model).values())


def test_progress_names_each_block():
    model = quantized(models.hf_llama)
    messages = []
    calibrate_sequential(model, token_batches(), num_batches=2, method="max",
                         progress=lambda done, total, message: messages.append((done, total, message)))
    assert messages == [(1, 7, "captured the inputs of model.layers.0 for 2 batches"),
                        (2, 7, "calibrated block model.layers.0 (1 of 2)"),
                        (3, 7, "calibrated block model.layers.1 (2 of 2)"),
                        (4, 7, "calibrated the modules after the blocks"),
                        (5, 7, "output SQNR: quantized block model.layers.0 (1 of 2)"),
                        (6, 7, "output SQNR: quantized block model.layers.1 (2 of 2)"),
                        (7, 7, "measured the output SQNR on 2 batches")]
    messages.clear()
    calibrate_sequential(quantized(models.hf_llama), token_batches(), num_batches=2, method="max", report_sqnr=False,
                         progress=lambda done, total, message: messages.append((done, total, message)))
    assert [done for done, _, _ in messages] == [1, 2, 3, 4] and messages[-1][1] == 4


def test_a_model_without_blocks_is_calibrated_whole_and_says_so():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    whole = copy.deepcopy(model)
    data = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    calibrate(whole, data, num_batches=None, method="entropy", report_sqnr=False)
    result = calibrate_sequential(model, data, num_batches=None, method="entropy")
    assert "Sequential has no nn.ModuleList of identical blocks" in result.warnings[0]
    assert "the whole model was calibrated at once" in result.warnings[0]
    assert_same_calibration(whole, model)


def test_auto_picks_the_same_methods_as_the_whole_model_run():
    model = quantized(models.hf_llama)
    whole, sequential = copy.deepcopy(model), copy.deepcopy(model)
    data = [{"input_ids": models.tokens(4, 16, 50, seed=i)} for i in range(6)]  # enough values for every search
    expected = calibrate(whole, data, num_batches=None, method="auto", report_sqnr=False)
    result = calibrate_sequential(sequential, data, num_batches=None, method="auto")
    assert_same_calibration(whole, sequential)
    picked = {name: (item.method, item.choice.owner, item.choice.sqnr_db, item.choice.batches)
              for name, item in result.quantizers.items() if item.choice is not None}
    assert picked == {name: (item.method, item.choice.owner, item.choice.sqnr_db, item.choice.batches)
                      for name, item in expected.quantizers.items() if item.choice is not None}
    assert "lm_head._input_quantizer" in picked and "model.layers.1.mlp.down_proj._input_quantizer" in picked
    assert picked["model.layers.1.mlp.down_proj._input_quantizer"][1] == "model.layers.1.mlp.down_proj"


def test_activation_store_keeps_within_budget_and_spills_beyond(tmp_path):
    spill = SpillFolder(budget_bytes=64, parent=tmp_path)
    store = ActivationStore(spill)
    small, large = torch.ones(4), torch.arange(100, dtype=torch.float32)
    store.put(0, small)  # 16 bytes: in memory
    store.put(1, large)  # 400 bytes: on disk
    assert (spill.in_memory, store.spilled) == (16, 1)
    assert torch.equal(store.get(0), small) and torch.equal(store.get(1), large)
    store.drop(0)
    assert spill.in_memory == 0
    folder = spill.folder
    assert folder is not None and len(list(folder.iterdir())) == 1
    store.close()
    spill.close()
    assert not folder.exists()
    with pytest.raises(KeyError, match="batch 1"):
        store.get(1)


class SharedProjection(nn.Module):
    """A projection used both before and after the blocks (weights shared, as a tied embedding can be)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4)) for _ in range(3))

    def forward(self, x):
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.proj(x)


def test_a_quantizer_used_before_and_after_the_blocks_is_refused_by_name():
    torch.manual_seed(0)
    model = SharedProjection()
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    before = quantizer_state(model)
    data = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    with pytest.raises(SequentialUnsupported, match=r"proj\._input_quantizer runs both before and after blocks"):
        calibrate_sequential(model, data, num_batches=None, method="max")
    assert quantizer_state(model) == before
    assert all(q.amax is None for q in quantizers(model).values())


def test_a_block_that_is_not_called_on_a_tensor_is_refused():
    class NoTensor(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Wrapped() for _ in range(2))

        def forward(self, x):
            state = {"x": x}
            for block in self.blocks:
                state = block(state)
            return state["x"]

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, state):
            return {"x": self.fc(state["x"])}

    model = NoTensor()
    replace_to_quantization_module(model)
    with pytest.raises(SequentialUnsupported, match=r"blocks\.0 is called without a tensor"):
        calibrate_sequential(model, [torch.randn(2, 4)], num_batches=None, method="max")
    assert all(q.amax is None for q in quantizers(model).values())
