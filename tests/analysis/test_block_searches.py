"""The fallback and ladder searches one block at a time (issue 37 point 3): per-unit costs at each block's output,
one global choice, checked end to end; one block's weights resident; a cancel leaves the model as it came."""
import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from workbench.analysis.block_fallback import block_fallback_search
from workbench.analysis.block_ladder import block_ladder_search
from workbench.analysis.block_search import WalkOptions
from workbench.analysis.errors import AnalysisCancelled
from workbench.analysis.fallback import fallback_search
from workbench.analysis.ladder import LadderResult, ladder_search
from workbench.analysis.results import FallbackResult
from workbench.analysis.units import resolve_units
from workbench.export.naming import layer_of_quantizer
from workbench.quant import QuantDescriptor, replace_to_quantization_module
from workbench.quant.algorithms.block_walk import find_blocks
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.precision import Precision
from workbench.quant.algorithms.snapshot import quantizer_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models  # noqa: E402  (tests/transformers/models.py: the tiny HF builders)

from tests.quant.test_sequential import MetaResidency  # noqa: E402  (a checkpoint in miniature, one block at a time)

INT8_FLOAT = ["int8", "float"]


def token_batches(n=3):
    return [{"input_ids": models.tokens(2, 8, 50, seed=i)} for i in range(n)]


@pytest.fixture
def llama():
    """The tiny LLaMA of test_block_sensitivity: block 1's down_proj reads a few huge channels (by far the costliest
    unit), the other units far behind; calibrated with max."""
    torch.manual_seed(0)
    model = models.hf_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[:4] *= 60.0
        model.model.layers[1].mlp.gate_proj.weight[:4] *= 8.0
    replace_to_quantization_module(model, quant_desc_input=QuantDescriptor())
    calibrate(model, token_batches(), num_batches=None, method="max", report_sqnr=False)
    return model


def int8_layers(model):
    return {layer_of_quantizer(q)[0]: Precision.INT8 for u in resolve_units(model, None) for q in u.quantizers}


def state_of(model):
    return {name: (id(q), q.is_enabled, q.amax.clone()) for name, q in quantizer_names(model).items()}


def assert_same_state(model, before):
    after = state_of(model)
    assert after.keys() == before.keys()
    for name, (ident, enabled, amax) in before.items():
        assert after[name][0] == ident and after[name][1] == enabled, name
        assert torch.equal(after[name][2], amax), name


def test_the_sequential_ladder_chooses_the_whole_model_ladders_mix_on_separated_units(llama):
    before = state_of(llama)
    whole = ladder_search(llama, token_batches(), "sqnr", ladder=INT8_FLOAT, rung_of=lambda q, p: None,
                          precisions=int8_layers(llama), tolerance=5.0, output="logits")
    walked = block_ladder_search(llama, token_batches(), ladder=INT8_FLOAT, rung_of=lambda q, p: None,
                                 precisions=int8_layers(llama), tolerance=5.0, options=WalkOptions(output="logits"))
    assert whole.promoted == {"model.layers.1.mlp.down_proj": "float"}
    assert walked.promoted == whole.promoted and walked.reached and walked.precisions == whole.precisions
    # the same metric: the model output's SQNR, the start and the chosen mix measured end to end, block by block
    assert walked.start == pytest.approx(whole.start, abs=1e-3)
    assert walked.value == pytest.approx(whole.value, abs=1e-3)
    assert walked.target == pytest.approx(whole.target, abs=1e-3)
    assert walked.walk.startswith("2 LlamaDecoderLayer blocks in model.layers")
    assert "measured block by block" in walked.summary() and "measured block by block" not in whole.summary()
    assert walked.weight_bytes == whole.weight_bytes
    assert_same_state(llama, before)
    again = LadderResult.from_dict(json.loads(json.dumps(walked.to_dict())))  # as the project file keeps it
    assert again.walk == walked.walk and again.summary() == walked.summary()


def test_the_sequential_fallback_leaves_the_same_layer_in_float(llama):
    before = state_of(llama)
    whole = fallback_search(llama, token_batches(), "sqnr", tolerance=5.0, output="logits")
    walked = block_fallback_search(llama, token_batches(), tolerance=5.0, options=WalkOptions(output="logits"))
    assert whole.chosen_names == walked.chosen_names == ["model.layers.1.mlp.down_proj"]
    assert walked.reached and walked.final_value == pytest.approx(whole.final_value, abs=1e-3)
    assert walked.quantized == pytest.approx(whole.quantized, abs=1e-3)
    assert walked.ranking[0] == "model.layers.1.mlp.down_proj"
    assert_same_state(llama, before)
    again = FallbackResult.from_dict(json.loads(json.dumps(walked.to_dict())))
    assert again.walk == walked.walk and "measured block by block" in again.summary()


def test_a_byte_budget_is_met_and_the_mix_measured(llama):
    walked = block_ladder_search(llama, token_batches(), ladder=INT8_FLOAT, rung_of=lambda q, p: None,
                                 precisions=int8_layers(llama), budget_bytes=39104,
                                 options=WalkOptions(output="logits"))
    assert walked.weight_bytes <= 39104 and walked.reached
    assert "model.layers.1.mlp.down_proj" in walked.promoted  # the costliest unit is the one the bytes buy first
    assert walked.value > walked.start  # measured, better than all int8


