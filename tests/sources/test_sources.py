"""Model and data sources: each kind, the trust rule, and errors that name the file."""
import shutil
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from workbench.sources.data_source import DataSpec, ImageOptions, InputSpec, check_input, open_data
from workbench.sources.errors import SourceError, TrustRequired
from workbench.sources.model_source import ModelSpec, load_model

MODEL_CODE = textwrap.dedent("""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self, width=4):
            super().__init__()
            self.conv = nn.Conv2d(3, width, 3)
            self.fc = nn.Linear(width, 2)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))

    def make(width=4):
        return Tiny(width)

    def broken():
        raise RuntimeError("no GPU found")

    def not_a_model():
        return 42
""")


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "mymodel.py"
    path.write_text(MODEL_CODE)
    return path


class TestModelSources:
    def test_entrypoint_needs_trust(self, model_file):
        with pytest.raises(TrustRequired, match="--trust-code"):
            load_model(ModelSpec("entrypoint", f"{model_file}:make"))

    def test_entrypoint_with_kwargs_and_digest(self, model_file):
        loaded = load_model(ModelSpec("entrypoint", f"{model_file}:make", {"width": 6}), trust_code=True)
        assert loaded.model.conv.out_channels == 6 and not loaded.model.training
        assert loaded.digests[0].path == str(model_file) and len(loaded.digests[0].sha256) == 64

    def test_relative_entrypoint_and_module_form(self, model_file, tmp_path, monkeypatch):
        loaded = load_model(ModelSpec("entrypoint", "mymodel.py:make"), trust_code=True, base_dir=tmp_path)
        assert isinstance(loaded.model, nn.Module)
        loaded = load_model(ModelSpec("entrypoint", "mymodel:make"), trust_code=True, base_dir=tmp_path)
        assert type(loaded.model).__name__ == "Tiny"

    @pytest.mark.parametrize("target, message", [
        ("missing.py:make", "no such Python file"),
        ("{file}:nothing", "has no attribute 'nothing'"),
        ("{file}:broken", "raised RuntimeError: no GPU found"),
        ("{file}:not_a_model", "returned a int, not a torch.nn.Module"),
        ("no_such_module_xyz:make", "cannot be imported"),
    ])
    def test_entrypoint_errors(self, model_file, tmp_path, target, message):
        with pytest.raises(SourceError, match=message):
            load_model(ModelSpec("entrypoint", target.format(file=model_file)), trust_code=True, base_dir=tmp_path)

    def test_weights_pt_and_safetensors(self, model_file, tmp_path):
        from safetensors.torch import save_file

        reference = load_model(ModelSpec("entrypoint", f"{model_file}:make"), trust_code=True).model
        torch.save(reference.state_dict(), tmp_path / "w.pt")
        save_file(reference.state_dict(), str(tmp_path / "w.safetensors"))
        torch.save({"state_dict": reference.state_dict(), "epoch": 3}, tmp_path / "ckpt.pth")
        for weights in ("w.pt", "w.safetensors", "ckpt.pth"):
            spec = ModelSpec("entrypoint", f"{model_file}:make", weights=weights)
            loaded = load_model(spec, trust_code=True, base_dir=tmp_path)
            assert torch.equal(loaded.model.fc.weight, reference.fc.weight)
            assert len(loaded.digests) == 2

    def test_weights_that_do_not_fit_list_the_keys(self, model_file, tmp_path):
        torch.save({"conv.weight": torch.zeros(4, 3, 3, 3), "head.bias": torch.zeros(2),
                    "fc.weight": torch.zeros(2, 9)}, tmp_path / "bad.pt")
        spec = ModelSpec("entrypoint", f"{model_file}:make", weights=str(tmp_path / "bad.pt"))
        with pytest.raises(SourceError) as info:
            load_model(spec, trust_code=True)
        text = str(info.value)
        assert "bad.pt" in text and "missing keys" in text and "conv.bias" in text
        assert "unexpected keys (1): head.bias" in text and "fc.weight: file (2, 9) vs model (2, 4)" in text

    def test_weights_file_with_code_is_refused(self, model_file, tmp_path):
        torch.save({"model": nn.Linear(2, 2)}, tmp_path / "pickled.pt")
        spec = ModelSpec("entrypoint", f"{model_file}:make", weights=str(tmp_path / "pickled.pt"))
        with pytest.raises(SourceError, match="holds pickled Python objects"):
            load_model(spec, trust_code=True)

    def test_pickled_whole_model(self, model_file, tmp_path):
        code_dir = tmp_path / "code"
        code_dir.mkdir()
        (code_dir / "netdef.py").write_text(MODEL_CODE)
        import importlib.util
        import sys

        spec = importlib.util.spec_from_file_location("netdef", code_dir / "netdef.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["netdef"] = module
        spec.loader.exec_module(module)
        torch.save({"model": module.make(5), "epoch": 10}, tmp_path / "yolo_style.pt")
        del sys.modules["netdef"]
        with pytest.raises(TrustRequired):
            load_model(ModelSpec("pickle", str(tmp_path / "yolo_style.pt")))
        with pytest.raises(SourceError, match="code directory"):
            load_model(ModelSpec("pickle", str(tmp_path / "yolo_style.pt")), trust_code=True)
        loaded = load_model(ModelSpec("pickle", str(tmp_path / "yolo_style.pt"), code_dir=str(code_dir)),
                            trust_code=True)
        assert loaded.model.conv.out_channels == 5

    def test_pickle_of_something_else(self, tmp_path):
        torch.save({"a": torch.zeros(2)}, tmp_path / "sd.pt")
        with pytest.raises(SourceError, match="not a torch.nn.Module"):
            load_model(ModelSpec("pickle", str(tmp_path / "sd.pt")), trust_code=True)

    def test_demo_models_need_no_trust(self):
        loaded = load_model(ModelSpec("demo", "digits"))
        assert type(loaded.model).__name__ == "DigitsCNN"
        with pytest.raises(SourceError, match="unknown demo model"):
            ModelSpec("demo", "gpt5")

    def test_an_unknown_kind_is_refused_not_unpickled(self, tmp_path):
        torch.save(nn.Linear(2, 2), tmp_path / "model.pt")
        spec = ModelSpec("pickle", str(tmp_path / "model.pt"))
        spec.kind = "checkpoint"  # a spec changed after it was validated (a future kind, say)
        assert spec.requires_trust  # only demo models are trusted by default
        with pytest.raises(TrustRequired):
            load_model(spec)
        with pytest.raises(SourceError, match="model kind must be one of"):
            load_model(spec, trust_code=True)

    def test_the_unpickler_itself_refuses_untrusted_files(self, tmp_path, monkeypatch):
        from workbench.sources import model_source

        torch.save(nn.Linear(2, 2), tmp_path / "model.pt")
        monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load ran on an untrusted file"))
        with pytest.raises(TrustRequired, match="model.pt"):
            model_source._from_pickle(ModelSpec("pickle", str(tmp_path / "model.pt")), None, trust_code=False)

    def test_a_project_file_cannot_make_a_pickle_trusted(self, tmp_path):
        from workbench.project import load_project
        from workbench.session import Session

        torch.save(nn.Sequential(nn.Linear(4, 2)), tmp_path / "model.pt")
        np.save(tmp_path / "x.npy", np.zeros((8, 4), dtype=np.float32))
        Session.create(ModelSpec("pickle", str(tmp_path / "model.pt")), DataSpec("tensors", str(tmp_path / "x.npy")),
                       trust_code=True).save(tmp_path / "p.qwb")
        assert load_project(tmp_path / "p.qwb").model.kind == "pickle"  # reading the file runs nothing
        with pytest.raises(TrustRequired):
            Session.open(tmp_path / "p.qwb", remembered=False)  # reopening needs the user's trust again
        # the trust given is remembered in the user's config, not in the file: a copy of the file has none
        assert Session.open(tmp_path / "p.qwb").trust_code
        shutil.copy(tmp_path / "p.qwb", tmp_path / "copy.qwb")
        with pytest.raises(TrustRequired):
            Session.open(tmp_path / "copy.qwb")

    def test_parse_and_relative_paths(self, tmp_path):
        assert ModelSpec.parse("demo:digits").kind == "demo"
        assert ModelSpec.parse("ckpt/yolov5s.pt").kind == "pickle"
        assert ModelSpec.parse("models.py:build").kind == "entrypoint"
        spec = ModelSpec("entrypoint", f"{tmp_path}/sub/m.py:make", weights=str(tmp_path / "w.pt"))
        relative = spec.relative_to(tmp_path)
        assert relative.target == "sub/m.py:make" and relative.weights == "w.pt"
        assert ModelSpec.from_dict(relative.to_dict()) == relative


def write_images(root, classes=("cat", "dog"), per_class=3, size=(40, 30)):
    for index, name in enumerate(classes):
        folder = root / name / "nested"
        folder.mkdir(parents=True)
        for i in range(per_class):
            color = (index * 100, i * 40, 200)
            Image.new("RGB", size, color).save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")


class TestDataSources:
    def test_image_folder_with_labels(self, tmp_path):
        write_images(tmp_path)
        (tmp_path / "notes.txt").write_text("ignored")
        spec = DataSpec("images", str(tmp_path), batch_size=4,
                        image=ImageOptions(resize=32, crop=24, mean=(0.5,), std=(0.25,)))
        source = open_data(spec)
        assert source.classes == ["cat", "dog"] and source.num_samples == 6 and source.has_labels
        batches = list(source.batches())
        assert [b[0].shape for b in batches] == [(4, 3, 24, 24), (2, 3, 24, 24)]
        assert batches[0][1].tolist() == [0, 0, 0, 1]
        # png (lossless) pixel (0, 40, 200)/255 normalised with mean 0.5, std 0.25
        assert batches[0][0][1, 2, 0, 0].item() == pytest.approx((200 / 255 - 0.5) / 0.25, abs=1e-5)
        assert source.input_spec() == InputSpec((3, 24, 24), "float32")

    def test_images_without_subfolders_have_no_labels(self, tmp_path):
        Image.new("L", (8, 8), 7).save(tmp_path / "a.bmp")
        source = open_data(DataSpec("images", str(tmp_path), image=ImageOptions(grayscale=True, mean=(0,), std=(1,))))
        inputs, labels = next(source.batches())
        assert inputs.shape == (1, 1, 8, 8) and labels is None

    def test_image_errors(self, tmp_path):
        with pytest.raises(SourceError, match="no such folder"):
            open_data(DataSpec("images", str(tmp_path / "nope")))
        with pytest.raises(SourceError, match="no images found"):
            open_data(DataSpec("images", str(tmp_path)))
        (tmp_path / "broken.png").write_bytes(b"not a png")
        source = open_data(DataSpec("images", str(tmp_path)))
        with pytest.raises(SourceError, match="broken.png: cannot be read as an image"):
            list(source.batches())
        with pytest.raises(SourceError, match="smaller than the crop"):
            Image.new("RGB", (10, 10)).save(tmp_path / "broken.png")
            list(open_data(DataSpec("images", str(tmp_path), image=ImageOptions(crop=20))).batches())

    @pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors", ".pt"])
    def test_tensor_files(self, tmp_path, suffix):
        from safetensors.torch import save_file

        inputs = np.random.default_rng(0).normal(size=(10, 2, 3)).astype(np.float32)
        labels = np.arange(10)
        path = tmp_path / f"data{suffix}"
        if suffix == ".npy":
            np.save(path, inputs)
        elif suffix == ".npz":
            np.savez(path, x=inputs, y=labels)
        elif suffix == ".safetensors":
            save_file({"inputs": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}, str(path))
        else:
            torch.save((torch.from_numpy(inputs), torch.from_numpy(labels)), path)
        source = open_data(DataSpec("tensors", str(path), batch_size=4, num_batches=2))
        batches = list(source.batches())
        assert len(batches) == 2 and batches[0][0].shape == (4, 2, 3)
        assert torch.equal(batches[0][0], torch.from_numpy(inputs[:4]))
        assert (batches[0][1] is None) == (suffix == ".npy")

    @pytest.mark.parametrize("suffix", [".npy", ".pt"])
    def test_token_ids_keep_their_integer_dtype(self, tmp_path, suffix):
        ids = np.random.default_rng(0).integers(0, 100, size=(6, 12)).astype(np.int64)
        path = tmp_path / f"ids{suffix}"
        np.save(path, ids) if suffix == ".npy" else torch.save(torch.from_numpy(ids), path)
        source = open_data(DataSpec("tensors", str(path), batch_size=4))
        inputs, _ = next(source.batches())
        assert inputs.dtype == torch.int64 and torch.equal(inputs, torch.from_numpy(ids[:4]))
        assert source.input_spec() == InputSpec((12,), "int64") and source.input_spec().is_integer
        np.save(tmp_path / "f64.npy", np.ones((2, 3)))  # floating data still becomes float32
        assert next(open_data(DataSpec("tensors", str(tmp_path / "f64.npy"))).batches())[0].dtype == torch.float32

    def test_npz_with_several_arrays_feeds_them_by_keyword(self, tmp_path):
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 50, size=(5, 7))
        mask = np.ones((5, 7), dtype=np.int64)
        np.savez(tmp_path / "tokens.npz", input_ids=ids, attention_mask=mask, labels=np.arange(5))
        source = open_data(DataSpec("tensors", str(tmp_path / "tokens.npz"), batch_size=2))
        inputs, labels = next(source.batches())
        assert list(inputs) == ["input_ids", "attention_mask"] and labels.tolist() == [0, 1]
        assert inputs["input_ids"].dtype == torch.int64 and torch.equal(inputs["input_ids"], torch.from_numpy(ids[:2]))
        spec = source.input_spec()
        assert spec.named == (("input_ids", (7,), "int64"), ("attention_mask", (7,), "int64"))
        assert spec.describe() == "input_ids (7,) int64, attention_mask (7,) int64"
        assert InputSpec.from_dict(spec.to_dict()) == spec
        check_input(spec, spec, "tokens.npz")
        check_input(InputSpec((7,)), spec, "tokens.npz")  # --input-shape 7 for every keyword input
        with pytest.raises(SourceError, match=r"model input is \(8,\) float32"):
            check_input(InputSpec((8,)), spec, "tokens.npz")
        with pytest.raises(SourceError, match=r"gives inputs input_ids \(9,\).*model input is input_ids \(7,\)"):
            check_input(spec, InputSpec((9,), "int64", (("input_ids", (9,), "int64"),
                                                         ("attention_mask", (9,), "int64"))), "other.npz")

    def test_keyword_inputs_must_agree_and_be_argument_names(self, tmp_path):
        np.savez(tmp_path / "uneven.npz", input_ids=np.zeros((4, 3), dtype=np.int64),
                 attention_mask=np.zeros((3, 3), dtype=np.int64))
        with pytest.raises(SourceError, match="disagree on the number of samples"):
            open_data(DataSpec("tensors", str(tmp_path / "uneven.npz")))
        np.savez(tmp_path / "names.npz", **{"input ids": np.zeros(3), "mask": np.zeros(3)})
        with pytest.raises(SourceError, match="cannot be keyword arguments"):
            open_data(DataSpec("tensors", str(tmp_path / "names.npz")))

    def test_tensor_file_errors(self, tmp_path):
        np.savez(tmp_path / "mismatch.npz", inputs=np.zeros((4, 2)), labels=np.zeros(3))
        with pytest.raises(SourceError, match="4 inputs but 3 labels"):
            open_data(DataSpec("tensors", str(tmp_path / "mismatch.npz")))
        torch.save({"inputs": nn.Linear(1, 1)}, tmp_path / "code.pt")
        with pytest.raises(SourceError, match="code.pt: cannot be read as tensors"):
            open_data(DataSpec("tensors", str(tmp_path / "code.pt")))
        with pytest.raises(SourceError, match="no such tensor file"):
            open_data(DataSpec("tensors", str(tmp_path / "absent.npy")))

    def test_shuffle_is_seeded(self, tmp_path):
        np.save(tmp_path / "d.npy", np.arange(20, dtype=np.float32).reshape(20, 1))
        first = [b[0] for b in open_data(DataSpec("tensors", str(tmp_path / "d.npy"), batch_size=5, shuffle=True,
                                                  seed=7)).batches()]
        again = [b[0] for b in open_data(DataSpec("tensors", str(tmp_path / "d.npy"), batch_size=5, shuffle=True,
                                                  seed=7)).batches()]
        plain = [b[0] for b in open_data(DataSpec("tensors", str(tmp_path / "d.npy"), batch_size=5)).batches()]
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        assert not torch.equal(first[0], plain[0])
        assert sorted(torch.cat(first).flatten().tolist()) == list(range(20))

    def test_entrypoint_data(self, tmp_path):
        (tmp_path / "loader.py").write_text(textwrap.dedent("""
            import torch
            def batches(n=3):
                for i in range(n):
                    yield torch.full((2, 4), float(i)), torch.tensor([i, i])
            def bad():
                yield "text"
            def tokens():
                yield {"input_ids": torch.zeros(2, 5, dtype=torch.long), "labels": torch.tensor([1, 0])}
        """))
        spec = DataSpec("entrypoint", "loader.py:batches", kwargs={"n": 5}, num_batches=4)
        with pytest.raises(TrustRequired):
            open_data(spec, base_dir=tmp_path)
        batches = list(open_data(spec, trust_code=True, base_dir=tmp_path).batches())
        assert len(batches) == 4 and batches[3][0][0, 0].item() == 3.0
        bad = open_data(DataSpec("entrypoint", "loader.py:bad"), trust_code=True, base_dir=tmp_path)
        with pytest.raises(SourceError, match="batch 0 is a str"):
            list(bad.batches())
        tokens = open_data(DataSpec("entrypoint", "loader.py:tokens"), trust_code=True, base_dir=tmp_path)
        inputs, labels = next(tokens.batches())
        assert list(inputs) == ["input_ids"] and inputs["input_ids"].dtype == torch.int64
        assert labels.tolist() == [1, 0]
        assert tokens.input_spec().named == (("input_ids", (5,), "int64"),)

    def test_demo_digits_splits(self):
        train = open_data(DataSpec("demo", "digits", split="train", batch_size=100))
        test = open_data(DataSpec("demo", "digits", split="test"))
        assert train.num_samples + test.num_samples == 1797
        inputs, labels = next(train.batches())
        assert inputs.shape == (100, 1, 8, 8) and labels.dtype == torch.int64
        assert 0.0 <= inputs.min() and inputs.max() <= 1.0

    def test_bad_specs(self):
        with pytest.raises(SourceError, match="batch size"):
            DataSpec("tensors", "x.npy", batch_size=0)
        with pytest.raises(SourceError, match="split"):
            DataSpec("demo", "digits", split="validation")
        with pytest.raises(SourceError, match="data kind"):
            DataSpec("video", "x")

    def test_shape_mismatch_names_both_shapes(self):
        with pytest.raises(SourceError, match=r"shape \(3, 32, 32\).*model input is \(3, 224, 224\)"):
            check_input(InputSpec((3, 224, 224)), InputSpec((3, 32, 32)), "images/")

    def test_spec_round_trip(self):
        spec = DataSpec("images", "/data/imgs", batch_size=8, shuffle=True, seed=3,
                        image=ImageOptions(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
        assert DataSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("text, shape", [("3,224,224", (3, 224, 224)), ("3x32x32", (3, 32, 32)),
                                         ("(1, 8, 8)", (1, 8, 8)), ("  ", None), (None, None)])
def test_an_input_shape_is_read_as_typed_on_the_command_line_or_in_the_wizard(text, shape):
    assert InputSpec.parse_shape(text) == shape


@pytest.mark.parametrize("text", ["three", "3,0,4", "3,-1"])
def test_a_bad_input_shape_says_what_was_expected(text):
    with pytest.raises(SourceError, match="input shape must be"):
        InputSpec.parse_shape(text)
