"""Issue 35, points 1-3: a precision means what it says from every state a layer can be in (float, int8, fp8, int4w,
custom), in the Session and so in the CLI and the GUI; and a precision of an attention covers its four quantizers."""
import json

import pytest

from tests.cli_run import run
from workbench.quant.algorithms.precision import E4M3_BITS
from workbench.session import Session

STATES = ("float", "int8", "fp8", "int4w", "custom")
TARGETS = ("int8", "fp8", "int4w", "float")
# what the quantized fc1 holds in each precision: (input bits, input on, weight bits, weight block)
HELD = {"int8": (8, True, 8, None), "fp8": (E4M3_BITS, True, E4M3_BITS, None), "int4w": (8, False, 4, 64)}


@pytest.fixture
def project(outlier_block):
    return outlier_block


def _put_in(session: Session, state: str) -> None:
    if state == "custom":  # 4-bit per-channel weights with 8-bit inputs: no precision of the registry
        session.set_descriptor(["fc1"], "weight", num_bits=4)
    elif state != "int8":
        session.set_precision(["fc1"], state)
    assert session.precision_label("fc1") == state if hasattr(session, "precision_label") else True
    read = session.precisions(["fc1"])["fc1"]
    assert (read.value if read is not None else "custom") == state


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("target", TARGETS)
def test_a_precision_lands_where_asked_from_every_state(project, state, target):
    session = Session.open(project, trust_code=True)
    _put_in(session, state)
    session.set_precision(["fc1"], target)
    assert session.precisions(["fc1"])["fc1"].value == target
    fc1 = dict(session.quantized_model().named_modules())["fc1"]
    if target == "float":
        # in float no quantizer of fc1 runs: a plain layer's are switched off in place (no rebuild), or gone
        assert not any(q.is_enabled for name, q in fc1.named_modules() if name.endswith("_quantizer"))
        session.save()
        assert Session.open(project, trust_code=True).precisions(["fc1"])["fc1"].value == "float"
        return
    in_bits, in_on, w_bits, block = HELD[target]
    assert fc1._input_quantizer.num_bits == in_bits and fc1._input_quantizer.enabled_by_descriptor == in_on
    assert fc1._weight_quantizer.num_bits == w_bits and fc1._weight_quantizer.block_size == block
    # the same after a save and a reopen: the project holds it, not only the live model
    session.save()
    again = Session.open(project, trust_code=True)
    assert again.precisions(["fc1"])["fc1"].value == target


def test_from_float_fp8_is_fp8_at_once_and_int4w_is_taken_cli(project, capsys):
    """The issue's commands: float, then fp8 printed "precision fp8: fc1" and showed int8 until run twice; float,
    then int4w was refused because "a Linear layer has no weight quantizer"."""
    def precision_of_fc1():
        code, out, err = run(capsys, "show", project, "--json", "--trust-code")
        assert code == 0, err
        return {row["name"]: row for row in json.loads(out)["layer_table"]}["fc1"]

    assert run(capsys, "set", project, "--layer", "fc1", "--precision", "float", "--trust-code")[0] == 0
    code, out, err = run(capsys, "set", project, "--layer", "fc1", "--precision", "fp8", "--trust-code")
    assert code == 0 and "precision fp8: fc1" in out, err
    row = precision_of_fc1()
    assert row["precision"] == "fp8" and row["input_summary"].startswith("fp8")
    assert run(capsys, "set", project, "--layer", "fc1", "--precision", "float", "--trust-code")[0] == 0
    code, out, err = run(capsys, "set", project, "--layer", "fc1", "--precision", "int4w", "--trust-code")
    assert code == 0, err
    assert "no weight quantizer" not in err
    row = precision_of_fc1()
    assert row["precision"] == "int4w" and row["weight_summary"].startswith("int4 block")


def test_a_descriptor_edit_on_a_float_layer_is_kept_for_when_it_is_quantized(project):
    session = Session.open(project, trust_code=True)
    session.set_precision(["fc1"], "float")
    session.set_descriptor(["fc1"], "input", calib_method="max")  # refused before: "fc1 has no input quantizer"
    session.set_quantize(["fc1"], True)
    fc1 = dict(session.quantized_model().named_modules())["fc1"]
    assert fc1._input_quantizer.num_bits == 8 and type(fc1._input_quantizer.calibrator).__name__ == "MaxCalibrator"
