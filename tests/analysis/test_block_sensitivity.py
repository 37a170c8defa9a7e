"""Sensitivity one block at a time (issue 37 point 3): each layer's SQNR at its block's output, the blocks run one
at a time from cached float inputs, ranks the clearly separated layers in the whole-model ranking's order."""
import sys
from pathlib import Path

import pytest
import torch

from workbench.analysis import sensitivity
from workbench.analysis.block_sensitivity import block_sensitivity
from workbench.quant import QuantDescriptor, replace_to_quantization_module
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.snapshot import quantizer_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models  # noqa: E402  (tests/transformers/models.py: the tiny HF builders)


def token_batches(n=3):
    return [{"input_ids": models.tokens(2, 8, 50, seed=i)} for i in range(n)]


@pytest.fixture
def llama():
    """A tiny LLaMA whose block 1 MLP input has outlier channels (down_proj's int8 input suffers most) and whose
    q/k/v of block 0 read a tame input: the ranks far apart, calibrated with max."""
    torch.manual_seed(0)
    model = models.hf_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[:4] *= 60.0  # a few huge down_proj input channels
        model.model.layers[1].mlp.gate_proj.weight[:4] *= 8.0
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor())
    calibrate(model, token_batches(), num_batches=None, method="max", report_sqnr=False)
    return model


def test_block_ranking_agrees_with_the_whole_model_ranking_on_separated_layers(llama):
    before = {name: (q.is_enabled, q.amax.clone()) for name, q in quantizer_names(llama).items()}
    whole = sensitivity(llama, token_batches(), "sqnr", scheme="one-on", output="logits")
    walked = block_sensitivity(llama, token_batches())
    assert {u.name for u in whole.units} == {u.name for u in walked.units}
    assert walked.scheme == "one-on" and walked.metric["name"] == "block output SQNR"
    assert walked.ranked()[0].name == whole.ranked()[0].name == "model.layers.1.mlp.down_proj"
    # the order of the clearly separated layers (their whole-model values 3 dB or more apart) is the same
    value = {u.name: u.value for u in whole.units}
    mine = {u.name: u.value for u in walked.units}
    pairs = [(a, b) for a in value for b in value if value[a] > value[b] + 3]
    assert pairs
    disagree = [(a, b) for a, b in pairs if not mine[a] > mine[b]]
    assert len(disagree) <= len(pairs) // 10, disagree
    assert "lm_head" in mine and mine["lm_head"] == pytest.approx(value["lm_head"], abs=1e-3)  # at the output
    # the model is as it came in
    for name, q in quantizer_names(llama).items():
        assert q.is_enabled == before[name][0] and torch.equal(q.amax, before[name][1]), name


def test_a_model_without_blocks_is_refused_by_name():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    replace_to_quantization_module(model)
    with pytest.raises(ValueError, match="no nn.ModuleList of identical blocks.*without --sequential"):
        block_sensitivity(model, [torch.randn(2, 4)])


def test_cli_sensitivity_sequential_on_a_lazily_opened_checkpoint(tmp_path, capsys, monkeypatch):
    import json

    from checkpoints import save_outlier_llama

    from tests.cli_run import run
    from workbench.sources import model_source
    from workbench.sources.lazy_checkpoint import LazyCheckpoint

    pytest.importorskip("accelerate")
    save_outlier_llama(tmp_path)
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"hf:{tmp_path / 'llama'}", "--data",
                       tmp_path / "ids.npy", "--batch-size", "4", "--output-key", "logits")
    assert code == 0, err
    for command in (["set", project, "--type", "Linear", "--precision", "int8"],
                    ["calibrate", project, "--method", "max", "--sequential"]):
        code, _, err = run(capsys, *command)
        assert code == 0, err
    monkeypatch.setattr(LazyCheckpoint, "materialise", lambda self, model: pytest.fail("every weight was read"))
    code, out, err = run(capsys, "sensitivity", project, "--sequential", "--json")
    assert code == 0, err
    ranking = json.loads(out)["sensitivity"]
    assert ranking["scheme"] == "one-on" and ranking["metric"]["name"] == "block output SQNR"
    top = min(ranking["units"], key=lambda unit: unit["rank"])
    assert top["name"] == "model.layers.1.mlp.down_proj"
    code, _, err = run(capsys, "sensitivity", project, "--sequential", "--metric", "cosine")
    assert code != 0 and "takes no metric" in err
