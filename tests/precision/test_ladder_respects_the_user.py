"""Issue 35, points 4 and 5: the ladder (and the fallback search) never "reaches" by quantizing nothing, follows
the data flow (not module order) in its fusion clean-up, treats a quantized GEMM among float layers as normal,
keeps the layers set by hand (pins) unless asked to revisit them, and its Apply changes only what differs, says
what, can be undone, and shows as applied after a reopen."""
import json
import math

import numpy as np
import pytest
import torch

from tests.cli_run import run
from tests.test_cli_smoothing import MODEL
from workbench.session import Session


@pytest.fixture
def project(tmp_path, capsys):
    (tmp_path / "block.py").write_text(MODEL)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 16, 64), dtype=np.float32))
    path = tmp_path / "block.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/block.py:make", "--data", tmp_path / "x.npy",
                       "--batch-size", "8", "--trust-code")
    assert code == 0, err
    assert run(capsys, "calibrate", path, "--method", "max")[0] == 0
    return path


def _quantized(precisions):
    return [name for name, precision in precisions.items() if precision not in ("float", "custom")]


@pytest.mark.parametrize("ladder", ["int8,fp8,float", "int8,float"])
def test_a_goal_only_all_float_meets_is_not_reached_and_a_quantized_mix_is_kept(project, capsys, ladder):
    # 200 dB: no quantized mix gets there; all float does (SQNR +inf), which quantizes nothing
    code, out, err = run(capsys, "sensitivity", project, "--metric", "sqnr", "--target", "200", "--ladder", ladder,
                         "--apply", "--json")
    assert code == 3, err  # not reached
    data = json.loads(out)
    assert _quantized(data["precisions"]), data["precisions"]
    result = data.get("ladder") or data["fallback"]
    assert result["reached"] is False
    assert any("quantizes nothing" in note for note in result["notes"])
    assert math.isfinite(data.get("value", result.get("curve", [{}])[-1].get("value", 0)))
    # the project is not stuck: the layers kept quantized are still there to rank, smooth and set
    session = Session.open(project, trust_code=True)
    assert _quantized({k: (v.value if v else "custom") for k, v in session.precisions().items()})


def test_layers_set_by_hand_are_pins_the_ladder_keeps_unless_asked(project):
    session = Session.open(project, trust_code=True)
    session.set_precision(["head"], "fp8")  # by hand; the search would start it on int8
    session.calibrate(method="max")
    kept = session.ladder("int8,fp8,float", target=25, metric="sqnr")
    assert kept.precisions["head"] == "fp8"
    assert any("kept as set by hand" in note and "head" in note for note in kept.notes)
    revisited = session.ladder("int8,fp8,float", target=25, metric="sqnr", revisit_pins=True)
    assert "head" in revisited.units  # searched this time


def test_apply_changes_only_what_differs_keeps_hand_edits_and_can_be_undone(project):
    session = Session.open(project, trust_code=True)
    session.set_descriptor(["head"], "input", narrow_range=True)  # a hand edit (-127..127), still int8
    session.calibrate(method="max")
    hand = dict(session.project.layers["head"].input_desc)
    result = session.ladder("int8,fp8,float", target=25, metric="sqnr")
    assert result.precisions == {"fc": "fp8", "head": "int8"}
    changes = session.ladder_changes(result)
    assert [(c.layer, c.now, c.then, c.hand_set) for c in changes] == [("fc", "int8", "fp8", False)]
    assert [c.layer for c in session.apply_ladder(result)] == ["fc"]
    assert session.project.layers["head"].input_desc == hand  # untouched: it was int8 already
    assert session.precisions()["fc"].value == "fp8"
    # an edit made since: a second Apply (of the same search) does not wipe it
    session.set_descriptor(["fc"], "input", calib_method="histogram")
    edited = dict(session.project.layers["fc"].input_desc)
    assert session.apply_ladder(result) == [] and session.project.layers["fc"].input_desc == edited
    session.save()
    reopened = Session.open(project, trust_code=True)
    assert reopened.latest_ladder().applied  # shown as applied after a reopen
    # undo (in the session that applied it) puts the decisions back
    session.set_descriptor(["fc"], "input", calib_method="max")
    undone = Session.open(project, trust_code=True)
    with pytest.raises(Exception, match="nothing to undo"):
        undone.undo_ladder_apply()
    fresh = Session.open(project, trust_code=True)
    fresh.set_precision(["fc"], "int8")
    assert [c.layer for c in fresh.apply_ladder()] == ["fc"]
    assert fresh.undo_ladder_apply() == ["fc"]
    assert fresh.precisions()["fc"].value == "int8" and not fresh.latest_ladder().applied


