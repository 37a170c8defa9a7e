"""The package faces of export, project and analysis import their modules on first use (PEP 562): importing
the package, or one light module of it, loads none of the heavy ones, and every public name still resolves to
the object its module defines. Each check runs in a fresh interpreter (a module another test loaded would hide
an import)."""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FACES = ["workbench.export", "workbench.project", "workbench.analysis", "workbench.quant", "workbench.quant.calib"]


def loaded_after(code: str) -> set[str]:
    probe = (f"import sys\nbefore = set(sys.modules)\n{code}\n"
             "import json\nprint(json.dumps(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_importing_a_face_or_its_errors_loads_no_heavy_module():
    loaded = loaded_after("import workbench.export, workbench.project, workbench.analysis\n"
                          "from workbench.export import ExportError\nfrom workbench.project import ProjectError\n"
                          "from workbench.analysis import AnalysisError, MetricError")
    assert {"workbench.export", "workbench.project", "workbench.analysis"} <= loaded
    assert not {"torch", "onnx", "sqlite_utils", "numpy", "workbench.export.onnx_export", "workbench.project.store",
                "workbench.analysis.sensitivity", "workbench.analysis.fallback"} & loaded


def test_the_quant_face_and_its_registries_load_no_torch():
    """pytorch-quantization's import lines (``from workbench.quant import nn as quant_nn``) keep working, and a
    registry of the core (methods, precisions, the descriptor) comes without the kernels and torch."""
    loaded = loaded_after("import workbench.quant\nfrom workbench.quant.calib.methods import AmaxMethod\n"
                          "from workbench.quant.algorithms.precision_registry import Precision\n"
                          "from workbench.quant.descriptor import QuantDescriptor\nQuantDescriptor(num_bits=8, axis=0)")
    assert "torch" not in loaded and "workbench.quant.kernels.fake_quant" not in loaded
    loaded = loaded_after("from workbench.quant import nn as quant_nn, calib\n"
                          "assert quant_nn.QuantConv2d and calib.HistogramCalibrator")
    assert {"torch", "workbench.quant.nn.modules.quant_conv", "workbench.quant.calib.histogram"} <= loaded


def test_a_light_module_of_the_export_package_loads_no_onnx():
    loaded = loaded_after("from workbench.export.naming import layer_of_quantizer\n"
                          "assert layer_of_quantizer('conv1._input_quantizer') == ('conv1', 'input')")
    assert "workbench.export.naming" in loaded and "onnx" not in loaded


def test_a_public_name_loads_its_module_when_first_used():
    loaded = loaded_after("from workbench.project import load_project")
    assert {"workbench.project.store", "sqlite_utils"} <= loaded
    loaded = loaded_after("import workbench.export\nworkbench.export.export_qdq_onnx")
    assert {"workbench.export.onnx_export", "onnx"} <= loaded


@pytest.mark.parametrize("face", FACES)
def test_every_public_name_is_its_modules_object_and_listed(face):
    package = importlib.import_module(face)
    assert len(package.__all__) == len(set(package.__all__)) > 3
    assert set(package.__all__) <= set(dir(package))
    for name in package.__all__:
        value = getattr(package, name)
        module = importlib.import_module(getattr(value, "__module__", None) or face)
        if hasattr(module, name):  # constants (SCHEMES, PROJECT_SUFFIX) have no __module__ of their own
            assert getattr(module, name) is value, f"{face}.{name}"
    with pytest.raises(AttributeError, match="no_such_name"):
        package.no_such_name  # noqa: B018


def test_the_same_objects_come_through_from_imports():
    from workbench.analysis import fallback_search, sensitivity
    from workbench.analysis.fallback import fallback_search as defined_search
    from workbench.analysis.sensitivity import sensitivity as defined_sensitivity
    from workbench.export import QDQStandIn, export_qdq_onnx
    from workbench.export.onnx_export import export_qdq_onnx as defined_export
    from workbench.export.qdq import QDQStandIn as defined_stand_in
    from workbench.project import Project, save_project
    from workbench.project.model import Project as defined_project
    from workbench.project.store import save_project as defined_save

    assert (fallback_search, export_qdq_onnx, QDQStandIn, Project, save_project) == (
        defined_search, defined_export, defined_stand_in, defined_project, defined_save)
    assert sensitivity is defined_sensitivity and callable(sensitivity)


def test_a_public_name_that_is_also_a_submodule_stays_the_public_object():
    """``workbench.analysis.sensitivity`` is the function, as when the face imported everything at once, even
    after the module of the same name was imported on its own first."""
    loaded = loaded_after("import workbench.analysis.sensitivity\nimport workbench.analysis as a\n"
                          "from workbench.analysis import sensitivity\n"
                          "assert callable(sensitivity) and sensitivity is a.sensitivity, sensitivity\n"
                          "assert sensitivity.__module__ == 'workbench.analysis.sensitivity'")
    assert "workbench.analysis.sensitivity" in loaded
