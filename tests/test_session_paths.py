"""Save As into another folder: every file a project names (model code, data, metric) is still found."""
import textwrap

import numpy as np
import pytest
import torch

from workbench.project import load_project
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec

MODEL_CODE = textwrap.dedent("""
    from torch import nn

    def make():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
""")

DATA_CODE = textwrap.dedent("""
    import torch

    def batches():
        generator = torch.Generator().manual_seed(0)
        return [torch.randn(4, 3, 6, 6, generator=generator) for _ in range(3)]
""")


@pytest.fixture
def project_in_a(tmp_path):
    """A project in folder A whose model and calibration data are both ``file.py:function`` next to it."""
    folder = tmp_path / "A"
    folder.mkdir()
    (folder / "net.py").write_text(MODEL_CODE)
    (folder / "data.py").write_text(DATA_CODE)
    # as `workbench new --model net.py:make --data data.py:batches` run in A writes them: relative to A
    session = Session.create(ModelSpec("entrypoint", "net.py:make"),
                             DataSpec("entrypoint", "data.py:batches", batch_size=4), trust_code=True,
                             base_dir=folder)
    path = session.save(folder / "project.qwb")
    return session, path


def test_entry_point_paths_given_absolute_are_saved_relative(tmp_path):
    (tmp_path / "net.py").write_text(MODEL_CODE)
    (tmp_path / "data.py").write_text(DATA_CODE)
    session = Session.create(ModelSpec("entrypoint", f"{tmp_path}/net.py:make"),
                             DataSpec("entrypoint", f"{tmp_path}/data.py:batches", batch_size=4), trust_code=True)
    saved = load_project(session.save(tmp_path / "project.qwb"))
    assert saved.model.target == "net.py:make"
    assert saved.data["calibration"].path == "data.py:batches"


def test_entry_point_data_and_model_survive_save_as_into_another_folder(project_in_a, tmp_path):
    session, _ = project_in_a
    other = tmp_path / "B"
    other.mkdir()
    moved = session.save(other / "copy.qwb")
    saved = load_project(moved)
    # outside B: only an absolute path still finds them from there
    assert saved.data["calibration"].path == f"{(tmp_path / 'A' / 'data.py').resolve()}:batches"
    assert saved.model.target == f"{(tmp_path / 'A' / 'net.py').resolve()}:make"
    reopened = Session.open(moved, trust_code=True)
    inputs, _ = next(iter(reopened.data("calibration").batches()))
    assert tuple(inputs.shape) == (4, 3, 6, 6)
    assert reopened.data("calibration").input_spec().shape == (3, 6, 6)
    assert isinstance(reopened.float_model, torch.nn.Sequential)
    # and the live session keeps working from its new folder
    assert len(list(session.data("calibration").batches())) == 3


def test_tensor_data_moves_with_save_as_back_under_the_project_folder(tmp_path):
    """A file in B, saved first from A (absolute), becomes relative once the project is saved into B."""
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    np.save(tmp_path / "B" / "x.npy", np.zeros((4, 1, 8, 8), dtype=np.float32))
    session = Session.create(ModelSpec("demo", "digits"), DataSpec("tensors", str(tmp_path / "B" / "x.npy")))
    session.save(tmp_path / "A" / "p.qwb")
    assert load_project(tmp_path / "A" / "p.qwb").data["calibration"].path == str(tmp_path / "B" / "x.npy")
    session.save(tmp_path / "B" / "p.qwb")
    assert load_project(tmp_path / "B" / "p.qwb").data["calibration"].path == "x.npy"
    assert Session.open(tmp_path / "B" / "p.qwb").data("calibration").num_samples == 4


def test_spec_absolute_and_relative_are_inverse(tmp_path):
    data = DataSpec("entrypoint", "sub/data.py:batches")
    absolute = data.absolute(tmp_path)
    assert absolute.path == f"{(tmp_path / 'sub' / 'data.py').resolve()}:batches"
    assert absolute.relative_to(tmp_path) == data
    assert DataSpec("entrypoint", "pkg.mod:batches").absolute(tmp_path).path == "pkg.mod:batches"
    assert DataSpec("demo", "digits", split="test").absolute(tmp_path).path == "digits"
    model = ModelSpec("pickle", "ckpt/m.pt", code_dir="code", weights="w.pt")
    assert model.absolute(tmp_path).relative_to(tmp_path) == model
    assert model.absolute(tmp_path).code_dir == str((tmp_path / "code").resolve())
