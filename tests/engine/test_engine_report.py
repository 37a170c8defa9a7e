"""trtexec's layer information and profile, mapped back onto the demo project's modules."""
import json

import pytest
from engine_files import engine_layers, profile_for

from workbench.engine import (
    EngineReport,
    EngineReportError,
    analyse_engine,
    load_engine_layers,
    precision_of_format,
    read_profile,
)
from workbench.engine.report import import_engine_report


def project_layers(session):
    return {name: decision.quantize for name, decision in session.project.layers.items()}


def test_format_strings_give_the_precision():
    assert precision_of_format("Thirty-two wide channel vectorized row major Int8 format.") == "INT8"
    assert precision_of_format("Channel major INT8 format where channel % 16 == 0") == "INT8"
    assert precision_of_format("Sixteen wide channel vectorized row major FP16 format") == "FP16"
    assert precision_of_format("Half") == "FP16"
    assert precision_of_format("Row major linear FP32") == "FP32"
    assert precision_of_format("Float") == "FP32"
    assert precision_of_format("Row major linear BFloat16 format") == "BF16"
    assert precision_of_format("Row major linear UInt8 format") == "UINT8"
    assert precision_of_format(None) is None


def test_each_module_gets_its_engine_layer_precision_and_time(demo_export, trtexec_files):
    session, _, _, _ = demo_export
    layer_info, profile, layers = trtexec_files
    report = import_engine_report(str(layer_info), str(profile), project_layers(session))
    stem = report.outcome("stem.0")
    assert stem.quantized is True and stem.engine_precision == "INT8"
    assert stem.engine_layer == "stem.0._weight_quantizer/QuantizeLinear + stem.0/Conv + stem.2/Relu"
    assert stem.time_ms == pytest.approx(0.011)
    conv2 = report.outcome("block.conv2")
    assert conv2.engine_precision == "FP32" and "block.add/Add" in conv2.engine_layer
    assert report.outcome("block.add").engine_layer == conv2.engine_layer  # fused into the convolution
    assert report.outcome("fc").engine_precision == "INT8"  # its Gemm, not its standalone input Quantize
    # modules that are not quantizable layers are reported too, for the tree
    assert report.outcome("stem.2").engine_layer == stem.engine_layer and report.outcome("stem.2").quantized is None
    assert report.total_time_ms == pytest.approx(sum(0.010 + 0.001 * i for i in range(len(layers))))
    assert report.unmapped == []


def test_hazards_name_the_modules(demo_export, trtexec_files):
    session, _, _, _ = demo_export
    layer_info, profile, _ = trtexec_files
    report = import_engine_report(str(layer_info), str(profile), project_layers(session))
    found = sorted((h.kind, tuple(h.modules)) for h in report.hazards)
    assert found == sorted([
        ("quantized_not_int8", ("block.conv2",)),
        ("quantized_not_int8", ("block.add",)),
        ("quantized_not_int8", ("head_pool",)),
        ("int8_reformat", ("head_pool",)),
        # fc's standalone input Quantize is forced by head_pool's float output; the network input's is expected
        ("requantize", ("head_pool",)),
    ])
    requantize = next(h for h in report.hazards if h.kind == "requantize")
    assert requantize.engine_layer == "fc._input_quantizer/QuantizeLinear"
    assert "re-quantizes after a float average pool (head_pool)" in requantize.advice
    assert "quantize head_pool so the pool runs in INT8" in requantize.advice
    text = report.text()
    assert "block.conv2" in text and "ran FP32" in text and "5 hazards" in text


def test_json_shape_and_round_trip(demo_export, trtexec_files):
    session, _, _, _ = demo_export
    layer_info, profile, _ = trtexec_files
    report = import_engine_report(str(layer_info), str(profile), project_layers(session))
    data = json.loads(json.dumps(report.to_dict()))
    assert {"module", "quantized", "engine_precision", "engine_layer", "time_ms"} <= set(data["layers"][0])
    assert set(data["hazards"][0]) == {"kind", "modules", "engine_layer", "advice"}
    assert data["layers"][0]["module"] == "stem.0"
    assert EngineReport.from_dict(data) == report


def test_layer_names_only_and_tensorrt10_metadata(demo_export, tmp_path):
    session, _, _, names = demo_export
    plain = [layer["Name"] for layer in engine_layers(names)]
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"Layers": plain, "Bindings": ["input", "output"]}))
    layers, detailed = load_engine_layers(path)
    report = analyse_engine(layers, detailed, project_layers(session))
    assert not detailed and report.outcome("stem.0").engine_precision is None
    assert report.outcome("stem.0").engine_layer.endswith("stem.0/Conv + stem.2/Relu")
    assert "layer names only" in report.text()
    # TensorRT 10 (kgen/myelin) names layers itself and lists the ONNX nodes in Metadata
    fused = {"Name": "__myl_ConvRelu_0", "LayerType": "kgen", "Metadata": "[ONNX Layer: stem.0/Conv]\x1e"
             "[ONNX Layer: stem.2/Relu]", "Inputs": [{"Name": "x", "Format/Datatype": "Half"}],
             "Outputs": [{"Name": "y", "Format/Datatype": "Half"}]}
    path.write_text(json.dumps({"Layers": [fused], "Bindings": []}))
    layers, detailed = load_engine_layers(path)
    report = analyse_engine(layers, detailed, project_layers(session))
    assert report.outcome("stem.0").engine_layer == "__myl_ConvRelu_0"
    assert [(h.kind, h.modules) for h in report.hazards] == [("quantized_not_int8", ["stem.0"])]
    assert report.outcome("block.conv1").engine_layer is None  # not in this engine
    assert report.precision_counts()["not in engine"] == len(project_layers(session)) - 1


def test_profile_without_averages_uses_total_over_count(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"count": 10}, {"name": "a/Conv", "timeMs": 2.0, "percentage": 100.0}]))
    assert read_profile(path)["a/Conv"].average_ms == pytest.approx(0.2)


def test_files_that_are_not_trtexec_reports_get_clear_errors(demo_export, trtexec_files, tmp_path):
    layer_info, profile, layers = trtexec_files
    with pytest.raises(EngineReportError, match="is a trtexec profile .*--profile"):
        load_engine_layers(profile)
    with pytest.raises(EngineReportError, match="is layer information .*not a profile"):
        load_engine_layers(layer_info, layer_info)
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(EngineReportError, match=r"junk\.json is not JSON \(line 1"):
        load_engine_layers(junk)
    junk.write_text(json.dumps({"layers": []}))
    with pytest.raises(EngineReportError, match=r"no \"Layers\" list \(keys: layers\).*exportLayerInfo"):
        load_engine_layers(junk)
    with pytest.raises(EngineReportError, match="no such file"):
        load_engine_layers(tmp_path / "missing.json")
    other = tmp_path / "other_profile.json"
    other.write_text(json.dumps(profile_for(["x/Conv", "y/Relu"])))
    with pytest.raises(EngineReportError, match="different engines"):
        load_engine_layers(layer_info, other)
