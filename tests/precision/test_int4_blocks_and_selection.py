"""Issue 35, point 6 (INT4 block sizes checked against TensorRT: 64 or 128, dividing the input features; refused at
``set``, linted in older projects) and the selection parts of point 7 (``--layer '.*'`` points to ``--pattern``;
``--pattern X --type Y`` is the layers matching X that are of type Y, and ``--help`` says so)."""
import json

import pytest

from tests.cli_run import layer_rows, run


@pytest.fixture
def project(outlier_block):
    return outlier_block



def test_int4_blocks_are_the_ones_tensorrt_builds(project, capsys):
    # 32 (the README's old example): not a size TensorRT takes; the error names the ones it does
    code, _, err = run(capsys, "set", project, "--layer", "fc2", "--precision", "int4w", "--block-size", "32",
                       "--trust-code")
    assert code == 2 and "fc2: TensorRT builds INT4 weight-only blocks of 64 or 128 elements, not 32" in err
    # 128 on fc1's 64 input features: not whole blocks
    code, _, err = run(capsys, "set", project, "--layer", "fc1", "--precision", "int4w", "--block-size", "128",
                       "--trust-code")
    assert code == 2 and "fc1: a block of 128 does not divide the layer's 64 input features" in err
    assert "use a block of 64" in err
    assert {r["precision"] for r in layer_rows(capsys, project).values()} == {"int8"}  # nothing changed
    # without --block-size each layer gets the largest that fits: 64 on fc1 (64 in), 128 on fc2 (128 in)
    code, _, err = run(capsys, "set", project, "--pattern", "fc", "--precision", "int4w", "--trust-code")
    assert code == 0, err
    rows = layer_rows(capsys, project)
    assert rows["fc1"]["weight_summary"] == "int4 block 64 max"
    assert rows["fc2"]["weight_summary"] == "int4 block 128 max"
    # a hand edit of the block is held to the same rule
    code, _, err = run(capsys, "set", project, "--layer", "fc2", "--weight-desc", "block_size=32", "--trust-code")
    assert code == 2 and "not 32" in err
    code, out, err = run(capsys, "set", project, "--help")
    assert "64 or 128" in out


def test_the_lint_names_a_block_size_an_older_project_holds(project, capsys):
    from workbench.session import Session

    session = Session.open(project, trust_code=True)
    session.set_precision(["fc1"], "int4w")
    # as a project saved before the check holds it: blocks of 32 on fc1
    session.project.layers["fc1"].weight_desc = dict(session.project.layers["fc1"].weight_desc, block_size=32)
    session.save()
    assert run(capsys, "calibrate", project, "--method", "max", "--trust-code")[0] == 0
    code, out, err = run(capsys, "lint", project, "--json", "--trust-code")
    assert code in (0, 1), err
    found = [w for w in json.loads(out)["warnings"] if w["kind"] == "int4_block_size"]
    assert len(found) == 1 and found[0]["modules"] == ["fc1"]
    assert "64 or 128" in found[0]["message"] and "not 32" in found[0]["message"]


def test_a_regex_given_as_a_layer_name_points_to_pattern(project, capsys):
    code, _, err = run(capsys, "set", project, "--layer", ".*", "--precision", "fp8", "--trust-code")
    assert code == 2 and "Not quantizable layers of this model: .*" in err
    assert "--pattern '.*'" in err


def test_pattern_and_type_choose_the_layers_matching_both(project, capsys):
    code, out, err = run(capsys, "set", project, "--pattern", "fc", "--type", "Linear", "--layer", "fc1",
                         "--precision", "fp8", "--trust-code")
    assert code == 0 and "precision fp8: fc1, fc2" in out, err
    code, out, err = run(capsys, "set", project, "--pattern", "fc1", "--type", "Linear", "--precision", "float",
                         "--trust-code")
    assert code == 0, err
    assert {n: r["precision"] for n, r in layer_rows(capsys, project).items()} == {"fc1": "float", "fc2": "fp8"}
    code, _, err = run(capsys, "set", project, "--pattern", "fc1", "--type", "Conv2d", "--precision", "int8",
                       "--trust-code")
    assert code == 2 and "Conv2d" in err
    code, out, _ = run(capsys, "set", project, "--help")
    assert "narrows" in " ".join(out.split())
