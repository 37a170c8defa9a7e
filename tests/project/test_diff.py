"""Project diff: what changed between two attempts."""
import copy
import json

import numpy as np
import pytest

from workbench.project import load_project, save_project
from workbench.project.diff import diff_projects
from workbench.project.model import (
    CalibrationRecord,
    EngineReportRecord,
    ExportRecord,
    LayerDecision,
    Project,
    QuantizerRecord,
    SensitivityRecord,
)


def attempt():
    project = Project(name="first")
    project.layers = {"conv1": LayerDecision("conv1", "Conv2d"), "conv2": LayerDecision("conv2", "Conv2d"),
                      "fc": LayerDecision("fc", "Linear")}
    project.settings = {"fold_bn": True, "export": {"opset": 17}, "rules": {"residual": True}}
    quantizers = {name: QuantizerRecord(name, np.array(amax, dtype=np.float32), "max", "max")
                  for name, amax in [("conv1._input_quantizer", 2.0), ("conv1._weight_quantizer", [0.5, 1.0]),
                                     ("fc._input_quantizer", 4.0)]}
    project.calibrations = [CalibrationRecord(1, "t", "max", 99.9, 4, 1.0, "cpu", quantizers=quantizers)]
    project.sensitivity = [SensitivityRecord(1, "t", {"units": [{"name": "conv1", "rank": 1}, {"name": "fc", "rank": 2},
                                                                {"name": "conv2", "rank": 3}]})]
    project.exports = [ExportRecord(1, "t", "m.onnx", {}, {"path": "m.onnx", "opset": 17, "cosine": 0.9991,
                                                           "quantize_nodes": 6})]
    project.engine_reports = [EngineReportRecord(1, "t", {"total_time_ms": 1.5, "hazards": [{"kind": "x"}], "layers": [
        {"module": "conv1", "quantized": True, "engine_precision": "FP32"},
        {"module": "conv2", "quantized": True, "engine_precision": "INT8"}]})]
    return project


def second_attempt(first):
    second = copy.deepcopy(first)
    second.name = "second"
    second.layers["conv1"].quantize = False
    second.layers["fc"].input_desc = {"num_bits": 8, "calib_method": "histogram"}
    del second.layers["conv2"]
    second.layers["head"] = LayerDecision("head", "Linear")
    second.settings["rules"]["residual"] = False
    second.calibrations[0].method = "entropy"
    second.calibrations[0].quantizers["conv1._weight_quantizer"].amax = np.array([0.5, 1.5], dtype=np.float32)
    second.calibrations[0].quantizers["fc._input_quantizer"].amax = np.array(3.0, dtype=np.float32)
    del second.calibrations[0].quantizers["conv1._input_quantizer"]
    second.sensitivity[0].data["units"] = [{"name": "fc", "rank": 1}, {"name": "conv1", "rank": 2},
                                           {"name": "conv2", "rank": 3}]
    second.exports[0].report["cosine"] = 0.9999
    second.engine_reports[0].data["layers"][0]["engine_precision"] = "INT8"
    second.engine_reports[0].data["hazards"] = []
    return second


def test_a_project_against_itself_has_no_differences(tmp_path):
    project = attempt()
    assert diff_projects(project, copy.deepcopy(project)).empty
    assert "no differences" in diff_projects(project, copy.deepcopy(project)).text()


def test_every_section_lists_what_changed():
    first = attempt()
    diff = diff_projects(first, second_attempt(first))
    assert [(c.where, c.a, c.b) for c in diff.settings] == [("rules.residual", True, False)]
    assert diff.layers_added == ["head"] and diff.layers_removed == ["conv2"]
    assert [(c.where, c.a, c.b) for c in diff.layers] == [
        ("conv1.quantize", True, False), ("fc.input.num_bits", "<absent>", 8),
        ("fc.input.calib_method", "<absent>", "histogram")]
    assert [(c.where, c.a, c.b) for c in diff.calibration] == [("method", "max", "entropy")]
    amax = {c.quantizer: c for c in diff.amax}
    assert amax["conv1._weight_quantizer"].relative == pytest.approx(0.5)   # the largest channel change
    assert amax["fc._input_quantizer"].relative == pytest.approx(-0.25)     # smaller: negative
    assert amax["conv1._input_quantizer"].b is None and amax["conv1._input_quantizer"].relative is None
    assert [c.quantizer for c in diff.amax][:2] == ["conv1._weight_quantizer", "fc._input_quantizer"]
    assert [(r.unit, r.a, r.b) for r in diff.sensitivity] == [("conv1", 1, 2), ("fc", 2, 1)]
    assert [(c.where, c.a, c.b) for c in diff.export] == [("cosine", 0.9991, 0.9999)]
    assert [(c.where, c.a, c.b) for c in diff.engine] == [("hazards", 1, 0), ("precision of conv1", "FP32", "INT8")]
    text = diff.text()
    assert "rules.residual: True -> False" in text and "+ head" in text and "- conv2" in text
    assert "conv1._weight_quantizer: 1 -> 1.5 (+50.0%)" in text and "precision of conv1: FP32 -> INT8" in text
    data = json.loads(json.dumps(diff.to_dict()))
    assert data["a"] == "first" and data["b"] == "second" and data["layers_added"] == ["head"]


def test_diff_of_saved_projects(tmp_path):
    first = attempt()
    second = second_attempt(first)
    save_project(first, tmp_path / "a.qwb")
    save_project(second, tmp_path / "b.qwb")
    diff = diff_projects(load_project(tmp_path / "a.qwb"), load_project(tmp_path / "b.qwb"))
    assert diff.layers_added == ["head"] and [r.unit for r in diff.sensitivity] == ["conv1", "fc"]
