"""The session: what both front ends do, tested headlessly on the demo and on models built in tests."""
import shutil
import textwrap

import numpy as np
import pytest
import torch

from workbench.session import Session, SessionError
from workbench.sources.data_source import DataSpec
from workbench.sources.errors import SourceError, TrustRequired
from workbench.sources.model_source import ModelSpec


def demo_session(calib_batches=2):
    return Session.create(ModelSpec("demo", "digits"),
                          DataSpec("demo", "digits", split="train", batch_size=64, num_batches=calib_batches),
                          DataSpec("demo", "digits", split="test", batch_size=256))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A calibrated demo project saved to disk, shared by the read-only tests below."""
    folder = tmp_path_factory.mktemp("calibrated")
    session = demo_session()
    session.calibrate(method="entropy")
    path = session.save(folder / "digits.qwb")
    return session, path


def amaxes(session):
    return {name: q._amax.clone() for name, q in session.quantized_model().named_modules(remove_duplicate=False)
            if hasattr(q, "_amax")}


def test_new_project_lists_layers_with_defaults():
    session = demo_session()
    names = [layer.name for layer in session.layers()]
    assert names == ["stem.0", "block.conv1", "block.conv2", "block.add", "expand.0", "head_pool", "fc"]
    add = next(layer for layer in session.layers() if layer.name == "block.add")
    assert add.kind == "functional" and add.type == "QuantAdd"
    conv = next(layer for layer in session.layers() if layer.name == "block.conv1")
    assert conv.input_summary == "int8 per-tensor hist" and conv.weight_summary == "int8 per-channel(0) max"
    # bn1 is folded into the conv (the default, as TensorRT does): its weight plus the bias folding gives it
    assert conv.amax_summary == "uncalibrated" and conv.parameters == 16 * 16 * 9 + 16
    assert conv.notes == ["folded bn1"]
    assert session.project.input_spec.shape == (1, 8, 8)


def test_selection_by_name_pattern_type_and_subtree():
    session = demo_session()
    assert session.select(types=["Conv2d"]) == ["stem.0", "block.conv1", "block.conv2", "expand.0"]
    assert session.select(subtree="block") == ["block.conv1", "block.conv2", "block.add"]
    assert session.select(patterns=[r".*conv\d"]) == ["block.conv1", "block.conv2"]
    assert session.ignore_preview([r"fc", "head"]) == ["head_pool", "fc"]
    with pytest.raises(SessionError, match="Not quantizable layers"):
        session.select(names=["block.bn1"])
    with pytest.raises(SessionError, match="not a valid regular expression"):
        session.ignore_preview(["conv["])


def test_ignoring_layers_leaves_them_in_float():
    session = demo_session()
    assert session.set_quantize(["fc", "block.add"], False) == ["fc", "block.add"]
    model = session.quantized_model()
    assert type(model.fc).__name__ == "Linear"
    assert not any("block.add" in name for name, _ in model.named_modules())
    assert session.set_quantize(["fc"], False) == []  # no change
    session.set_quantize(["fc"], True)
    assert type(session.quantized_model().fc).__name__ == "QuantLinear"


def test_descriptors_for_several_layers():
    session = demo_session()
    changed = session.set_descriptor(["block.conv1", "block.conv2"], "weight", num_bits=4)
    assert changed == ["block.conv1", "block.conv2"]
    model = session.quantized_model()
    assert model.block.conv1.weight_quantizer.num_bits == 4
    assert model.block.conv1.weight_quantizer.axis == 0  # other fields kept
    assert model.stem[0].weight_quantizer.num_bits == 8
    session.set_descriptor(["block.add"], "input", calib_method="max", unsigned=False)
    assert type(session.quantized_model().block.add._input0_quantizer._calibrator).__name__ == "MaxCalibrator"
    with pytest.raises(SessionError, match="block.conv1: .*calib_method"):
        session.set_descriptor(["block.conv1"], "input", calib_method="kl")
    with pytest.raises(SessionError, match="head_pool has no weight quantizer"):
        session.set_descriptor(["head_pool"], "weight", num_bits=4)
    session.reset_descriptor(["block.conv1"])
    assert session.quantized_model().block.conv1.weight_quantizer.num_bits == 8


def test_calibration_is_restored_on_open_without_recalibrating(calibrated, tmp_path):
    session, path = calibrated
    # move the project away from its data: reopening must not need the data to restore amax
    moved = tmp_path / "moved.qwb"
    shutil.copy(path, moved)
    reopened = Session.open(moved)
    assert reopened.build_report.stale == []
    before, after = amaxes(session), amaxes(reopened)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert reopened.evaluate("top1") == session.evaluate("top1")
    histogram = reopened.histogram("block.conv2._input_quantizer")
    assert np.array_equal(histogram["counts"], session.histogram("block.conv2._input_quantizer")["counts"])
    assert set(histogram["amax"]) == {"max", "entropy", "mse", "percentile"}


def test_changing_a_descriptor_makes_only_that_layer_stale(calibrated, tmp_path):
    _, path = calibrated
    session = Session.open(path)
    session.set_descriptor(["fc"], "input", num_bits=6)
    session.quantized_model()
    assert session.build_report.stale == ["fc._input_quantizer"]
    assert session.quantized_model().fc.input_quantizer.amax is None
    assert session.quantized_model().block.conv1.input_quantizer.amax is not None
    with pytest.raises(SessionError, match="not calibrated .*fc._input_quantizer"):
        session.export(tmp_path / "x.onnx")
    # calibrating again clears it: the summary and status bar stop asking for a recalibration
    session.calibrate(method="max", num_batches=1)
    assert session.build_report.stale == [] and session.summary()["stale_quantizers"] == []


def test_recompute_amax_with_another_method_uses_the_histograms(calibrated):
    session, _ = calibrated
    quantizer = session.quantized_model().block.conv1.input_quantizer
    expected = quantizer._calibrator.compute_amax("percentile", percentile=99.0)
    updated = session.recompute_amax(["block.conv1"], "percentile", percentile=99.0)
    assert updated == {"block.conv1._input_quantizer": pytest.approx(float(expected))}
    assert session.project.current_calibration.quantizers["block.conv1._input_quantizer"].method == "percentile"
    session.recompute_amax(["block.conv1"], "entropy")


def test_weight_ranges(calibrated):
    session, _ = calibrated
    ranges = session.weight_ranges("block.conv1")
    assert ranges.shape == (16,)
    # the weights the engine runs: bn1 folded into them
    from workbench.graph.fold import folded_weights

    folded, _ = folded_weights(session.float_model.block.conv1, session.float_model.block.bn1)
    assert np.allclose(ranges, folded.abs().amax((1, 2, 3)).numpy())
    assert session.weight_ranges("head_pool") is None


def test_export_is_recorded(calibrated, tmp_path):
    session, _ = calibrated
    report = session.export(tmp_path / "digits.onnx", amax_json=True)
    assert (tmp_path / "digits.onnx").is_file() and (tmp_path / "digits.amax.json").is_file()
    assert report.cosine > 0.999
    record = session.project.exports[-1]
    assert record.path == str(tmp_path / "digits.onnx") and record.report["quantize_nodes"] == report.quantize_nodes


MODEL_CODE = textwrap.dedent("""
    import torch
    from torch import nn

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
""")


@pytest.fixture
def user_project(tmp_path):
    """A project on user code and user weights, in a folder that can be moved around."""
    folder = tmp_path / "work"
    (folder / "models").mkdir(parents=True)
    (folder / "models" / "net.py").write_text(MODEL_CODE)
    np.save(folder / "calib.npy", np.random.default_rng(0).normal(size=(8, 3, 6, 6)).astype(np.float32))
    spec = ModelSpec("entrypoint", str(folder / "models" / "net.py") + ":make")
    with pytest.raises(TrustRequired):
        Session.create(spec, DataSpec("tensors", str(folder / "calib.npy"), batch_size=4))
    session = Session.create(spec, DataSpec("tensors", str(folder / "calib.npy"), batch_size=4), trust_code=True)
    session.calibrate(method="max")
    return folder, session.save(folder / "project.qwb")


def test_paths_are_relative_so_the_folder_can_move(user_project, tmp_path):
    folder, path = user_project
    moved = shutil.move(str(folder), str(tmp_path / "elsewhere"))
    with pytest.raises(TrustRequired):
        Session.open(f"{moved}/project.qwb")
    session = Session.open(f"{moved}/project.qwb", trust_code=True)
    assert session.project.model.target == "models/net.py:make"
    assert session.build_report.stale == [] and session.file_changes == []
    assert session.data("calibration").num_samples == 8


def test_a_changed_model_file_is_reported(user_project):
    folder, path = user_project
    (folder / "models" / "net.py").write_text(MODEL_CODE + "\n# edited\n")
    session = Session.open(path, trust_code=True)
    assert len(session.file_changes) == 1 and "net.py changed since the project was saved" in session.file_changes[0]


def test_data_that_does_not_fit_the_model_names_both_shapes(tmp_path):
    np.save(tmp_path / "wrong.npy", np.zeros((4, 3, 8, 8), dtype=np.float32))
    with pytest.raises(SourceError, match=r"failed on a sample input of shape \(2, 3, 8, 8\).*wrong.npy.*channels"):
        Session.create(ModelSpec("demo", "digits"), DataSpec("tensors", str(tmp_path / "wrong.npy")))
    session = demo_session()
    with pytest.raises(SourceError, match=r"\(3, 8, 8\) per sample, but the model input is \(1, 8, 8\)"):
        session.set_data("evaluation", DataSpec("tensors", str(tmp_path / "wrong.npy")))


def test_settings_and_unknown_setting():
    session = demo_session()
    session.set_setting("rules", {"concat": True, "maxpool": True, "residual": False})
    assert session.quantized_model().block.add._input0_quantizer._disabled is False
    with pytest.raises(SessionError, match="Unknown setting"):
        session.set_setting("colour", "blue")
    with pytest.raises(SessionError, match="no CUDA device"):
        if not torch.cuda.is_available():
            session.set_device("cuda")
        else:
            raise SessionError("no CUDA device")  # keep the assertion meaningful on a GPU machine


def test_units_map_to_layers_and_the_latest_fallback_is_kept(calibrated):
    session, _ = calibrated
    profile = session.sensitivity(num_batches=1)
    unit = profile.unit("block.add")
    assert session.layers_of(unit) == ["block.add"]  # named by its quantizer block.add._input1_quantizer
    assert session.layers_of("fc") == ["fc"] and session.layers_of("block.bn1") == []
    assert session.latest_fallback() is None or session.latest_fallback().curve
    result = session.fallback(target=20.0, max_units=1)
    latest = session.latest_fallback()
    assert latest is not None and latest.plot_data() == result.plot_data() and latest.target == 20.0


def test_a_preview_export_leaves_the_project_alone(calibrated, tmp_path):
    session, _ = calibrated
    settings, exports, dirty = dict(session.project.settings["export"]), len(session.project.exports), session.dirty
    report = session.export(tmp_path / "preview.onnx", opset=13, remember=False)
    assert (tmp_path / "preview.onnx").is_file() and report.opset == 13
    assert session.project.settings["export"] == settings and len(session.project.exports) == exports
    assert session.dirty == dirty


def test_descriptor_and_shapes_for_the_layer_panel():
    session = demo_session()
    assert session.descriptors(["block.conv1"], "input") == {
        "block.conv1": {"num_bits": 8, "name": None, "calib_method": "histogram"}}
    assert session.descriptors(["block.conv1", "head_pool"], "weight") == {
        "block.conv1": {"num_bits": 8, "name": None, "axis": 0}, "head_pool": None}
    session.set_descriptor(["block.conv1"], "input", num_bits=6)
    assert session.descriptors(["block.conv1"], "input")["block.conv1"]["num_bits"] == 6
    with pytest.raises(SessionError, match="not a quantizable layer"):
        session.descriptors(["block.bn1"], "input")
    shapes = session.layer_shapes()
    assert shapes["stem.0"] == {"inputs": [(1, 1, 8, 8)], "output": (1, 16, 8, 8), "weight": (16, 1, 3, 3)}
    assert shapes["fc"]["weight"] == (10, 32) and session.layer_shapes() is shapes  # computed once


def test_set_descriptor_changes_nothing_when_one_layer_fails():
    session = demo_session()
    with pytest.raises(SessionError, match="head_pool has no weight quantizer"):
        session.set_descriptor(["block.conv1", "head_pool"], "weight", num_bits=4)
    assert session.project.layers["block.conv1"].weight_desc is None


def test_functional_add_shows_the_amax_of_its_quantized_input(calibrated):
    session, _ = calibrated
    add = next(layer for layer in session.layers() if layer.name == "block.add")
    # the residual rule bypasses the identity input; the row shows the input that is quantized
    assert add.amax_summary not in ("uncalibrated", "-")


def test_calibration_progress_counts_the_batches_the_data_has():
    session = demo_session(calib_batches=2)
    seen = []
    session.calibrate(method="max", num_batches=16, progress=lambda done, total, message: seen.append((done, total)))
    assert seen[-1] == (2, 2) and session.project.current_calibration.num_batches == 2


def test_build_quantized_leaves_the_project_and_the_float_model_as_they_were(tmp_path):
    """Building is a function of the project: the session's model and a fresh build agree, nothing changes."""
    import copy as _copy

    from workbench.session import Built, build_quantized

    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=32, num_batches=1))
    session.calibrate(num_batches=1)
    session.set_quantize([next(iter(session.project.layers))], False)
    layers_before = _copy.deepcopy(session.project.layers)
    weights_before = {k: v.clone() for k, v in session.float_model.state_dict().items()}
    base, folding = session._fold_base()
    built = build_quantized(base, session.project, session.device, folding=folding)
    assert isinstance(built, Built)
    assert session.project.layers == layers_before
    assert all(torch.equal(v, session.float_model.state_dict()[k]) for k, v in weights_before.items())
    sample = session.sample_inputs(batch=4)
    with torch.no_grad():
        assert torch.equal(built.model(sample), session.quantized_model()(sample))
    assert sorted(built.report.restored) == sorted(session.build_report.restored)
