"""``hf:DIR`` opened without reading its weights (issue 37 point 2): the module tree on meta, each weight read from
the safetensors checkpoint (one file or shards with an index) when a job needs it, with the same tree, weights,
amax and exported file as transformers' eager load."""
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.cli_run import run
from tests.transformers.checkpoints import new_project
from workbench.sources import model_source
from workbench.sources.errors import SourceError
from workbench.sources.model_source import ModelSpec, load_model

pytest.importorskip("accelerate")
HERE = Path(__file__).resolve().parent


def _llama(tmp_path: Path, sharded: bool, dtype: torch.dtype = torch.bfloat16) -> Path:
    sys.path.insert(0, str(HERE))
    import models

    torch.manual_seed(0)
    folder = tmp_path / ("llama-shards" if sharded else "llama")
    extra = {"max_shard_size": "20KB"} if sharded else {}
    models.hf_llama().to(dtype).save_pretrained(folder, safe_serialization=True, **extra)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    return folder


@pytest.fixture(autouse=True)
def lazy_always(monkeypatch):
    """These checkpoints are tiny: by default (``auto``) only large ones open lazily."""
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")


@pytest.fixture(params=[False, True], ids=["single-file", "sharded"])
def folder(request, tmp_path):
    folder = _llama(tmp_path, request.param)
    assert (folder / "model.safetensors.index.json").is_file() == request.param
    return folder


@pytest.fixture
def eager(monkeypatch):
    """Opens hf: folders as before: transformers' from_pretrained reads every weight."""
    def use_eager():
        monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "never")
    return use_eager



def test_new_and_open_leave_every_weight_on_meta(folder, tmp_path, capsys):
    project = new_project(capsys, tmp_path, folder)
    from workbench.session import Session

    session = Session.open(project)
    assert session._loaded.checkpoint is not None
    float_params = list(session.float_model.parameters())
    assert float_params and all(p.is_meta for p in float_params)  # none read by new, open or the build
    assert all(p.is_meta for p in session.quantized_model().parameters())
    rotary = session.float_model.model.rotary_emb.inv_freq
    assert not rotary.is_meta and torch.isfinite(rotary).all()  # buffers computed by __init__ stay real


def test_show_prints_the_eager_tree_and_digest(folder, tmp_path, capsys, eager):
    from workbench.session import Session

    lazy = new_project(capsys, tmp_path, folder, "lazy.qwb")
    lazy_show = run(capsys, "show", lazy, "--json")
    lazy_digest = Session.open(lazy).weights_digest
    eager()
    eager_project = new_project(capsys, tmp_path, folder, "eager.qwb")
    eager_show = run(capsys, "show", eager_project, "--json")
    assert lazy_show[0] == eager_show[0] == 0
    lazy_data, eager_data = json.loads(lazy_show[1]), json.loads(eager_show[1])
    for key in ("name", "path", "file_revision"):
        lazy_data.pop(key, None)
        eager_data.pop(key, None)
    assert lazy_data == eager_data  # same tree, layers, functional report and placement
    assert Session.open(eager_project).weights_digest == lazy_digest  # a calibration is not flagged "other weights"


def test_load_and_release_give_the_eager_weights(folder, eager):
    spec = ModelSpec("hf", str(folder))
    lazy = load_model(spec, lazy=True)
    read_all = dict(load_model(spec).model.named_parameters())  # lazy=False: built on meta, then all read
    eager()
    reference = dict(load_model(spec).model.named_parameters())
    assert all(torch.equal(read_all[name].view(torch.int16), p.view(torch.int16)) for name, p in reference.items())
    checkpoint = lazy.checkpoint
    layers = lazy.model.model.layers
    for index, block in enumerate(layers):
        name = f"model.layers.{index}"
        checkpoint.load(name, block)
        for key, parameter in block.named_parameters():
            expected = reference[f"{name}.{key}"]
            assert parameter.dtype == expected.dtype == torch.bfloat16
            assert torch.equal(parameter.view(torch.int16), expected.view(torch.int16))  # bit-identical
        assert all(p.is_meta for p in layers[1 - index].parameters())  # only the block asked for
        checkpoint.release(name, block)
        assert all(p.is_meta for p in block.parameters())


