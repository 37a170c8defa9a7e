"""Export: independent sequence axes, the UNet parity gap explained, LSTM float by default (issue 23)."""
import json
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from shapes import EncoderDecoder, UNetish

from tests.ort_run import value_session
from workbench import cli
from workbench.export import export_qdq_onnx
from workbench.graph.prepare import prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.snapshot import quantizer_names


def dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_encoder_and_decoder_lengths_are_independent_axes(tmp_path, exporter):
    sample = {"input_ids": torch.randint(0, 32, (2, 7)), "decoder_input_ids": torch.randint(0, 32, (2, 4))}
    model, _ = prepare_for_tensorrt(EncoderDecoder().eval(), example_inputs=sample)
    calibrate(model, [sample], num_batches=1, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, sample, tmp_path / "ed.onnx", exporter=exporter)
    graph = onnx.load(str(tmp_path / "ed.onnx")).graph
    assert [(i.name, dims(i)) for i in graph.input] == [("input_ids", ["batch", "sequence"]),
                                                        ("decoder_input_ids", ["batch", "decoder_sequence"])]
    assert report.sequence_check is not None and report.sequence_check.cosine > 0.999
    # lengths the sample never had, and unequal: onnxruntime runs them and matches the model
    session = value_session(tmp_path / "ed.onnx")
    ids, target = torch.randint(0, 32, (3, 11)), torch.randint(0, 32, (3, 2))
    out = session.run(None, {"input_ids": ids.numpy(), "decoder_input_ids": target.numpy()})[0]
    with torch.no_grad():
        expected = model(ids, target).numpy()
    assert out.shape == (3, 2, 32) and np.abs(out - expected).max() < 1e-3


def test_unet_export_reports_the_optimized_onnxruntime_gap_and_why(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    model, _ = prepare_for_tensorrt(UNetish().eval(), example_inputs=(x,))
    for quantizer in quantizer_names(model).values():
        quantizer.rounding = "onnx"  # as the project builds it
    calibrate(model, [torch.randn(2, 3, 16, 16) for _ in range(3)], num_batches=3, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, x, tmp_path / "unet.onnx")
    assert report.cosine > 0.99999  # the graph as written is the project's model
    with torch.no_grad():
        expected = model(x).numpy()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(str(tmp_path / "unet.onnx"), options).run(None, {"input": x.numpy()})[0]
    assert np.abs(plain - expected).max() < 1e-5
    optimized = ort.InferenceSession(str(tmp_path / "unet.onnx")).run(None, {"input": x.numpy()})[0]
    gap = float(np.abs(optimized - expected).max())
    assert report.optimized_check is not None and report.optimized_check.max_abs_diff == pytest.approx(gap, abs=1e-6)
    if gap > 1e-5:  # the default kernels round differently: said, with what to compare instead
        assert any("default graph optimizations differs" in w and "ORT_DISABLE_ALL" in w for w in report.warnings)


def test_lstm_is_left_float_by_default_with_a_reason_and_exports(tmp_path, capsys):
    here = str(__import__("pathlib").Path(__file__).resolve().parent)
    (tmp_path / "net.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {here!r})
        from shapes import LSTMHead
        def make():
            return LSTMHead()
    """))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(8, 5, 6)).astype(np.float32))
    project = tmp_path / "lstm.qwb"
    code = cli.main(["new", str(project), "--model", f"{tmp_path}/net.py:make", "--data", str(tmp_path / "x.npy"),
                     "--batch-size", "4", "--trust-code"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "left in floating point: lstm (LSTM): left in floating point by default" in out
    assert cli.main(["calibrate", str(project)]) == 0
    capsys.readouterr()
    assert cli.main(["show", str(project)]) == 0
    out = capsys.readouterr().out
    assert "layers: 2 of 3 quantized" in out and "lstm (LSTM): left in floating point by default" in out
    assert cli.main(["export", str(project), "--json"]) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    report = report.get("report", report)
    # one ONNX LSTM node (not unrolled), float, counted beside the two quantized Linears
    assert not any("unrolled step by step" in w for w in report["warnings"])
    assert report["weight_gemms"] == 3 and len(report["float_weight_gemms"]) == 1 and report["cosine"] > 0.999
