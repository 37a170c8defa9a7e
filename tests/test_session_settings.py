"""Changing settings: everything checked before anything changes; several at once; the ignore policy."""
import copy

import pytest
import torch

from workbench.project import load_project, save_project
from workbench.project.settings import CalibrationSettings, ExportSettings, RuleSettings
from workbench.session import Session, SessionError
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=1))
    return session.save(tmp_path_factory.mktemp("settings") / "digits.qwb")


@pytest.fixture
def session(saved):
    opened = Session.open(saved)
    assert not opened.dirty
    return opened


@pytest.mark.parametrize("key, value, message", [
    ("fold_bn", "yes", "fold_bn is on or off"),
    ("device", "meta", "not supported"),
    ("device", "no such device", "not a device"),
    ("metric", {"name": "bogus", "direction": None}, "Unknown metric 'bogus'"),
    ("metric", {"name": "m.py:fn", "direction": "up"}, "'higher' or 'lower'"),
    ("rules", {"concat": True, "maxpool": "no", "residual": True}, "rules.maxpool is true or false"),
    ("rules", {"concat": True, "sideways": True}, "rules has no 'sideways'"),
    ("pins", [["conv1"]], "pairs of quantizer or layer names"),
    ("defaults", {"input": {"num_bits": 99}, "weight": None}, "default input descriptor"),
    ("calibration", {"method": "guess", "num_batches": 4, "percentile": 99.9}, "calibration.method is one of"),
    ("calibration", {"method": "max", "num_batches": 0, "percentile": 99.9}, "positive number"),
    ("export", {"path": None, "opset": "17"}, "opset is an integer from 13"),
    # the exporter needs 13 (per-channel QuantizeLinear): the settings say so, naming both bounds
    ("export", {"path": None, "opset": 1}, r"export.opset is an integer from 13 \(per-channel QuantizeLinear needs "
                                           r"it\) to \d+ \(the newest the installed onnx writes\), got 1"),
    ("export", {"path": None, "opset": 999}, "the newest the installed onnx writes"),
    ("colour", "blue", "Unknown setting 'colour'"),
])
def test_a_refused_value_leaves_the_project_unchanged(session, key, value, message):
    settings, layers, device = copy.deepcopy(session.project.settings), dict(session.project.layers), session.device
    model = session.quantized_model()
    with pytest.raises(SessionError, match=message):
        session.set_setting(key, value)
    assert session.project.settings == settings and not session.dirty
    assert session.device == device and session.quantized_model() is model  # not even a rebuild
    assert session.project.layers == layers


def test_set_settings_checks_every_key_before_changing_any(session):
    settings = copy.deepcopy(session.project.settings)
    with pytest.raises(SessionError, match="fold_bn"):
        session.set_settings({"rules": {"concat": True, "maxpool": False, "residual": True}, "fold_bn": 1})
    assert session.project.settings == settings and not session.dirty


def test_set_settings_applies_all_with_one_rebuild(session):
    model = session.quantized_model()
    session.set_settings({"rules": {"concat": True, "maxpool": True, "residual": False},
                          "functional": {"add": False, "concat": True},
                          "metric": {"name": "top1", "direction": None}, "fold_bn": False})
    assert session.dirty and session.needs_rebuild
    settings = session.project.settings
    assert settings["rules"]["residual"] is False and settings["fold_bn"] is False
    assert settings["metric"]["name"] == "top1" and session.metric().name == "top-1 accuracy"
    assert "block.add" not in session.project.layers  # the functional add is gone with its setting
    rebuilt = session.quantized_model()
    assert rebuilt is not model and session.folded_layers() == {}


def test_an_unchanged_value_changes_nothing(session):
    session.set_settings({"device": "cpu", "fold_bn": session.project.settings["fold_bn"]})
    assert not session.dirty and not session.needs_rebuild


