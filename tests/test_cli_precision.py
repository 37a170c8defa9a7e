"""Precision per layer from the command line: ``set --precision``, ``show`` with each layer's precision,
calibration per format, export, and the project round trip, on the outlier-channel block of issue 22."""
import json

import numpy as np
import onnx
import pytest

from tests.cli_run import layer_rows, run
from workbench.session import Session


@pytest.fixture
def project(outlier_block):
    return outlier_block



def test_set_precision_and_show_it(project, capsys):
    assert {n: r["precision"] for n, r in layer_rows(capsys, project).items()} == {"fc1": "int8", "fc2": "int8"}
    code, out, err = run(capsys, "set", project, "--layer", "fc2", "--precision", "fp8", "--trust-code")
    assert code == 0, err
    assert "precision fp8: fc2" in out
    code, out, err = run(capsys, "set", project, "--pattern", "fc1", "--precision", "int4w", "--block-size", "64",
                         "--trust-code")
    assert code == 0, err
    rows = layer_rows(capsys, project)
    assert rows["fc2"]["precision"] == "fp8" and rows["fc2"]["input_summary"].startswith("fp8 per-tensor")
    assert rows["fc1"]["precision"] == "int4w"
    assert rows["fc1"]["input_summary"] == "float (off)" and rows["fc1"]["weight_summary"] == "int4 block 64 max"
    code, out, _ = run(capsys, "show", project, "--trust-code")
    assert "fc2                              Linear               fp8 " in out
    # the precision is the descriptors: a hand edit back to 8 bits reads as int8 again
    run(capsys, "set", project, "--layer", "fc2", "--input-desc", "num_bits=8", "--weight-desc", "num_bits=8",
        "--trust-code")
    assert layer_rows(capsys, project)["fc2"]["precision"] == "int8"
    run(capsys, "set", project, "--layer", "fc2", "--weight-desc", "num_bits=4", "--trust-code")
    assert layer_rows(capsys, project)["fc2"]["precision"] == "custom"
    run(capsys, "set", project, "--layer", "fc2", "--precision", "float", "--trust-code")
    assert layer_rows(capsys, project)["fc2"]["precision"] == "float"


def test_bad_precision_requests_are_refused_with_the_reason(project, capsys):
    code, _, err = run(capsys, "set", project, "--precision", "fp8", "--trust-code")
    assert code == 2 and "say which layers" in err
    code, _, err = run(capsys, "set", project, "--layer", "fc1", "--precision", "fp8", "--block-size", "64",
                       "--trust-code")
    assert code == 2 and "--block-size goes with --precision int4w" in err
    code, _, err = run(capsys, "set", project, "--layer", "fc1", "--precision", "int4w", "--block-size", "0",
                       "--trust-code")
    assert code == 2 and "fc1: block_size must be a positive integer" in err
    assert layer_rows(capsys, project)["fc1"]["precision"] == "int8"  # unchanged


def test_int4w_on_a_convolution_names_the_layer(tmp_path, capsys):
    path = tmp_path / "digits.qwb"
    assert run(capsys, "new", path, "--model", "demo:digits", "--data", "demo:digits", "--num-batches", "1")[0] == 0
    code, _, err = run(capsys, "set", path, "--type", "Conv2d", "--type", "Linear", "--precision", "int4w")
    assert code == 2 and "stem.0: int4w is INT4 weight-only for weight GEMMs" in err
    assert layer_rows(capsys, path)["fc"]["precision"] == "int8"  # all or nothing


def test_fp8_on_the_outlier_layer_recovers_the_block(project, capsys):
    """The issue's example: INT8 everywhere loses the block to fc2's outlier channels; FP8 on fc2 alone
    brings it back (the numbers the README quotes)."""
    code, out, err = run(capsys, "calibrate", project, "--json", "--trust-code")
    assert code == 0, err
    int8 = json.loads(out)["output_sqnr_db"]
    run(capsys, "set", project, "--layer", "fc2", "--precision", "fp8", "--trust-code")
    code, out, err = run(capsys, "calibrate", project, "--json", "--trust-code")
    fp8 = json.loads(out)["output_sqnr_db"]
    assert int8 < 15 and fp8 > 26 and fp8 - int8 > 12


def test_round_trip_keeps_precisions_amax_and_block_scales(project, capsys, tmp_path):
    run(capsys, "set", project, "--layer", "fc1", "--precision", "int4w", "--block-size", "64", "--trust-code")
    run(capsys, "set", project, "--layer", "fc2", "--precision", "fp8", "--trust-code")
    code, _, err = run(capsys, "calibrate", project, "--block-method", "mse", "--trust-code")
    assert code == 0, err
    first = Session.open(project, trust_code=True)
    model = first.quantized_model()
    block_amax = model.fc1._weight_quantizer.amax.clone()
    fp8_amax = float(model.fc2._input_quantizer.amax)
    assert tuple(block_amax.shape) == (128, 1, 1)
    record = first.project.current_calibration.quantizers["fc1._weight_quantizer"]
    assert record.method == "block mse"
    # reopened: the same precisions, and the same amax (no recalibration needed: nothing is stale)
    again = Session.open(project, trust_code=True)
    assert again.precisions() == first.precisions()
    assert {k: v.value for k, v in again.precisions().items()} == {"fc1": "int4w", "fc2": "fp8"}
    # weight bytes of the mix: fc1 INT4 in one block of 64 per row, fc2 FP8 per channel, biases and the norm float
    extra = 4 * (128 + 64 + 64 + 64)  # fc1.bias, fc2.bias, norm weight and bias
    assert again.weight_bytes() == (128 * 64 // 2 + 4 * 128 * 1) + (64 * 128 + 4 * 64) + extra
    assert again.weight_bytes({}) == 4 * sum(p.numel() for p in again.quantized_model().parameters())
    reopened = again.quantized_model()
    assert np.array_equal(reopened.fc1._weight_quantizer.amax.numpy(), block_amax.numpy())
    assert float(reopened.fc2._input_quantizer.amax) == fp8_amax
    assert again.build_report.stale == []
    # the mse search shrank some blocks below their max
    blocked = reopened.fc1.weight.detach().reshape(128, 1, 64).abs().amax(-1, keepdim=True)
    assert bool((block_amax < blocked - 1e-6).any()) and bool((block_amax <= blocked + 1e-6).all())
    # and the export carries both formats, validated
    target = tmp_path / "block.onnx"
    code, out, err = run(capsys, "export", project, "-o", target, "--json", "--trust-code")
    assert code == 0, err
    report = json.loads(out)
    assert report["opset"] == 21 and report["formats"] == {"fp8": 2, "int4": 1}
    assert report["cosine"] > 0.9999
    graph = onnx.load(str(target)).graph
    assert any(a.name == "block_size" and a.i == 64 for n in graph.node for a in n.attribute)
