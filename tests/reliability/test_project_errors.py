"""Item 4 (project file): a damaged project names the file, the table, the row and the layer."""
import sqlite3

import numpy as np
import pytest

from workbench.project import (
    CalibrationRecord,
    FinetuneRecord,
    LayerDecision,
    Project,
    ProjectError,
    QuantizerRecord,
    load_project,
    save_project,
)
from workbench.sources.model_source import ModelSpec


@pytest.fixture
def path(tmp_path):
    project = Project(name="p", model=ModelSpec("entrypoint", "net.py:make"))
    project.layers["conv"] = LayerDecision("conv", "Conv2d")
    project.layers["fc"] = LayerDecision("fc", "Linear", True, {"num_bits": 8}, None)
    run = CalibrationRecord(1, "t", "max", 99.9, 1, 0.1, "cpu")
    run.quantizers["fc._input_quantizer"] = QuantizerRecord("fc._input_quantizer", np.float32(1.5), "max",
                                                            "MaxCalibrator", descriptor={"num_bits": 8})
    project.calibrations.append(run)
    project.finetunes.append(FinetuneRecord(1, "t", {"epochs": 1},
                                            amax={"fc._input_quantizer": np.ones(1, np.float32)}))
    target = tmp_path / "p.qwb"
    save_project(project, target)
    return target


def tamper(path, statement, *params):
    connection = sqlite3.connect(path)
    connection.execute(statement, params)
    connection.commit()
    connection.close()


def error_of(path) -> str:
    with pytest.raises(ProjectError) as caught:
        load_project(path)
    text = str(caught.value)
    assert str(path) in text and "internal error" not in text
    return text


def test_json_that_does_not_parse_names_table_row_layer_and_column(path):
    tamper(path, "UPDATE layers SET input_desc = '{\"num_bits\": 8' WHERE name = 'fc'")
    text = error_of(path)
    assert "table layers" in text and "layer 'fc'" in text and "column input_desc is not valid JSON" in text
    assert "JSONDecodeError" not in text


@pytest.mark.parametrize("descriptor, detail", [
    ('{"num_bits": 99}', "num_bits"), ('{"calib_method": "magic"}', "calib_method"),
    ('{"bits": 8}', "bits"), ('[1, 2]', "mapping"),
])
def test_an_invalid_descriptor_names_file_and_layer(path, descriptor, detail):
    tamper(path, "UPDATE layers SET weight_desc = ? WHERE name = 'fc'", descriptor)
    text = error_of(path)
    assert "layer 'fc'" in text and "invalid weight descriptor" in text and detail in text


def test_a_missing_field_names_the_table_and_the_field(path):
    tamper(path, "UPDATE model_source SET input_spec = '{\"dtype\": \"float32\"}'")
    text = error_of(path)
    assert "table model_source" in text and "'shape'" in text and "KeyError" not in text


def test_a_wrong_number_names_the_run(path):
    tamper(path, "UPDATE calibration_runs SET num_batches = 'many'")
    text = error_of(path)
    assert "table calibration_runs, calibration run 1" in text


@pytest.mark.parametrize("value, word", [(-1.5, "negative"), (float("nan"), "NaN")])
def test_a_negative_or_nan_amax_is_reported_as_such(path, value, word):
    tamper(path, "UPDATE quantizer_stats SET amax = ?", np.float32(value).tobytes())
    text = error_of(path)
    assert word in text and "quantizer 'fc._input_quantizer'" in text and "calibration run 1" in text
    assert "do not fit the model" not in text


def test_a_negative_learned_amax_is_reported(path):
    tamper(path, "UPDATE finetune_tensors SET data = ? WHERE kind = 'amax'", np.float32([-2.0]).tobytes())
    text = error_of(path)
    assert "negative" in text and "fine-tune run 1" in text and "fc._input_quantizer" in text


def test_a_quantizer_of_a_missing_run_names_both(path):
    tamper(path, "UPDATE quantizer_stats SET run_id = 7")
    text = error_of(path)
    assert "calibration run 7" in text and "not stored" in text