def test_a_mix_that_overrides_hand_edits_says_so_and_can_keep_them(project):
    session = Session.open(project, trust_code=True)
    session.calibrate(method="max")
    result = session.ladder("int8,fp8,float", target=25, metric="sqnr")
    session.set_precision(["fc"], "float")  # set by hand after the search
    changes = session.ladder_changes(result)
    assert [(c.layer, c.now, c.then, c.hand_set) for c in changes] == [("fc", "float", "fp8", True)]
    assert "set by hand" in changes[0].text()
    assert session.apply_ladder(result, keep_hand_edits=True) == []
    assert session.precisions()["fc"].value == "float"


def _vit_flow():
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
    import models

    from workbench.analysis.layer_flow import record_layer_flow

    model = models.hf_vit("eager")
    layers = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    flow = record_layer_flow(model, layers, models.images(1), torch.device("cpu"))
    assert flow is not None
    return layers, {name: (flow.producers[name], flow.consumers[name]) for name in layers}


def test_value_is_a_sibling_of_key_in_the_data_flow_not_between_key_and_output():
    from workbench.quant.algorithms.format_rules import isolated_in_flow, isolated_layers

    layers, flow = _vit_flow()
    attention = "layers.1.attention"  # transformers' ViT: q_proj, k_proj, v_proj, o_proj
    query, key, value, output = (f"{attention}.{n}_proj" for n in ("q", "k", "v", "o"))
    assert flow[value][0] == flow[key][0] == flow[query][0] and flow[value][0]  # one input, three readers
    assert key not in flow[value][0] and value not in flow[key][1]
    assert flow[value][1] == {output}
    # key and the output in float: module order calls value "between" them; the data flow does not
    mix = {name: "int8" for name in layers}
    mix.update({key: "float", output: "float"})
    assert value in [found[0] for found in isolated_layers(layers, mix)]
    assert value not in [found[0] for found in isolated_in_flow(flow, mix)]


def test_a_quantized_gemm_among_float_layers_is_normal_w8a8():
    from workbench.quant.algorithms.format_rules import isolated_in_flow, order_neighbours

    flow = order_neighbours(["up", "mid", "down"])
    mix = {"up": "float", "mid": "int8", "down": "float"}
    assert [found[0] for found in isolated_in_flow(flow, mix)] == ["mid"]  # a lone quantized add or pool
    assert isolated_in_flow(flow, mix, gemms={"mid"}) == []  # a Linear: kept (the input Q runs on its own)
    from workbench.quant.algorithms.format_rules import flow_notes

    assert not any("mid runs" in note for note in flow_notes(flow, mix, {"mid"}))  # and the notes do not nag


def test_a_project_with_every_layer_in_float_is_not_stuck(project, capsys):
    """After an all-float mix (the old ladder's "reached"): each command says what to do, and set brings it back."""
    assert run(capsys, "set", project, "--pattern", ".*", "--precision", "float")[0] == 0
    for command in (["sensitivity", project, "--metric", "sqnr"], ["calibrate", project, "--smoothquant", "0.5"]):
        code, _, err = run(capsys, *command)
        assert code != 0 and "every layer of this project is in float" in err, err
        assert "--precision int8" in err and "TensorQuantizer" not in err and "replace_to_quantization" not in err
    code, out, err = run(capsys, "set", project, "--pattern", ".*", "--precision", "int4w")
    assert code == 0 and "precision int4w: fc, head" in out, err
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    code, _, err = run(capsys, "sensitivity", project, "--metric", "sqnr")
    assert code == 0, err
