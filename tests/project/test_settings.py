"""The project's settings, typed and checked below the session: the error they raise is the project layer's own,
and the JSON they store is what project files always held."""
import dataclasses
import json
import sqlite3

import pytest

from workbench.analysis import BUILTIN_METRICS
from workbench.project import Project, ProjectError, load_project, save_project
from workbench.project.settings import (
    DEFAULT_SETTINGS,
    DEFAULTS,
    FUNCTIONAL_SWITCHES,
    RULES,
    SECTIONS,
    CalibrationSettings,
    ProjectSettings,
    RuleSettings,
    SettingsError,
    checked_setting,
    jsonable,
    make_descriptor,
)
from workbench.quant.calib import AmaxMethod
from workbench.sources.metric_names import DEFAULT_METRIC, Direction
from workbench.sources.model_source import ModelSpec


def test_every_default_passes_its_own_check():
    for key, value in DEFAULT_SETTINGS.items():
        assert checked_setting(key, value) == value


@pytest.mark.parametrize("key, value, message", [
    ("calibration", {"method": "entropy", "percentile": 0}, "percentile is a number in (0, 100]"),
    ("metric", {"name": "", "direction": None}, "metric.name is the name of a built-in metric"),
    ("pins", "conv1", "pairs of quantizer or layer names"),
    ("colour", "blue", "Unknown setting 'colour'"),
])
def test_a_bad_value_raises_settings_error_naming_it(key, value, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        checked_setting(key, value)


def test_checked_value_is_a_copy_and_pins_become_lists():
    value = {"add": True, "concat": False}
    checked = checked_setting("functional", value)
    checked["add"] = False
    assert value["add"] is True
    assert checked_setting("pins", (("a", "b"),)) == [["a", "b"]]


def test_stored_descriptor_fields_make_the_descriptor():
    descriptor = make_descriptor({"num_bits": 8, "axis": [0], "calib_method": "histogram"})
    assert descriptor.axis == 0 and descriptor.calib_method == "histogram"
    assert make_descriptor(None) is None
    assert jsonable({"axis": (1, 2), "x": float("inf")}) == {"axis": [1, 2], "x": "inf"}


# the settings a new project stored before they were typed, byte for byte (the project file's JSON); since
# issue 24 a new project's calibration method is "auto" (an older project keeps the method its file has)
STORED_BEFORE_TYPING = (
    '{"defaults": {"input": {"calib_method": "histogram"}, "weight": null}, '
    '"functional": {"add": true, "concat": true, '
    '"matmul": true, "attention": true, "residual_adds_in_transformer_blocks": false}, "rules": {"concat": true, '
    '"maxpool": true, "residual": true}, "pins": [], "calibration": {"method": "auto", "num_batches": 16, '
    '"percentile": 99.99}, "metric": {"name": "sqnr", "direction": null}, "export": {"path": null, "opset": 17, '
    '"dynamic_batch": true, "amax_json": false, "calibration_cache": false}, "device": "cpu", "output": null, '
    '"fold_bn": true, "finetune": {"epochs": 2, "lr": 0.0001, "optimizer": "sgd", "schedule": "cosine", '
    '"momentum": 0.9, "weight_decay": 0.0, "loss": "cross_entropy", "learn_amax": [], "steps_per_epoch": null, '
    '"amp": null}}')


def test_typed_defaults_store_the_json_projects_always_held():
    assert json.dumps(ProjectSettings().to_stored()) == STORED_BEFORE_TYPING
    assert DEFAULT_SETTINGS == json.loads(STORED_BEFORE_TYPING)
    stored = json.loads(STORED_BEFORE_TYPING)
    stored.update(pins=[["a", "b"]], output="logits", metric={"name": "m.py:f", "direction": "lower"},
                  finetune={**stored["finetune"], "learn_amax": ["conv.*"], "amp": True})
    settings = ProjectSettings.from_stored(stored)
    assert json.dumps(settings.to_stored()) == json.dumps(stored)  # read and written back: the same bytes
    assert settings.pins == (("a", "b"),) and settings.finetune.learn_amax == ("conv.*",)
    assert settings.metric.direction is Direction.LOWER and settings.metric.direction == "lower"
    assert settings.calibration.method is AmaxMethod.AUTO
    # a project that stored entropy (every project saved before auto existed) keeps it
    old = ProjectSettings.from_stored({"calibration": {"method": "entropy", "num_batches": 16, "percentile": 99.99}})
    assert old.calibration.method is AmaxMethod.ENTROPY


def test_an_older_file_missing_settings_and_fields_reads_with_defaults():
    settings = ProjectSettings.from_stored({"rules": {"maxpool": False}, "calibration": {"method": "mse"},
                                            "export": {"opset": None}})
    assert settings.rules == RuleSettings(concat=True, maxpool=False, residual=True)
    assert settings.calibration == CalibrationSettings(method=AmaxMethod.MSE, num_batches=16, percentile=99.99)
    assert settings.export.opset == 17 and settings.fold_bn is True and settings.metric.name == "sqnr"
    assert dataclasses.replace(settings, fold_bn=False).fold_bn is False and settings.fold_bn is True


@pytest.mark.parametrize("stored, message", [
    ({"calibration": {"num_batches": 0}}, "calibration.num_batches is a positive number or none (all batches), got 0"),
    ({"export": {"dynamic_batch": "yes"}}, "export.dynamic_batch is true or false, got 'yes'"),
    ({"finetune": {"lr": -1}}, "finetune.lr is a positive number, got -1"),
    ({"finetune": {"learn_amax": [3]}}, "finetune.learn_amax is a list of quantizer name patterns, got [3]"),
    ({"functional": {"matmul": 1}}, "functional.matmul is true or false, got 1"),
    ({"output": ""}, "output is the name of an output entry"),
    ({"device": "tpu"}, "not a device"),
    ({"metric": "sqnr"}, "metric is a mapping of name, direction, got 'sqnr'"),
])
def test_from_stored_names_the_setting_the_field_and_what_is_expected(stored, message):
    with pytest.raises(SettingsError) as error:
        ProjectSettings.from_stored(stored)
    assert message in str(error.value)


def test_the_typed_settings_cannot_be_changed_in_place_and_edits_are_checked():
    settings = ProjectSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.calibration.num_batches = 3
    with pytest.raises(SettingsError, match="did you mean 99.9"):
        dataclasses.replace(settings.calibration, percentile=0.999)
    assert dataclasses.replace(settings.calibration, percentile=99.9).percentile == 99.9


def test_every_front_end_list_comes_from_the_dataclasses():
    assert list(FUNCTIONAL_SWITCHES) == list(DEFAULT_SETTINGS["functional"])
    assert RULES == ("concat", "maxpool", "residual") and list(SECTIONS) == [
        key for key, value in DEFAULT_SETTINGS.items() if isinstance(value, dict)]
    assert ProjectSettings.keys() == tuple(DEFAULT_SETTINGS)
    assert DEFAULTS.metric.name == DEFAULT_METRIC and DEFAULT_METRIC in BUILTIN_METRICS


def test_a_file_with_a_bad_setting_is_refused_naming_the_file_and_the_setting(tmp_path):
    path = tmp_path / "p.qwb"
    project = Project(name="p", model=ModelSpec("demo", "digits"), settings={"rules": {"concat": True}})
    save_project(project, path)
    assert load_project(path).settings == {"rules": {"concat": True}}  # stored as it was, read with defaults
    with sqlite3.connect(path) as db:
        db.execute("UPDATE settings SET value = ? WHERE key = 'rules'", ['{"concat": "often"}'])
    with pytest.raises(ProjectError, match=r"p\.qwb: table settings, setting 'rules': .*rules\.concat is true or "
                                           r"false, got 'often'"):
        load_project(path)
