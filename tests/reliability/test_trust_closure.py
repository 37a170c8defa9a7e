"""Round 2, item 2: trust covers the local modules a trusted file imports (transitively), not only the file
itself; what reading the imports cannot follow is said."""
import json
import textwrap

import numpy as np
import pytest
from cli_helpers import run

from workbench.sources.closure import module_closure


@pytest.fixture
def helper_project(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "helper.py").write_text(textwrap.dedent("""
        from torch import nn
        from layers import width

        def build():
            return nn.Sequential(nn.Conv2d(3, width(), 1), nn.Flatten())
    """))
    (tmp_path / "layers.py").write_text("def width():\n    return 2\n")
    (tmp_path / "usehelper.py").write_text("import torch\nfrom helper import build\n\ndef make():\n"
                                           "    return build()\n")
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 5, 5), dtype=np.float32))
    path = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/usehelper.py:make", "--data",
                       tmp_path / "x.npy", "--trust-code")
    assert code == 0, err
    return path


@pytest.mark.parametrize("edited", ["helper.py", "layers.py"])
def test_an_edit_to_an_imported_module_asks_again(helper_project, tmp_path, capsys, edited):
    """The issue's case: trusted usehelper.py:make, then helper.py (or what helper.py imports) changed."""
    code, out, err = run(capsys, "calibrate", helper_project, "--method", "max")
    assert code == 0, err  # trusted as it was
    marker = tmp_path / "ran.txt"
    (tmp_path / edited).write_text((tmp_path / edited).read_text() + f"\nopen({str(marker)!r}, 'w').write('x')\n")
    code, out, err = run(capsys, "calibrate", helper_project, "--method", "max")
    assert code == 2 and f"its code changed since ({edited})" in err, err
    assert not marker.exists()  # the edited helper did not run
    code, out, err = run(capsys, "show", helper_project, "--json")
    files = json.loads(out)["code"][0]["files"]
    assert str(tmp_path / "helper.py") in files and str(tmp_path / "layers.py") in files


def test_trust_lists_what_it_covers_and_what_it_cannot(tmp_path, monkeypatch, capsys, helper_project):
    (tmp_path / "usehelper.py").write_text("import importlib\nfrom helper import build\n\ndef make():\n"
                                           "    importlib.import_module('la' + 'yers')\n    return build()\n")
    code, out, err = run(capsys, "trust", helper_project)
    assert code == 0, err
    assert "helper.py" in out and "layers.py" in out
    assert "not covered" in out and "usehelper.py:5 runs import_module(...)" in out
    assert "installed packages are not covered" in out


def test_the_closure_follows_packages_and_relative_imports_but_not_installed_code(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "blocks.py").write_text("from .util import act\n")
    (package / "util.py").write_text("def act(): pass\n")
    (tmp_path / "main.py").write_text("import torch, numpy\nfrom pkg import blocks\n")
    closure = module_closure(tmp_path / "main.py", [tmp_path])
    names = sorted(p.relative_to(tmp_path).as_posix() for p in closure.files)
    assert names == ["main.py", "pkg/__init__.py", "pkg/blocks.py", "pkg/util.py"]
    assert closure.not_covered == []
