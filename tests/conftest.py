"""Shared test configuration.

QT_QPA_PLATFORM must be set before any QApplication exists, or a headless run aborts (exit 134).
"""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # the marker, not item.keywords: keywords also hold directory names (a checkout under .../cuda/)
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip_cuda)


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path_factory, monkeypatch):
    """Trust remembered by one test (workbench.sources.trust) reaches neither another test nor the user's config."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    return torch.device(request.param)
