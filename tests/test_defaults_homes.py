"""One named home per default and rule (issue 29 point 4): every reader uses the home, and the literal does not
come back as a second spelling somewhere else."""
import ast
import inspect
from pathlib import Path

import pytest

from workbench.opsets import (
    DEFAULT_OPSET,
    FORMAT_OPSET,
    MIN_OPSET,
    TENSORRT_8_MAX_OPSET,
    check_opset,
    newest_opset,
)
from workbench.project.settings import DEFAULTS, ExportSettings, ProjectSettings, SettingsError
from workbench.quant.algorithms.blocks import DEFAULT_BLOCK_METHOD
from workbench.quant.algorithms.precision import DEFAULT_BLOCK_SIZE
from workbench.quant.calib.amax_search import DEFAULT_START_BIN
from workbench.quant.calib.histogram import DEFAULT_NUM_BINS, HistogramCalibrator, calibrate_weights
from workbench.quant.calib.methods import PERCENTILE
from workbench.quant.tensor_quant import E4M3_MAX
from workbench.sources.data_source import DataSpec
from workbench.sources.demo import DEMO_CALIB_BATCHES, DEMO_METHOD

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"


def test_the_settings_refuse_an_opset_the_exporter_cannot_write_naming_the_bounds():
    with pytest.raises(SettingsError, match=rf"export.opset is an integer from {MIN_OPSET} \(per-channel "
                                            rf"QuantizeLinear needs it\) to {newest_opset()} .*got 1\."):
        ProjectSettings.from_stored({"export": {"path": None, "opset": 1}})
    assert ExportSettings(opset=MIN_OPSET).opset == MIN_OPSET
    with pytest.raises(ValueError, match=f"from {MIN_OPSET}"):
        check_opset(MIN_OPSET - 1)
    with pytest.raises(ValueError, match=f"to {newest_opset()}"):
        check_opset(newest_opset() + 1)
    with pytest.raises(ValueError, match="got True"):
        check_opset(True)
    assert FORMAT_OPSET["int8"] == MIN_OPSET and DEFAULT_OPSET <= TENSORRT_8_MAX_OPSET


def test_every_reader_takes_its_default_from_the_home():
    from workbench.export.onnx_export import export_qdq_onnx
    from workbench.quant.algorithms.calibrate import calibrate
    from workbench.quant.algorithms.smoothing import int4_blockwise_fake_quant, plan_smoothing

    def default(function, name):
        return inspect.signature(function).parameters[name].default

    assert DEFAULTS.export.opset == default(export_qdq_onnx, "opset") == DEFAULT_OPSET
    assert DEFAULTS.calibration.percentile == default(calibrate, "percentile") == PERCENTILE.default
    assert default(HistogramCalibrator.compute_amax, "percentile") == default(calibrate_weights, "percentile") \
        == PERCENTILE.default
    assert HistogramCalibrator(8, None, False).num_bins == default(calibrate_weights, "num_bins") == DEFAULT_NUM_BINS
    assert default(HistogramCalibrator.compute_amax, "start_bin") == DEFAULT_START_BIN
    assert DEFAULTS.calibration.block_method == default(calibrate, "block_method") == DEFAULT_BLOCK_METHOD
    assert default(int4_blockwise_fake_quant, "block_size") == default(plan_smoothing, "block_size") \
        == DEFAULT_BLOCK_SIZE
    from workbench.project.settings import FinetuneSettings
    from workbench.training import finetune

    for name in ("loss", "schedule", "optimizer", "momentum", "weight_decay"):
        assert default(finetune, name) == getattr(FinetuneSettings(), name), name


def _parser():
    from workbench import cli

    return cli.build_parser()


def _subcommand(parser, name):
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _default(command, dest):
    return next(a.default for a in command._actions if a.dest == dest)


def test_the_command_line_s_defaults_are_the_homes():
    parser = _parser()
    for name in ("new", "finetune"):
        command = _subcommand(parser, name)
        assert _default(command, "batch_size") == DataSpec.batch_size
        assert _default(command, "seed") == DataSpec.seed
    demo = _subcommand(parser, "demo")
    assert (_default(demo, "calib_batches"), _default(demo, "method")) == (DEMO_CALIB_BATCHES, DEMO_METHOD)
    export_help = _subcommand(parser, "export").format_help()
    assert f"{DEFAULT_OPSET} for new projects" in " ".join(export_help.split())
    assert f"FP8 {FORMAT_OPSET['fp8']}, INT4 weights {FORMAT_OPSET['int4']}" in " ".join(export_help.split())


# a default's literal written again where a function, dataclass field or option takes it: the concept's name and
# the module that is its home (the only place the literal may stand)
_CONCEPTS = {
    "opset": "workbench/opsets.py",
    "percentile": "workbench/quant/calib/methods.py",
    "num_bins": "workbench/quant/calib/histogram.py",
    "start_bin": "workbench/quant/calib/amax_search.py",
    "block_size": "workbench/quant/algorithms/precision_registry.py",
    "block_method": "workbench/quant/algorithms/precision_registry.py",
    "calib_batches": "workbench/sources/demo.py",
}
# literals that mean one thing wherever they stand (FP8 E4M3's largest value, the percentile's default)
# (448 and 448.0 are one key: the scan's `in` matches either spelling)
_VALUES = {448: "workbench/quant/descriptor.py", 99.99: "workbench/quant/calib/methods.py"}


def _literal_defaults(tree: ast.AST):
    """(name, value, line) for each literal default of a parameter or class field named in _CONCEPTS."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, value in pairs:
                if isinstance(value, ast.Constant) and value.value is not None:
                    yield arg.arg, value.value, value.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(node.value, ast.Constant) and node.value.value is not None:
                yield node.target.id, node.value.value, node.lineno
        elif isinstance(node, ast.Call):  # parser.add_argument("--opset", default=17)
            for keyword in node.keywords:
                if keyword.arg == "default" and isinstance(keyword.value, ast.Constant) and node.args \
                        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    yield node.args[0].value.lstrip("-").replace("-", "_"), keyword.value.value, keyword.lineno


def test_no_default_is_spelled_twice():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, value, line in _literal_defaults(tree):
            if name in _CONCEPTS and relative != _CONCEPTS[name] and not isinstance(value, bool):
                found.append(f"{relative}:{line}: {name}={value!r} (home: {_CONCEPTS[name]})")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value in _VALUES \
                    and relative != _VALUES[node.value]:
                found.append(f"{relative}:{node.lineno}: {node.value!r} (home: {_VALUES[node.value]})")
    assert found == [], "defaults spelled outside their home:\n" + "\n".join(found)
    assert E4M3_MAX == 448.0 and PERCENTILE.default == 99.99  # the homes hold what the scan looks for
