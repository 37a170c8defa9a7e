"""Lint and the engine report know the formats: which layers TensorRT runs in FP8 or INT4 and what those need
from the GPU, an FP8 layer between INT8 layers (a conversion), an FP8 layer the engine did not build in FP8."""
import json
import textwrap

import numpy as np

from tests.cli_run import run
from workbench.engine.formats import format_hazards
from workbench.engine.layers import precision_of_format
from workbench.engine.report import EngineReport, ModuleOutcome
from workbench.quant.algorithms.format_rules import isolated_layers, mix_notes, reformat_boundaries, supports

CHAIN = textwrap.dedent("""
    import torch
    from torch import nn

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            # d reads 64 features: INT4 blocks of 64 (what TensorRT builds) fit it
            self.a, self.b, self.c, self.d = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 64), nn.Linear(64, 8)

        def forward(self, x):
            return self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))

    def make():
        torch.manual_seed(0)
        return Chain()
""")


def test_lint_names_the_fp8_and_int4_layers_what_they_need_and_an_fp8_layer_between_int8_ones(tmp_path, capsys):
    (tmp_path / "chain.py").write_text(CHAIN)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 32), dtype=np.float32))
    path = tmp_path / "chain.qwb"
    assert run(capsys, "new", path, "--model", f"{tmp_path}/chain.py:make", "--data", tmp_path / "x.npy",
               "--batch-size", "8", "--trust-code")[0] == 0
    assert run(capsys, "set", path, "--layer", "b", "--precision", "fp8")[0] == 0
    assert run(capsys, "set", path, "--layer", "d", "--precision", "int4w")[0] == 0
    assert run(capsys, "calibrate", path, "--method", "max")[0] == 0
    code, out, err = run(capsys, "lint", path, "--json")
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    needs = {w["message"].split(" in ")[1].split(":")[0]: w for w in warnings if w["kind"] == "format_needs"}
    assert needs["FP8 (E4M3)"]["modules"] == ["b"] and "8.9" in needs["FP8 (E4M3)"]["message"]
    assert needs["INT4 weight-only"]["modules"] == ["d"] and "TensorRT 10" in needs["INT4 weight-only"]["message"]
    switches = [w for w in warnings if w["kind"] == "format_switch"]
    assert [w["modules"] for w in switches] == [["b"]] and "between two int8 layers (a/c)" in switches[0]["message"]


def test_the_mix_rules_find_isolated_layers_and_format_switches():
    order = ["a", "b", "c", "d", "e"]
    mix = {"a": "float", "b": "int8", "c": "float", "d": "fp8", "e": "float"}
    assert isolated_layers(order, mix) == [("b", "int8", "a", "c"), ("d", "fp8", "c", "e")]
    mix = {"a": "int8", "b": "fp8", "c": "int8", "d": "int8", "e": "int8"}
    assert reformat_boundaries(order, mix) == [("b", "fp8", "int8", "a/c")]
    assert isolated_layers(order, mix) == []
    notes = mix_notes(order, mix)
    assert any("b runs fp8 between two int8 layers" in n for n in notes)
    assert any(n.startswith("fp8 needs TensorRT") and "8.9" in n for n in notes)
    assert supports("fp8", (9, 0)) and not supports("fp8", (8, 6)) and supports("fp8", None) is None
    assert supports("int8", (7, 5)) and supports("int4w", (8, 0))


def test_an_fp8_layer_the_engine_ran_in_half_precision_is_a_hazard_naming_the_gpu_it_needs():
    report = EngineReport("layers.json", None, True, 3, None, layers=[
        ModuleOutcome("a", True, "INT8", "a_layer", None),
        ModuleOutcome("b", True, "FP16", "b_layer", None),
        ModuleOutcome("c", True, "FP8", "c_layer", None)])
    hazards = format_hazards(report, {"a": "int8", "b": "fp8", "c": "fp8"})
    assert [(h.kind, h.modules) for h in hazards] == [("format_not_built", ["b"])]
    assert "compute capability 8.9+" in hazards[0].advice and "ran it in FP16" in hazards[0].advice
    assert precision_of_format("Float8") == "FP8" and precision_of_format("FP8 format") == "FP8"
