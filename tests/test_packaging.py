"""Packaging recipes, checked without building anything (a PyInstaller build takes minutes and GBs)."""
import ast
import configparser
import importlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"


def spec_tree():
    return ast.parse((PACKAGING / "quant-workbench.spec").read_text(), "quant-workbench.spec")


def test_the_spec_parses_and_names_an_entry_script_and_existing_resources():
    tree = spec_tree()
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"Analysis", "PYZ", "EXE", "COLLECT"} <= calls  # an app folder, not a one-file build
    text = (PACKAGING / "quant-workbench.spec").read_text()
    assert '"packaging" / "entry.py"' in text and '"resources"' in text and 'collect_data_files("netron")' in text
    entry = PACKAGING / "entry.py"
    assert entry.is_file()
    entry_tree = ast.parse(entry.read_text())
    imports = [n for n in ast.walk(entry_tree) if isinstance(n, ast.ImportFrom)]
    assert any(n.module == "workbench.cli" and any(a.name == "main" for a in n.names) for n in imports)
    assert (ROOT / "resources" / "demo" / "digits_cnn.safetensors").is_file()
    assert (ROOT / "resources" / "icons" / "quant-workbench.png").is_file()


def test_the_desktop_file_has_the_required_keys():
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # desktop keys are case-sensitive
    parser.read(PACKAGING / "quant-workbench.desktop", encoding="utf-8")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Name"] == "Quant Workbench"
    assert entry["Exec"] == "workbench gui %f" and entry["Icon"] == "quant-workbench"
    assert entry["Categories"].endswith(";") and entry["MimeType"] == "application/x-quant-workbench;"
    assert entry["Terminal"] == "false"
    mime = ElementTree.parse(PACKAGING / "quant-workbench.xml").getroot()
    namespace = "{http://www.freedesktop.org/standards/shared-mime-info}"
    kind = mime.find(f"{namespace}mime-type")
    assert kind.get("type") == "application/x-quant-workbench"
    assert kind.find(f"{namespace}glob").get("pattern") == "*.qwb"


def test_the_icon_is_an_svg_and_a_256_png():
    svg = ElementTree.parse(ROOT / "resources" / "icons" / "quant-workbench.svg").getroot()
    assert svg.tag.endswith("svg") and svg.get("viewBox") == "0 0 256 256"
    header = (ROOT / "resources" / "icons" / "quant-workbench.png").read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(header[16:20], "big") == 256 and int.from_bytes(header[20:24], "big") == 256


def test_the_entry_point_imports():
    module_name, _, function = "workbench.cli:main".partition(":")
    assert callable(getattr(importlib.import_module(module_name), function))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'workbench = "workbench.cli:main"' in pyproject


def test_resources_can_be_found_outside_the_repository(tmp_path):
    """The frozen app's resources are not next to the package: demo.py honours an override."""
    code = "from workbench.sources import demo; print(demo.RESOURCES); print(demo.DIGITS_WEIGHTS)"
    env = {**os.environ, "WORKBENCH_RESOURCES": str(tmp_path)}
    lines = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert lines == [str(tmp_path.resolve()), str(tmp_path.resolve() / "demo" / "digits_cnn.safetensors")]
    env.pop("WORKBENCH_RESOURCES")
    frozen = f"import sys; sys._MEIPASS = {str(tmp_path)!r}\nfrom workbench.sources import demo; print(demo.RESOURCES)"
    out = subprocess.run([sys.executable, "-c", frozen], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "resources")


def test_resources_are_found_wherever_an_install_put_them(tmp_path):
    """Source tree first, then a wheel's copy under the prefix; an override or a frozen app win."""
    from workbench.resources import INSTALLED, find_resources

    source_root, prefix = tmp_path / "src", tmp_path / "venv"
    (prefix / INSTALLED).mkdir(parents=True)
    assert find_resources(None, None, source_root, prefix) == prefix / INSTALLED  # pip install .
    (source_root / "resources").mkdir(parents=True)
    assert find_resources(None, None, source_root, prefix) == source_root / "resources"  # checkout / -e
    assert find_resources(str(tmp_path / "elsewhere"), None, source_root, prefix) == tmp_path / "elsewhere"
    assert find_resources(None, str(tmp_path / "app"), source_root, prefix) == tmp_path / "app" / "resources"
    empty = tmp_path / "empty"
    assert find_resources(None, None, empty, empty) == empty / "resources"  # the path a developer expects


def test_a_wheel_carries_what_the_program_reads_but_not_the_screenshots():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for folder in ("demo", "icons", "style"):
        assert f'"share/quant-workbench/{folder}" = ["resources/{folder}/*"]' in pyproject
        assert (ROOT / "resources" / folder).is_dir()
    assert "screenshots" not in pyproject.split("[tool.setuptools.data-files]")[1].split("[")[0]
