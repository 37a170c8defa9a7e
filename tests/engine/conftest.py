"""A calibrated demo project, its QDQ export, and trtexec-format reports built from that export's node names."""
import json
import shutil

import onnx
import pytest
from engine_files import engine_layers, profile_for

from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


@pytest.fixture(scope="session")
def demo_export(tmp_path_factory):
    """(session, project path, ONNX path, node names) for the calibrated digits CNN."""
    folder = tmp_path_factory.mktemp("engine")
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2))
    session.calibrate(method="max")
    onnx_path = folder / "digits.qdq.onnx"
    session.export(onnx_path)
    path = session.save(folder / "digits.qwb")
    names = [n.name for n in onnx.load(str(onnx_path)).graph.node]
    return session, path, onnx_path, names


@pytest.fixture
def trtexec_files(demo_export, tmp_path):
    """layers.json (detailed) and profile.json for the demo export."""
    _, _, _, names = demo_export
    layers = engine_layers(names)
    layer_info = tmp_path / "layers.json"
    layer_info.write_text(json.dumps({"Layers": layers, "Bindings": ["input", "output"]}, indent=1))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_for(layers), indent=1))
    return layer_info, profile, layers


@pytest.fixture
def window(qtbot, tmp_path, demo_export):
    """The main window on a copy of the demo project (GUI tests only: Qt is imported here)."""
    pytest.importorskip("PySide6")
    pytest.importorskip("pyqtgraph")
    from engine_window import open_window

    project = tmp_path / "digits.qwb"
    shutil.copy(demo_export[1], project)
    window = open_window(qtbot, tmp_path, project)
    yield window
    window.shutdown()
