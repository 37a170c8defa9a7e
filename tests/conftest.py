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
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))  # remembered file digests too


@pytest.fixture(autouse=True)
def _torch_left_as_found():
    """A test that leaves a torch function mode on the stack, fx's tracing flag set or fx's wrappers installed
    (on nn.Module, math, or a function given to torch.fx.wrap) fails here, by name, and the state is cleared: left,
    they broke tests far away (every torch.compile'd kernel refused or mis-traced; a wrapped function's attention
    products stayed float)."""
    from torch.overrides import _get_current_function_mode_stack

    from workbench.graph.fx_guard import restore_module_methods

    yield
    modes = _get_current_function_mode_stack()
    while torch._C._len_torch_function_stack():
        torch._C._pop_torch_function_stack()
    left = restore_module_methods()
    if modes or left:
        pytest.fail(f"the test left torch in another state: function modes {modes}, fx left {left}")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    return torch.device(request.param)


@pytest.fixture(scope="session")
def outlier_block_template(tmp_path_factory):
    """A project of the outlier-channel block (workbench.sources.outliers), made once by ``workbench new``."""
    import workbench.cli as cli
    from workbench.sources import outliers

    path = tmp_path_factory.mktemp("outlier-template") / "block.qwb"
    code = cli.main([str(a) for a in ("new", path, "--model", "workbench.sources.outliers:outlier_block", "--data",
                                      f"{outliers.__file__}:calibration_batches", "--trust-code")])
    assert code == 0
    return path


@pytest.fixture
def outlier_block(outlier_block_template, tmp_path):
    """A fresh copy of the outlier block's project, for a test to edit."""
    import shutil

    path = tmp_path / "block.qwb"
    shutil.copy(outlier_block_template, path)
    return path
