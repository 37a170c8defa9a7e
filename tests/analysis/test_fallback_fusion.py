"""The fallback search is fusion-aware (issue 27 point 6): a plain search whose answer leaves an INT8 layer alone
between float layers (TensorRT reformats on both sides; the lint flags it) now leaves that layer in float too,
when the goal still holds, and says so."""
import pytest

from workbench.analysis import fallback_search
from workbench.quant.algorithms.format_rules import isolated_layers
from workbench.session import Session
from workbench.session.analysis import analysis_batches
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec

# stem.0 and block.conv2 sit on either side of block.conv1 in the demo CNN: floating both isolates it
RANKING = ["stem.0", "block.conv2", "expand.0"]


@pytest.fixture(scope="module")
def session():
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2))
    session.calibrate(method="max")
    return session


def mix_of(session, result):
    mix = {name: "int8" for name in session.project.layers}
    for unit in result.chosen:
        mix.update({layer: "float" for layer in session.layers_of(unit)})
    return mix


def test_an_isolated_int8_layer_is_left_in_float_too_and_lint_agrees(session):
    model = session.quantized_model()
    batches = analysis_batches(session.data("evaluation"))
    order = list(session.project.layers)
    # a target the first two units of the ranking reach, and the first alone does not
    curve = fallback_search(model, batches, "sqnr", target=1e9, ranking=RANKING).curve
    assert curve[1].value < curve[2].value, "the demo's SQNR should rise with stem.0 and block.conv2 in float"
    target = (curve[1].value + curve[2].value) / 2

    plain = fallback_search(model, batches, "sqnr", target=target, ranking=RANKING)
    assert [u.name for u in plain.chosen] == ["stem.0", "block.conv2"] and plain.reached
    assert [found[0] for found in isolated_layers(order, mix_of(session, plain))] == ["block.conv1"]

    aware = fallback_search(model, batches, "sqnr", target=target, ranking=RANKING, layer_order=order,
                            precisions={name: "int8" for name in order})
    assert [u.name for u in aware.chosen] == ["stem.0", "block.conv2", "block.conv1"]
    assert isolated_layers(order, mix_of(session, aware)) == []
    assert aware.reached and aware.curve[-1].value >= target  # the metric still meets the target (measured)
    assert aware.curve[-1].unit == "block.conv1" and aware.curve[-1].num_float == 3
    assert any("block.conv1" in note and "also left in float" in note for note in aware.notes)

    # applied, the export's lint finds no isolated quantized layer (it flags block.conv1 after the plain answer)
    session.apply_fallback(aware)
    assert [w for w in session.lint() if w.kind == "isolated_quantized_layer"] == []
    session.set_quantize(["stem.0", "block.conv2", "block.conv1"], True)


def test_the_users_float_layers_are_float_neighbours(session):
    model = session.quantized_model()
    batches = analysis_batches(session.data("evaluation"))
    order = list(session.project.layers)
    # block.add already runs in float (the user's choice): floating block.conv1 leaves block.conv2 alone between them
    precisions = {name: "int8" for name in order} | {"block.add": "float"}
    curve = fallback_search(model, batches, "sqnr", target=1e9, ranking=["block.conv1"]).curve
    target = (curve[0].value + curve[1].value) / 2
    result = fallback_search(model, batches, "sqnr", target=target, ranking=["block.conv1"], layer_order=order,
                             precisions=precisions)
    assert [u.name for u in result.chosen] == ["block.conv1", "block.conv2"] and result.reached
    assert any("block.conv2" in note and "block.add" in note for note in result.notes)


def test_the_ladder_moves_an_isolated_layer_to_float_when_the_goal_holds(session):
    import math

    from workbench.analysis.ladder import ladder_search
    from workbench.analysis.results import SensitivityResult, UnitResult
    from workbench.analysis.units import find_units
    from workbench.quant.algorithms.precision import Precision

    model = session.quantized_model()
    batches = analysis_batches(session.data("evaluation"))
    order = list(session.project.layers)
    units = {u.name: u for u in find_units(model)}
    ranked = RANKING + ["block.conv1"]
    ranking = SensitivityResult("one-off", {"name": "sqnr", "direction": "higher"}, math.inf, 30.0,
                                [UnitResult(name, list(units[name].quantizers), 40.0 - i, 1.0, -1.0, rank=i + 1)
                                 for i, name in enumerate(ranked)], 1, 0.0)
    curve = fallback_search(model, batches, "sqnr", target=1e9, ranking=RANKING).curve
    target = (curve[1].value + curve[2].value) / 2
    own = {name: Precision.INT8 for name in order}

    def search(**fusion):
        return ladder_search(model, batches, "sqnr", ladder=["int8", "float"], rung_of=lambda name, precision: None,
                             precisions=own, target=target, ranking=ranking, **fusion)

    plain = search()
    assert plain.reached and [found[0] for found in isolated_layers(order, plain.precisions)] == ["block.conv1"]
    aware = search(layer_order=order)
    assert aware.reached and aware.value >= target
    assert isolated_layers(order, aware.precisions) == []
    assert aware.precisions["block.conv1"] == "float" and aware.steps[-1].unit == "block.conv1"
    assert any(note.startswith("moved to float: block.conv1") for note in aware.notes)
