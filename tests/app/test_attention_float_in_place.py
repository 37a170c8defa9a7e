"""Issue 36 round 3, the GPT-2 run: an attention layer set to float still rebuilt the whole quantized model on Apply
(2.2 s), where a linear layer goes to float in place. An attention (the QuantHFAttention of a Hugging Face attention
module, eager or sdpa) now goes to float and back in place too: its query, key, value and probabilities quantizers
off (on), the model's modules kept, with the outputs, amax and stale quantizers of a rebuild; back on after a
calibration that did not see it, it is rebuilt (only a rebuild gives it no range)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from bert_project import bert_specs  # noqa: E402
from test_in_place_edit import _same_as_rebuild  # noqa: E402

from workbench.quant.algorithms.snapshot import quantizer_names  # noqa: E402
from workbench.session import Session  # noqa: E402
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402


def _gpt2_specs(tmp_path, attn: str):
    import transformers

    config = transformers.GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=0,
                                     eos_token_id=0, use_cache=False, attn_implementation=attn)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(tmp_path / "gpt2")
    ids = np.random.default_rng(0).integers(0, 60, size=(8, 12)).astype(np.int64)
    np.savez(tmp_path / "tokens.npz", input_ids=ids)
    return ModelSpec("hf", str(tmp_path / "gpt2")), DataSpec("tensors", str(tmp_path / "tokens.npz"), batch_size=4,
                                                            num_batches=2)


@pytest.fixture(params=["bert-eager", "gpt2-sdpa"])
def session(request, tmp_path):
    model, data = bert_specs(tmp_path) if request.param == "bert-eager" else _gpt2_specs(tmp_path, "sdpa")
    session = Session.create(model, data, base_dir=tmp_path)
    session.calibrate(method="max")
    return session


def _attentions(session):
    from workbench.quant.nn.modules.quant_attention import QuantSDPA

    model = session.quantized_model()
    return [name for name in session.project.layers if isinstance(model.get_submodule(name), QuantSDPA)]


def test_attention_to_float_and_back_in_place_gives_a_rebuilds_model(session):
    attention = _attentions(session)[0]
    batch = session.sample_inputs(batch=2)
    model = session.quantized_model()
    modules = dict(model.named_modules())
    own = [name for name in quantizer_names(model) if name.startswith(attention + ".")]
    assert len(own) == 4  # query, key, value, probabilities

    assert session.set_precision([attention], "float") == [attention]
    assert not session.needs_rebuild and session.quantized_model() is model
    assert all(dict(model.named_modules())[name] is module for name, module in modules.items())
    assert not any(quantizer_names(model)[name].is_enabled for name in own)
    _same_as_rebuild(session, batch)  # the same outputs as the model rebuilt with the attention in float

    model = session.quantized_model()  # (rebuilt: the attention has no quantizers now)
    assert session.set_precision([attention], "int8") == [attention]
    assert session.needs_rebuild  # nothing to switch back on: rebuilt
    _same_as_rebuild(session, batch)

    model = session.quantized_model()
    assert session.set_precision([attention], "float") == [attention]
    assert session.set_precision([attention], "int8") == [attention]
    assert not session.needs_rebuild and session.quantized_model() is model  # off and on again, in place
    assert all(quantizer_names(model)[name].is_enabled for name in own)
    _same_as_rebuild(session, batch)  # the ranges restored from the calibration, as a rebuild restores them


def test_attention_back_on_after_a_calibration_without_it_is_rebuilt(session):
    attention = _attentions(session)[0]
    batch = session.sample_inputs(batch=2)
    model = session.quantized_model()
    assert session.set_precision([attention], "float") == [attention]
    session.calibrate(method="max")  # the attention is float: this calibration holds no range for it
    assert session.quantized_model() is model
    assert not any(name.startswith(attention + ".") for name in session.project.current_calibration.quantizers)
    assert session.set_precision([attention], "int8") == [attention]
    assert session.needs_rebuild  # in place it would keep the range of the calibration before
    _same_as_rebuild(session, batch)


def test_attention_to_float_in_the_window_runs_no_model_update(window, qtbot, tmp_path):
    """In the app: the attention's precision set to float (the tree's precision menu calls the controller so) is
    done at once, with no "Updating the quantized model" job, and the tree shows it in float."""
    pytest.importorskip("PySide6")
    from window_waits import settle

    from workbench.app.tree_model import PRECISION

    model, data = bert_specs(tmp_path)
    controller = window.controller
    with qtbot.waitSignal(controller.session_changed, timeout=120000):
        assert controller.new_project(model, data, base_dir=tmp_path)
    settle(window, qtbot)
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        controller.calibrate(method="max")
    settle(window, qtbot)
    live = controller.session.quantized_model()
    attention = next(name for name in controller.session.project.layers if name.endswith(".sdpa"))
    jobs = []
    controller.busy_changed.connect(lambda busy: jobs.append(controller.jobs.job_name) if busy else None)
    assert controller.set_precision([attention], "float") is not None
    assert not controller.busy  # no model update job
    settle(window, qtbot)
    assert jobs == [] and controller.session.quantized_model() is live
    assert window.tree.model.text(attention, PRECISION) == "float"
