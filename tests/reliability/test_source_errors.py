"""Items 4, 5 and 7 at the source layer: errors that name the file, no unsafe advice, user code that
exits or prints."""
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from workbench.sources.data_source import DataSpec, ImageOptions, open_data
from workbench.sources.errors import EntryPointError, SourceError
from workbench.sources.model_source import ModelSpec, load_model

UNSAFE_ADVICE = ("will likely succeed", "weights_only=False", "weights_only` set to `False", "add_safe_globals")


# ----- item 4: image folders of mixed sizes --------------------------------------------------------


def image_folder(tmp_path, sizes):
    folder = tmp_path / "images"
    folder.mkdir()
    for index, (width, height) in enumerate(sizes):
        Image.new("RGB", (width, height), (index * 20, 0, 0)).save(folder / f"img{index}.png")
    return folder


def test_mixed_image_sizes_name_the_files_and_offer_resize(tmp_path):
    folder = image_folder(tmp_path, [(8, 8), (8, 8), (10, 12), (8, 8)])
    source = open_data(DataSpec("images", str(folder), batch_size=4))
    with pytest.raises(SourceError) as caught:
        list(source.batches())
    text = str(caught.value)
    assert str(folder) in text and "img0.png is 8x8" in text and "img2.png is 10x12" in text
    assert "--resize" in text and "stack expects" not in text


def test_mixed_sizes_across_batches_are_caught_too(tmp_path):
    folder = image_folder(tmp_path, [(8, 8), (8, 8), (6, 6), (6, 6)])
    source = open_data(DataSpec("images", str(folder), batch_size=2))
    with pytest.raises(SourceError, match="img2.png is 6x6"):
        list(source.batches())


def test_resize_and_crop_make_mixed_sizes_work(tmp_path):
    folder = image_folder(tmp_path, [(8, 8), (10, 12), (9, 14)])
    source = open_data(DataSpec("images", str(folder), batch_size=3, image=ImageOptions(resize=8, crop=8)))
    (inputs, _), = list(source.batches())
    assert tuple(inputs.shape) == (3, 3, 8, 8)


# ----- item 4: tensor files that are not what they say ---------------------------------------------


def test_random_bytes_npy_is_not_called_pickled(tmp_path):
    path = tmp_path / "data.npy"
    path.write_bytes(np.random.default_rng(5).bytes(256).replace(b"\x93NUMPY", b"xxxxxx"))
    with pytest.raises(SourceError) as caught:
        open_data(DataSpec("tensors", str(path)))
    text = str(caught.value)
    assert str(path) in text and "not a NumPy file" in text and "pickled (object) data" not in text
    assert "allow_pickle" not in text


def test_object_array_npy_is_called_python_objects(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError) as caught:
        open_data(DataSpec("tensors", str(path)))
    assert "Python objects" in str(caught.value) and "allow_pickle" not in str(caught.value)


def test_random_bytes_pt_data_names_the_file(tmp_path):
    path = tmp_path / "data.pt"
    path.write_bytes(b"\x80\x02" + np.random.default_rng(4).bytes(200))
    with pytest.raises(SourceError) as caught:
        open_data(DataSpec("tensors", str(path)))
    text = str(caught.value)
    assert str(path) in text and not any(advice in text for advice in UNSAFE_ADVICE)


# ----- item 5: a weights file that holds code --------------------------------------------------------

MODEL_CODE = textwrap.dedent("""
    import sys
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    def make():
        return Tiny()

    def exits():
        sys.exit(0)

    def exits_with_text():
        sys.exit("bye")

    def chatty():
        print("building the model...")
        return Tiny()

    def batches():
        print("loading batch")
        yield __import__("torch").zeros(2, 2)
        sys.exit(3)
""")


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MODEL_CODE)
    return path


class Payload:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("content", ["module", "reduce"])
def test_weights_with_code_refused_without_unsafe_advice(model_file, tmp_path, content):
    path = tmp_path / "weights.pt"
    torch.save({"model": nn.Linear(2, 2)} if content == "module" else {"fc.weight": Payload()}, path)
    with pytest.raises(SourceError) as caught:
        load_model(ModelSpec("entrypoint", f"{model_file}:make", weights=str(path)), trust_code=True)
    text = str(caught.value)
    assert not any(advice in text for advice in UNSAFE_ADVICE), text
    assert str(path) in text and "pickled Python objects" in text
    assert "trust" in text and "--trust-code" in text
    assert ("torch.nn.modules.linear.Linear" in text) if content == "module" else ("print" in text)


def test_random_bytes_weights_say_what_they_are(model_file, tmp_path):
    path = tmp_path / "weights.pt"
    path.write_bytes(b"\x80\x02" + np.random.default_rng(3).bytes(100))
    with pytest.raises(SourceError) as caught:
        load_model(ModelSpec("entrypoint", f"{model_file}:make", weights=str(path)), trust_code=True)
    text = str(caught.value)
    assert "not a PyTorch tensor file" in text and "--trust-code" not in text
    assert not any(advice in text for advice in UNSAFE_ADVICE)


# ----- item 7: user code that exits or prints ---------------------------------------------------------


@pytest.mark.parametrize("function, code", [("exits", "0"), ("exits_with_text", "'bye'")])
def test_factory_calling_sys_exit_is_an_error_naming_the_entry_point(model_file, function, code):
    with pytest.raises(SourceError) as caught:
        load_model(ModelSpec("entrypoint", f"{model_file}:{function}"), trust_code=True)
    assert f"{model_file}:{function}" in str(caught.value) and f"sys.exit({code})" in str(caught.value)


def test_module_calling_sys_exit_on_import(tmp_path):
    path = tmp_path / "quits.py"
    path.write_text("import sys\nprint('importing')\nsys.exit(1)\n")
    with pytest.raises(EntryPointError, match=r"quits.py:make' called sys.exit\(1\)"):
        load_model(ModelSpec("entrypoint", f"{path}:make"), trust_code=True)


def test_factory_prints_go_to_stderr(model_file, capsys):
    load_model(ModelSpec("entrypoint", f"{model_file}:chatty"), trust_code=True)
    captured = capsys.readouterr()
    assert captured.out == "" and "building the model..." in captured.err


def test_data_generator_exiting_midway_names_the_entry_point(model_file, capsys):
    source = open_data(DataSpec("entrypoint", f"{model_file}:batches"), trust_code=True)
    with pytest.raises(SourceError, match=r"called sys.exit\(3\)"):
        list(source.batches())
    assert capsys.readouterr().out == ""
