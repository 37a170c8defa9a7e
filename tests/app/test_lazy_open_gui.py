"""The main window on a lazily opened Hugging Face checkpoint (issue 37 point 2): opening the project builds the
tree, the layer rows and the layer shapes without reading a weight (pytest-qt, offscreen)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from window_waits import settle  # noqa: E402

from tests.cli_run import run  # noqa: E402
from workbench.sources import model_source  # noqa: E402
from workbench.sources.lazy_checkpoint import LazyCheckpoint  # noqa: E402

MODELS = Path(__file__).resolve().parents[1] / "transformers"


def test_opening_a_lazy_project_in_the_window_leaves_every_weight_on_meta(window, qtbot, tmp_path, capsys,
                                                                           monkeypatch):
    sys.path.insert(0, str(MODELS))
    import models

    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "always")
    torch.manual_seed(0)
    folder = tmp_path / "llama"
    models.hf_llama().to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits", "--force")
    assert code == 0, err
    loads = []
    real_load = LazyCheckpoint._load
    monkeypatch.setattr(LazyCheckpoint, "_load", lambda self, ps: loads.extend(p for p in ps if p.is_meta)
                        or real_load(self, ps))

    controller = window.controller
    with qtbot.waitSignal(controller.session_changed, timeout=120000):
        assert window.open_project(project)
    settle(window, qtbot)
    assert not window.error_dialogs, window.error_dialogs[-1].message
    session = controller.session
    assert session._loaded.checkpoint is not None
    assert window.tree.model.node_count() > 0  # the tree is shown
    # no forward read the weights: at most the selected layer's, for its weight-range plot, and given back
    assert len(loads) <= 1
    assert all(p.is_meta for p in session.float_model.parameters())
    assert all(p.is_meta for p in session.quantized_model().parameters())
    shapes = session.layer_shapes()
    assert shapes["model.layers.0.mlp.down_proj"]["weight"] == (32, 64)  # the layer panel's shapes, from meta
