"""reset_descriptor and set_precision change the live quantized model in place (no rebuild) where that gives the
model a rebuild would, on a tiny BERT and on the demo CNN (folded BatchNorm): the same descriptors, amax, stale
quantizers, outputs on a batch and ``workbench show --json``; a plain layer to or from float too."""
from __future__ import annotations

import json

import pytest
from bert_project import bert_specs
from test_in_place_edit import _same_as_rebuild

import workbench.session.edits as session_edits
import workbench.session.reading as session_reading
from workbench.session import Session, jsonable
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def _show_json(session: Session) -> str:
    """What ``workbench show --json`` prints of the session (summary and layer table)."""
    layers = session.layers()
    summary = session.summary(layers)
    summary["layer_table"] = [layer.__dict__ for layer in layers]
    return json.dumps(jsonable(summary), sort_keys=True, default=str)


def _equals_rebuild(session: Session, batch) -> None:
    shown = _show_json(session)
    _same_as_rebuild(session, batch)  # ends with the model rebuilt from the project
    assert _show_json(session) == shown


@pytest.fixture
def builds(monkeypatch):
    """How many times the session builds a quantized model from the project."""
    calls = []
    real = session_reading.build_quantized

    def counting(*args, **kwargs):
        calls.append(kwargs.get("with_decisions", True))
        return real(*args, **kwargs)

    # the live model is built on reading it (reading.py); new layers are synced by an edit (edits.py)
    for module in (session_reading, session_edits):
        monkeypatch.setattr(module, "build_quantized", counting)
    return calls


@pytest.fixture
def bert(tmp_path):
    model, data = bert_specs(tmp_path)
    session = Session.create(model, data, base_dir=tmp_path)
    session.calibrate(method="max")
    return session


def _linears(session: Session) -> list[str]:
    return [name for name, layer in session.project.layers.items() if layer.type == "Linear"]


def test_bert_reset_descriptor_in_place(bert, builds):
    session = bert
    query, dense = _linears(session)[0], _linears(session)[-1]
    batch = session.sample_inputs(batch=2)
    session.set_descriptor([query, dense], "weight", num_bits=6)
    session.set_descriptor([query], "input", calib_method="histogram")
    model = session.quantized_model()
    assert session.build_report.stale  # edited: not calibrated with these descriptors
    builds.clear()

    assert session.reset_descriptor([query, dense]) == [query, dense]
    assert builds == [] and not session.needs_rebuild and session.quantized_model() is model
    assert session.project.layers[query].input_desc is None and session.project.layers[dense].weight_desc is None
    assert model.get_submodule(dense)._weight_quantizer.num_bits == 8
    # back to the descriptors calibrated: their amax is restored, nothing is stale
    assert session.build_report.stale == []
    _equals_rebuild(session, batch)

    # one role only, on a layer whose default the project changed: the project's default, as a rebuild gives
    session.set_setting("defaults", {"input": None, "weight": {"num_bits": 8, "axis": None}})
    model = session.quantized_model()
    session.set_descriptor([dense], "weight", num_bits=6, axis=0)
    builds.clear()
    assert session.reset_descriptor([dense], "weight") == [dense]
    assert builds == [] and session.quantized_model() is model
    assert model.get_submodule(dense)._weight_quantizer.axis is None
    _equals_rebuild(session, batch)


def test_bert_set_precision_in_place_through_the_formats(bert, builds):
    session = bert
    # layers whose input features take INT4 blocks TensorRT builds (64 or 128): the tiny BERT's FFN outputs (64 in)
    modules = dict(session.quantized_model().named_modules())
    layers = [name for name in _linears(session) if modules[name].weight.shape[1] % 64 == 0][:3]
    assert len(layers) >= 2
    batch = session.sample_inputs(batch=2)
    for precision in ("fp8", "int4w", "int8"):
        model = session.quantized_model()
        builds.clear()
        assert session.set_precision(layers, precision) == layers
        assert builds == [] and not session.needs_rebuild and session.quantized_model() is model, precision
        assert {p.value for name, p in session.precisions(layers).items()} == {precision}
        _equals_rebuild(session, batch)
    # back in int8, the descriptors it was calibrated with: the calibration's amax is back on every quantizer
    assert session.build_report.stale == []


def test_precision_to_or_from_float_in_place(bert):
    """Issue 36 round 3, point 5: a plain layer to float and back switches its quantizers off and on in place (the
    model's modules kept), with the outputs, amax and ``workbench show --json`` of a rebuild."""
    session = bert
    layer = _linears(session)[0]
    batch = session.sample_inputs(batch=2)
    model = session.quantized_model()
    module = model.get_submodule(layer)
    assert session.set_precision([layer], "float") == [layer]
    assert not session.needs_rebuild and session.quantized_model() is model
    assert model.get_submodule(layer) is module and not module._input_quantizer.is_enabled
    _equals_rebuild(session, batch)  # (the session then holds the rebuilt model, the layer an nn.Linear)
    model = session.quantized_model()
    assert session.set_precision([layer], "int8") == [layer]
    assert session.needs_rebuild and session.quantized_model() is not model  # an original module: rebuilt
    _equals_rebuild(session, batch)
    model = session.quantized_model()
    assert session.set_precision([layer], "float") == [layer] and session.set_precision([layer], "int8") == [layer]
    assert not session.needs_rebuild and session.quantized_model() is model  # off and on again, in place
    _equals_rebuild(session, batch)


def test_demo_cnn_precision_and_reset_in_place_with_folded_batchnorm(tmp_path, builds):
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=32, num_batches=2), base_dir=tmp_path)
    session.calibrate(method="max")
    batch = session.sample_inputs(batch=4)
    convs = [n for n, layer in session.project.layers.items() if layer.type == "Conv2d"]
    assert session.folded_layers()  # the BatchNorms are folded: weight amax must follow the folded weights
    model = session.quantized_model()
    builds.clear()
    assert session.set_precision(convs[:2], "fp8") == convs[:2]
    assert builds == [] and session.quantized_model() is model
    _equals_rebuild(session, batch)

    model = session.quantized_model()
    session.set_descriptor(convs[:1], "weight", axis=None)
    builds.clear()
    assert session.reset_descriptor(convs[:2]) == convs[:2]
    assert builds == [] and session.quantized_model() is model
    _equals_rebuild(session, batch)