def test_a_user_metric_needs_its_direction_and_a_valid_form(session):
    with pytest.raises(SessionError, match="higher or a lower"):
        session.set_setting("metric", {"name": "scores.py:map50", "direction": None})
    session.set_setting("metric", {"name": "scores.py:map50", "direction": "higher"})  # not imported here
    assert session.project.settings["metric"] == {"name": "scores.py:map50", "direction": "higher"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_is_refused_without_a_cuda_device(session):
    with pytest.raises(SessionError, match="no CUDA device"):
        session.set_settings({"device": "cuda"})
    assert session.project.settings["device"] == "cpu" and str(session.device) == "cpu"


def test_apply_ignore_policy_with_and_without_quantizing_the_others(session):
    session.set_quantize(["stem.0"], False)
    assert session.apply_ignore_policy(["fc", "head"], quantize_others=False) == ["head_pool", "fc"]
    float_layers = {name for name, d in session.project.layers.items() if not d.quantize}
    assert float_layers == {"stem.0", "head_pool", "fc"}  # stem.0 was left as it was
    assert session.apply_ignore_policy([r"block\.", ""], quantize_others=True) == \
        [name for name in session.project.layers if name.startswith("block.")]
    float_layers = {name for name, d in session.project.layers.items() if not d.quantize}
    assert float_layers == {name for name in session.project.layers if name.startswith("block.")}
    assert session.dirty and session.needs_rebuild
    assert {view.name for view in session.layers() if not view.quantize} == float_layers


def test_apply_ignore_policy_refuses_and_changes_nothing(session):
    decisions = {name: d.quantize for name, d in session.project.layers.items()}
    with pytest.raises(SessionError, match="at least one pattern"):
        session.apply_ignore_policy(["", ""], quantize_others=True)
    with pytest.raises(SessionError, match="No quantizable layer matches 'nothing_like_this'"):
        session.apply_ignore_policy(["fc", "nothing_like_this"], quantize_others=True)
    with pytest.raises(SessionError, match="conv\\["):
        session.apply_ignore_policy(["conv["], quantize_others=False)
    assert {name: d.quantize for name, d in session.project.layers.items()} == decisions and not session.dirty


def test_descriptor_fields_are_stored_as_plain_json(session, tmp_path):
    import numpy as np

    session.set_descriptor(["fc"], "weight", axis=np.int64(0), narrow_range=np.bool_(True))
    stored = session.project.layers["fc"].weight_desc
    assert stored["axis"] == 0 and type(stored["axis"]) is int and stored["narrow_range"] is True
    reopened = Session.open(session.save(tmp_path / "json.qwb"))
    assert reopened.project.layers["fc"].weight_desc == stored


def test_the_session_reads_typed_settings_that_follow_every_edit(session):
    assert session.settings.calibration.num_batches == 16 and session.settings.rules.maxpool is True
    session.update_setting("calibration", num_batches=3)  # the other fields as they were
    assert session.settings.calibration == CalibrationSettings(num_batches=3)
    assert session.project.settings["calibration"] == {"method": "auto", "num_batches": 3, "percentile": 99.99}
    session.set_setting("rules", {"maxpool": False})  # a partial mapping: the others take their defaults
    assert session.settings.rules == RuleSettings(maxpool=False)
    with pytest.raises(SessionError, match="rules has no 'sideways'"):
        session.update_setting("rules", sideways=True)
    with pytest.raises(SessionError, match="'output' is not a setting with fields"):
        session.update_setting("output", name="logits")


def test_an_older_partial_setting_reads_with_defaults_and_its_equal_value_changes_nothing(saved, tmp_path):
    project = load_project(saved)
    project.settings["export"] = {"opset": 13}  # as a file written before the other fields existed
    path = tmp_path / "old.qwb"
    save_project(project, path)
    opened = Session.open(path)
    assert opened.settings.export == ExportSettings(opset=13) and opened.default_export_path().name == "old.qdq.onnx"
    opened.set_setting("export", ExportSettings(opset=13).to_stored())
    assert not opened.dirty and opened.project.settings["export"] == {"opset": 13}