def test_release_keeps_quantizer_amax(folder, tmp_path, capsys):
    project = new_project(capsys, tmp_path, folder)
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    from workbench.session import Session

    session = Session.open(project)
    model = session.quantized_model()
    block = model.model.layers[0]
    amax = {n: b.clone() for n, b in block.named_buffers() if n.endswith("_amax")}
    assert amax
    session._loaded.checkpoint.load("model.layers.0", block)
    session._loaded.checkpoint.release("model.layers.0", block)
    assert all(p.is_meta for p in block.parameters())
    after = dict(block.named_buffers())
    assert all(torch.equal(after[n], value) for n, value in amax.items())


def test_new_calibrate_export_as_the_eager_load(folder, tmp_path, capsys, eager):
    results = {}
    for mode in ("lazy", "eager"):
        if mode == "eager":
            eager()
        project = new_project(capsys, tmp_path, folder, f"{mode}.qwb")
        assert run(capsys, "set", project, "--type", "Linear", "--precision", "int8")[0] == 0
        code, _, err = run(capsys, "calibrate", project, "--method", "max")
        assert code == 0, err
        output = tmp_path / f"{mode}.onnx"
        code, out, err = run(capsys, "export", project, "-o", output)
        assert code == 0, err
        from workbench.project import load_project

        quantizers = load_project(project).current_calibration.quantizers
        results[mode] = ({name: np.asarray(q.amax) for name, q in quantizers.items()}, onnx.load(output))
    (lazy_amax, lazy_file), (eager_amax, eager_file) = results["lazy"], results["eager"]
    assert lazy_amax.keys() == eager_amax.keys() and lazy_amax
    assert all(np.array_equal(lazy_amax[n], eager_amax[n]) for n in lazy_amax)  # bit-identical amax
    assert lazy_file.graph == eager_file.graph  # the same nodes and initializers, byte for byte


def test_missing_shard_names_the_file(tmp_path, capsys):
    folder = _llama(tmp_path, sharded=True)
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    code, _, err = run(capsys, "new", tmp_path / "p.qwb", "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits")
    assert code != 0
    assert f"{shard}: shard missing" in err and "Traceback" not in err
    assert not (tmp_path / "p.qwb").exists()


def test_corrupt_shard_names_the_file(tmp_path):
    folder = _llama(tmp_path, sharded=True)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated: its header claims more than is there
    with pytest.raises(SourceError, match=f"{shard}: not a readable safetensors file"):
        load_model(ModelSpec("hf", str(folder)))


def test_tensor_missing_from_the_index_is_named(tmp_path):
    folder = _llama(tmp_path, sharded=True)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    index.write_text(json.dumps(data))
    with pytest.raises(SourceError, match=r"index.json: has no tensor model.layers.1.mlp.up_proj.weight, a weight "
                                          r"of LlamaForCausalLM"):
        load_model(ModelSpec("hf", str(folder)))


def test_index_placing_a_tensor_in_the_wrong_shard_is_named(tmp_path):
    folder = _llama(tmp_path, sharded=True)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    key = "model.embed_tokens.weight"
    other = next(name for name in sorted(set(data["weight_map"].values())) if name != data["weight_map"][key])
    data["weight_map"][key] = other
    index.write_text(json.dumps(data))
    with pytest.raises(SourceError, match=f"{other}: holds no tensor {key}, which the index"):
        load_model(ModelSpec("hf", str(folder)))


def test_streamed_forward_holds_about_one_block(folder, eager, monkeypatch):
    spec = ModelSpec("hf", str(folder))
    lazy = load_model(spec, lazy=True)
    checkpoint, model = lazy.checkpoint, lazy.model
    ids = torch.from_numpy(np.load(folder.parent / "ids.npy"))[:2]
    resident = []
    load = checkpoint._load

    def counting(parameters):
        load(parameters)
        resident.append(sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta))
    monkeypatch.setattr(checkpoint, "_load", counting)
    with torch.no_grad(), checkpoint.streamed(model):
        logits = model(input_ids=ids).logits
    assert all(p.is_meta for p in model.parameters())  # all back on meta afterwards
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert resident and max(resident) <= checkpoint.budget(model) < total
    eager()
    with torch.no_grad():
        expected = load_model(spec).model(input_ids=ids).logits
    assert torch.equal(logits, expected)  # the same numbers as the model held whole


