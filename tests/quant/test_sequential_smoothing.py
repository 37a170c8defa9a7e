"""SmoothQuant and AWQ planned one block at a time (issue 37 point 3): the same records as the whole-model plan,
bit for bit, with one block's weights resident; and the smoothed weights of a model whose weights are on meta
computed from the float weights each time their block is loaded."""
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.quant.algorithms.block_walk import find_blocks
from workbench.quant.algorithms.calibration_results import CalibrationCancelled
from workbench.quant.algorithms.residency import AllResident, WithDerivedWeights
from workbench.quant.algorithms.sequential_smoothing import plan_smoothing_sequential
from workbench.quant.algorithms.smoothing import SmoothingError, apply_smoothing, is_linear_like, plan_smoothing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models  # noqa: E402  (tests/transformers/models.py: the tiny HF builders)


def token_batches(n=3):
    return [{"input_ids": models.tokens(2, 8, 50, seed=i)} for i in range(n)]


def linear_names(model):
    return [name for name, module in model.named_modules() if is_linear_like(module)]


def by_layer(items):
    return {item.layer: item for item in items}


@pytest.mark.parametrize("build", [models.hf_llama, models.hf_gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("method", ["smoothquant", "awq"])
def test_records_equal_the_whole_model_plan(build, method):
    torch.manual_seed(0)
    model = build()
    options = {"method": method, "alpha": 0.5, "block_size": 16}
    whole = by_layer(plan_smoothing(model, linear_names(model), token_batches(), **options))
    walked = by_layer(plan_smoothing_sequential(model, linear_names(model), token_batches(), **options))
    assert whole.keys() == walked.keys() and len(whole) >= 9  # every Linear, lm_head after the blocks included
    for name, item in whole.items():
        other = walked[name]
        assert torch.equal(item.scales, other.scales), name  # the same statistics, in the same order
        assert (item.method, item.alpha, item.folded_into) == (other.method, other.alpha, other.folded_into), name
        assert (item.error_before, item.error_after) == (other.error_before, other.error_after), name
    if build is models.hf_gpt2:  # ln_1 -> c_attn and ln_2 -> c_fc fold in each block, as in the whole-model plan
        assert whole["transformer.h.0.attn.c_attn"].folded_into == "transformer.h.0.ln_1"
        assert whole["transformer.h.1.mlp.c_fc"].folded_into == "transformer.h.1.ln_2"
    assert not any(p.is_meta for p in model.parameters())  # the float model is not changed


class MetaResidency:
    """A lazily opened checkpoint in miniature: every parameter starts on meta (its value kept aside), a loaded
    module gets its values back, a released one goes to meta again; records how many blocks were resident at once."""

    def __init__(self, found):
        self.saved = {}
        self.blocks = {name for name, _ in found.items}
        self.resident = set()
        self.most_blocks = 0
        for name, module in found.items + found.outside:
            self.release(name, module)

    def load(self, name, module):
        subs = dict(module.named_modules())
        for key in [key for key in self.saved if key[0] == name]:
            subs[key[1]].register_parameter(key[2], nn.Parameter(self.saved.pop(key), False))
        self.resident.add(name)
        self.most_blocks = max(self.most_blocks, len(self.resident & self.blocks))

    def release(self, name, module):
        for sub_name, sub in module.named_modules():
            for key, parameter in list(sub.named_parameters(recurse=False)):
                self.saved[(name, sub_name, key)] = parameter.detach().clone()
                sub.register_parameter(key, nn.Parameter(parameter.detach().to("meta"), False))
        self.resident.discard(name)


def test_one_block_resident_at_a_time_gives_the_same_records():
    torch.manual_seed(0)
    model = models.hf_llama()
    whole = by_layer(plan_smoothing(model, linear_names(model), token_batches(), method="smoothquant"))
    lazy = models.hf_llama()
    lazy.load_state_dict(model.state_dict())
    residency = MetaResidency(find_blocks(lazy))  # everything on meta, as a lazily opened checkpoint
    walked = by_layer(plan_smoothing_sequential(lazy, linear_names(lazy), token_batches(), method="smoothquant",
                                                residency=residency))
    assert residency.most_blocks == 1 and residency.resident == set()
    assert whole.keys() == walked.keys()
    for name in whole:
        assert torch.equal(whole[name].scales, walked[name].scales), name


def test_smoothed_weights_on_meta_are_computed_when_their_block_loads():
    torch.manual_seed(0)
    model = models.hf_gpt2()  # folds into LayerNorms (weight and bias) and smooths Conv1D weights
    items = plan_smoothing(model, linear_names(model), token_batches(), method="smoothquant")
    eager = models.hf_gpt2()
    eager.load_state_dict(model.state_dict())
    apply_smoothing(eager, items)

    lazy = models.hf_gpt2()
    lazy.load_state_dict(model.state_dict())
    real = {name: p.detach().clone() for name, p in lazy.named_parameters()}
    sources = {id(p): name for name, p in lazy.named_parameters()}

    class ParameterResidency:  # keeps each Parameter object (as LazyCheckpoint swaps its data in place)
        def load(self, name, module):
            for p in module.parameters():
                if p.is_meta and id(p) in sources:
                    torch.utils.swap_tensors(p, nn.Parameter(real[sources[id(p)]].clone(), p.requires_grad))

        def release(self, name, module):
            for p in module.parameters():
                if not p.is_meta and id(p) in sources:
                    torch.utils.swap_tensors(p, nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad))

    inner = ParameterResidency()
    inner.release("", lazy)
    derived = []
    apply_smoothing(lazy, items, derived)
    assert derived and all(item.target.is_meta for item in derived)
    residency = WithDerivedWeights(inner, derived)
    block = lazy.transformer.h[0]
    residency.load("transformer.h.0", block)
    expected = dict(eager.transformer.h[0].named_parameters())
    for name, parameter in block.named_parameters():
        assert torch.equal(parameter, expected[name]), name  # W * s and the LayerNorms' 1/s, bit for bit
    assert lazy.transformer.h[1].attn.c_attn.weight.is_meta  # the other block stays on meta
    residency.release("transformer.h.0", block)
    assert all(p.is_meta for p in block.parameters())
    assert WithDerivedWeights(AllResident(), []).pending() is False


def test_bad_inputs_are_refused_by_name():
    model = models.hf_llama()
    with pytest.raises(SmoothingError, match="Unknown smoothing method 'gptq'"):
        plan_smoothing_sequential(model, linear_names(model), token_batches(), method="gptq")
    with pytest.raises(SmoothingError, match="model.layers.0.input_layernorm: smoothing applies to Linear layers"):
        plan_smoothing_sequential(model, ["model.layers.0.input_layernorm"], token_batches())
    with pytest.raises(ValueError, match="No calibration batches"):
        plan_smoothing_sequential(model, linear_names(model), [])

    class Cancelled:
        def is_set(self):
            return True
    with pytest.raises(CalibrationCancelled):
        plan_smoothing_sequential(model, linear_names(model), token_batches(), cancel=Cancelled())