def test_one_block_resident_at_a_time(llama):
    found = find_blocks(llama)
    residency = MetaResidency(name for name, _ in found.items)  # refuses a block loaded while another is
    for name, module in found.items + found.outside:  # opened lazily: nothing in memory yet
        residency.release(name, module)
    messages = []
    walked = block_fallback_search(llama, token_batches(), tolerance=5.0,
                                   options=WalkOptions(residency=residency, output="logits",
                                                       progress=lambda done, total, message: messages.append(message)))
    assert walked.chosen_names == ["model.layers.1.mlp.down_proj"]
    walks = sum(": captured the inputs" in message for message in messages)  # one per walk
    assert walks >= 2  # the costing walk and a checking walk
    # each block loaded once per walk, and every weight released at the end
    assert [n for n in residency.loads if n in residency.blocks] == ["model.layers.0", "model.layers.1"] * walks
    assert residency.resident == set()
    assert all(p.is_meta for _, block in found.items for p in block.parameters())


@pytest.mark.parametrize("where", ["costing the units: block model.layers.1", "measuring the chosen mix"])
def test_a_cancel_mid_walk_leaves_the_model_as_it_came(llama, where):
    fp8_twin = copy.deepcopy(llama)  # a second set of quantizers the ladder swaps in for "fp8"
    twins = quantizer_names(fp8_twin)
    before = state_of(llama)

    class Cancel:
        armed = False

        def is_set(self):
            return self.armed

    cancel = Cancel()

    def progress(done, total, message):
        if message.startswith(where):
            cancel.armed = True

    with pytest.raises(AnalysisCancelled, match="cancelled"):
        block_ladder_search(llama, token_batches(), ladder=["int8", "fp8", "float"],
                            rung_of=lambda q, p: twins.get(q), precisions=int8_layers(llama), tolerance=5.0,
                            options=WalkOptions(output="logits", progress=progress, cancel=cancel))
    assert cancel.armed
    assert_same_state(llama, before)  # the same quantizer objects (no fp8 twin left in), flags and amax


def test_a_model_without_repeated_blocks_is_refused_by_name():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    replace_to_quantization_module(model)
    with pytest.raises(ValueError, match="fallback search one block at a time: Sequential has no nn.ModuleList of "
                                         "identical blocks.*without --sequential"):
        block_fallback_search(model, [torch.randn(2, 4)], target=30.0)
    with pytest.raises(ValueError, match="ladder search one block at a time: .*no nn.ModuleList.*without --sequential"):
        block_ladder_search(model, [torch.randn(2, 4)], ladder=INT8_FLOAT, rung_of=lambda q, p: None,
                            precisions={"0": Precision.INT8, "2": Precision.INT8}, target=30.0)


def test_cli_fallback_and_ladder_sequential_on_a_lazily_opened_checkpoint(tmp_path, capsys, monkeypatch):
    from checkpoints import new_project, save_outlier_llama

    from tests.cli_run import run
    from workbench.session import Session
    from workbench.sources import model_source
    from workbench.sources.lazy_checkpoint import LazyCheckpoint

    pytest.importorskip("accelerate")
    save_outlier_llama(tmp_path)
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    project = new_project(capsys, tmp_path, tmp_path / "llama", precision="int8")
    code, _, err = run(capsys, "calibrate", project, "--method", "max", "--sequential")
    assert code == 0, err
    monkeypatch.setattr(LazyCheckpoint, "materialise", lambda self, model: pytest.fail("every weight was read"))

    code, out, err = run(capsys, "sensitivity", project, "--sequential", "--tolerance", "3", "--json")
    assert code == 0, err
    fallback = json.loads(out)["fallback"]
    assert fallback["walk"].startswith("2 LlamaDecoderLayer blocks") and fallback["reached"]
    assert fallback["chosen"][0]["name"] == "model.layers.1.mlp.down_proj"

    # the Linear layers were set by hand: pins the ladder keeps (their noise still counted), unless revisited
    code, out, err = run(capsys, "sensitivity", project, "--sequential", "--ladder", "int8,fp8,float",
                         "--tolerance", "3")
    assert "measured block by block" in out and "kept as set by hand" in out
    code, out, err = run(capsys, "sensitivity", project, "--sequential", "--ladder", "int8,fp8,float",
                         "--tolerance", "3", "--revisit-pins")
    assert code == 0, out + err
    assert "measured block by block" in out and " reached" in out

    session = Session.open(project)  # the project file keeps the searches as they were
    ladder = session.latest_ladder()
    assert ladder.walk.startswith("2 LlamaDecoderLayer blocks") and ladder.ladder == ["int8", "fp8", "float"]
    assert ladder.reached and ladder.promoted.get("model.layers.1.mlp.down_proj") == "float"
    assert session.latest_fallback().walk == fallback["walk"]

    code, _, err = run(capsys, "sensitivity", project, "--sequential", "--target", "30", "--metric", "cosine")
    assert code != 0 and "takes no metric" in err