def test_smoothed_project_opens_with_the_eager_weights(tmp_path, capsys, eager):
    """SmoothQuant folds its scales into new weights at build time: a lazily opened model keeps them on meta (each
    computed from the checkpoint when its block is loaded) and computes them all once a job reads every weight."""
    folder = _llama(tmp_path, sharded=False)
    from workbench.session import Session

    weights = {}
    for mode in ("lazy", "eager"):
        if mode == "eager":
            eager()
        project = new_project(capsys, tmp_path, folder, f"{mode}.qwb")
        code, _, err = run(capsys, "calibrate", project, "--method", "max", "--smoothquant", "0.5")
        assert code == 0, err
        session = Session.open(project)
        if mode == "lazy":
            assert session.quantized_model().model.layers[0].self_attn.q_proj.weight.is_meta
            session.evaluate()  # a job that reads every weight
        model = session.quantized_model()
        weights[mode] = {n: p for n, p in model.named_parameters()}
    assert weights["lazy"].keys() == weights["eager"].keys()
    assert all(not p.is_meta and torch.equal(p, weights["eager"][n]) for n, p in weights["lazy"].items())


def test_sequential_calibration_reads_one_block_at_a_time_with_the_eager_amax(folder, tmp_path, capsys, eager,
                                                                               monkeypatch):
    """``calibrate --sequential`` on a lazily opened checkpoint (issue 37 points 2 + 3): each decoder block's weights
    are read when it runs and released after it, never two blocks at once, and every amax equals the eager
    whole-model run's."""
    from workbench.project import load_project
    from workbench.sources.lazy_checkpoint import LazyCheckpoint

    lazy = new_project(capsys, tmp_path, folder, "lazy.qwb")
    assert run(capsys, "set", lazy, "--type", "Linear", "--precision", "int8")[0] == 0
    resident: set[str] = set()  # the decoder blocks whose weights are in memory
    most = []
    load, release = LazyCheckpoint.load, LazyCheckpoint.release

    def watched_load(self, name, module):
        load(self, name, module)
        if name.startswith("model.layers."):
            resident.add(name)
            most.append(len(resident))
        assert not any(p.is_meta for p in module.parameters())

    def watched_release(self, name, module):
        release(self, name, module)
        resident.discard(name)
        assert all(p.is_meta for p in module.parameters())  # let go of, not held by a calibrator

    monkeypatch.setattr(LazyCheckpoint, "load", watched_load)
    monkeypatch.setattr(LazyCheckpoint, "release", watched_release)
    code, _, err = run(capsys, "calibrate", lazy, "--method", "max", "--sequential")
    assert code == 0, err
    # two blocks, each read for the collecting walk and again for the output SQNR's, alone, and released after
    assert len(most) == 4 and max(most) == 1 and not resident
    lazy_amax = load_project(lazy).current_calibration.quantizers
    monkeypatch.undo()
    eager()
    whole = new_project(capsys, tmp_path, folder, "eager.qwb")
    assert run(capsys, "set", whole, "--type", "Linear", "--precision", "int8")[0] == 0
    assert run(capsys, "calibrate", whole, "--method", "max")[0] == 0
    eager_amax = load_project(whole).current_calibration.quantizers
    assert lazy_amax.keys() == eager_amax.keys() and lazy_amax
    assert all(np.array_equal(np.asarray(lazy_amax[n].amax), np.asarray(eager_amax[n].amax)) for n in lazy_amax)


def test_small_checkpoints_open_eagerly_by_default_and_a_bad_mode_is_named(tmp_path, monkeypatch):
    folder = _llama(tmp_path, sharded=False)
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "auto")
    loaded = load_model(ModelSpec("hf", str(folder)), lazy=True)
    assert loaded.checkpoint is None and not any(p.is_meta for p in loaded.model.parameters())
    monkeypatch.setattr(model_source, "LAZY_OPEN_BYTES", 1)  # as a checkpoint over the size would
    assert load_model(ModelSpec("hf", str(folder)), lazy=True).checkpoint is not None
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "sometimes")
    with pytest.raises(SourceError, match="WORKBENCH_LAZY_OPEN='sometimes': expected one of auto, always, never"):
        load_model(ModelSpec("hf", str(folder)), lazy=True)


def test_tied_output_weights_open_lazily(tmp_path, capsys):
    """GPT-2 ties lm_head to the token embeddings; its checkpoint holds the embeddings only."""
    sys.path.insert(0, str(HERE))
    import models

    torch.manual_seed(0)
    folder = tmp_path / "gpt2"
    models.hf_gpt2().save_pretrained(folder, safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    loaded = load_model(ModelSpec("hf", str(folder)), lazy=True)
    assert loaded.checkpoint is not None and loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    project = new_project(capsys, tmp_path, folder)
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
