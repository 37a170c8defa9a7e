"""A descriptor edit changes the live quantized model in place (no rebuild), with exactly the state a rebuild
gives: the same descriptors, amax, stale quantizers and outputs, on a tiny BERT and on the demo CNN."""
from __future__ import annotations

import pytest
import torch
from bert_project import bert_specs

from workbench.quant.algorithms.snapshot import quantizer_names
from workbench.session import Session
from workbench.session.build import descriptor_of
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def _state(model):
    # a quantizer switched off (its layer went to float in place) computes nothing: a rebuild has none there
    return {name: (descriptor_of(q), None if getattr(q, "_amax", None) is None else q._amax.clone())
            for name, q in quantizer_names(model).items() if q.is_enabled or not q.enabled_by_descriptor}


def _same_as_rebuild(session: Session, inputs) -> None:
    """The in-place model equals a model built afresh from the same project."""
    live = session.quantized_model()
    live_state, live_stale = _state(live), sorted(session.build_report.stale)
    with torch.no_grad():
        got = live(**inputs) if isinstance(inputs, dict) else live(inputs)
    session._invalidate()  # the reference: a full rebuild
    rebuilt = session.quantized_model()
    assert rebuilt is not live
    rebuilt_state = _state(rebuilt)
    assert live_state.keys() == rebuilt_state.keys()
    for name, (descriptor, amax) in live_state.items():
        assert descriptor == rebuilt_state[name][0], name
        other = rebuilt_state[name][1]
        assert (amax is None) == (other is None), name
        if amax is not None:
            assert torch.equal(amax, other), name
    assert live_stale == sorted(session.build_report.stale)
    with torch.no_grad():
        want = rebuilt(**inputs) if isinstance(inputs, dict) else rebuilt(inputs)
    got = got.logits if hasattr(got, "logits") else got
    want = want.logits if hasattr(want, "logits") else want
    assert torch.equal(got, want)


@pytest.fixture
def bert(tmp_path):
    model, data = bert_specs(tmp_path)
    session = Session.create(model, data, base_dir=tmp_path)
    session.calibrate(method="max")
    return session


def test_bert_descriptor_edits_swap_quantizers_without_a_rebuild(bert):
    session = bert
    model = session.quantized_model()
    query = "bert.encoder.layer.0.attention.self.query"
    old = model.get_submodule(query)._input_quantizer
    batch = session.sample_inputs(batch=2)

    # another calibrator than the one calibrated: the new quantizer is stale until calibrated again
    assert session.set_descriptor([query], "input", calib_method="max")
    assert not session.needs_rebuild and session.quantized_model() is model
    swapped = model.get_submodule(query)._input_quantizer
    assert swapped is not old and "calib_method" not in descriptor_of(swapped)
    assert f"{query}._input_quantizer" in session.build_report.stale
    _same_as_rebuild(session, batch)

    # several layers, the weight role, back to what was calibrated: amax comes back
    model = session.quantized_model()
    dense = "bert.encoder.layer.1.output.dense"
    assert session.set_descriptor([query], "input", calib_method="histogram") == [query]
    assert session.set_descriptor([query, dense], "weight", num_bits=6)
    assert not session.needs_rebuild and session.quantized_model() is model
    assert f"{query}._input_quantizer" not in session.build_report.stale
    assert float(model.get_submodule(query)._input_quantizer._amax) == pytest.approx(float(old._amax))
    assert model.get_submodule(dense)._weight_quantizer.num_bits == 6
    _same_as_rebuild(session, batch)


def test_attention_products_and_shared_quantizers_still_rebuild(bert):
    session = bert
    model = session.quantized_model()
    products = [name for name, layer in session.project.layers.items() if layer.type == "QuantMatMul"
                or "attention" in layer.type.lower() and "matmul" in name]
    product = products[0] if products else next(n for n, layer in session.project.layers.items()
                                                  if "Linear" not in layer.type)
    # a real edit (the project's default is histogram): setting the values it has is no edit at all
    assert session.set_descriptor([product], "input", num_bits=8, calib_method="max") == [product]
    assert session.needs_rebuild  # a functional layer's quantizers come from the fx rewrite: rebuilt
    assert session.quantized_model() is not model


def test_demo_cnn_in_place_with_folded_batchnorm(tmp_path):
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=32, num_batches=2), base_dir=tmp_path)
    session.calibrate(method="max")
    model = session.quantized_model()
    convs = [n for n, layer in session.project.layers.items() if layer.type == "Conv2d"]
    assert session.set_descriptor(convs[:2], "weight", axis=None)
    assert session.quantized_model() is model
    _same_as_rebuild(session, session.sample_inputs(batch=4))
