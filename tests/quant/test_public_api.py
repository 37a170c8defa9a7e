"""The quantizer's public face (issue 29 point 3): what code outside ``workbench/quant/`` may use.

Two kinds of test: source scans (nothing outside quant/ reaches a quant object's private fields; no
quant module imports the package face; no import circle inside quant/) that name file:line, and the
behaviour of the public API (set_amax, the helpers for ``model.apply``, the bypass context manager).
"""
from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import workbench.quant as quant
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer
from workbench.quant.tensor_quant import QuantDescriptor

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workbench"
QUANT = PACKAGE / "quant"

# the buffers a TensorQuantizer registers: reached through amax / pre_quant_scale, never by name
QUANT_BUFFER_NAMES = {"_amax", "_pre_quant_scale"}


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _quant_private_names() -> set[str]:
    """Every private attribute, buffer and method that the classes of workbench/quant/ define.

    Read from the source rather than listed by hand, so that a field added to a quantizer,
    calibrator or quantized module later is covered without touching this test.
    """
    names: set[str] = set(QUANT_BUFFER_NAMES)
    for path in _sources(QUANT):
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names.update(t.id for t in targets if isinstance(t, ast.Name))
    # torch.nn.Module's own members that quant classes override (_load_from_state_dict, ...) are torch's
    # protocol, not the quantizer's fields; quantized modules' quantizer attributes (_input_quantizer,
    # _weight_quantizers, ...) are the pytorch-quantization naming of state_dict keys and qualified names,
    # read by name through getattr where a placement rule needs them. Only attribute syntax on them is checked.
    torch_protocol = {name for name in dir(nn.Module) if name.startswith("_")}
    return {n for n in names if n.startswith("_") and not n.startswith("__") and n not in torch_protocol}


def _private_reaches(path: Path, private: set[str]) -> list[str]:
    """file:line of every use of a quant private name in ``path`` (outside ``self``/``cls``)."""
    found: list[str] = []
    rel = path.relative_to(ROOT)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{rel}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in QUANT_BUFFER_NAMES:
            found.append(f"{rel}:{node.lineno}: {node.value!r}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in private
              and not str(node.args[1].value).endswith(("_quantizer", "_quantizers"))):
            found.append(f"{rel}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_nothing_outside_quant_reaches_quant_private_names():
    private = _quant_private_names()
    assert {"_amax", "_calibrator", "_disabled", "_if_quant", "_if_calib", "_num_bits"} <= private
    found: list[str] = []
    for path in _sources(PACKAGE):
        if QUANT in path.parents:
            continue
        found.extend(_private_reaches(path, private))
    assert not found, "private fields of quant objects used outside workbench/quant/ (use the public API):\n" + \
        "\n".join(found)


def test_the_scan_catches_each_kind_of_reach(tmp_path):
    """The scan above would fail on each way of reaching a quantizer's private state."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f(q):\n"
                      "    a = q._amax\n"
                      "    b = q._buffers.get('_amax')\n"
                      "    c = hasattr(q, '_amax')\n"
                      "    d = getattr(q, '_if_calib')\n"
                      "    q._disabled = True\n"
                      "    self_like = q.amax\n")
    rel_root = tmp_path
    found = [line.split(": ", 1)[1] for line in _private_reaches_at(sample, rel_root, _quant_private_names())]
    assert found.count("'_amax'") == 2
    assert "._amax" in found and "._disabled" in found
    assert "getattr(..., '_if_calib')" in found
    assert all("self_like" not in f for f in found)


def _private_reaches_at(path: Path, root: Path, private: set[str]) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, root
    try:
        return _private_reaches(path, private)
    finally:
        ROOT = saved


# ----- imports inside quant/ --------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _quant_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _sources(QUANT)}


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """(line, imported workbench.quant module, whether the statement names the face) for each import in ``path``.

    ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else the face ``a.b``.
    Imports inside functions count too: a lazy import is still an edge of the graph.
    """
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    edges: list[tuple[int, str, bool]] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("workbench.quant"):
                    edges.append((node.lineno, alias.name, alias.name == "workbench.quant"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("workbench.quant"):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                edges.append((node.lineno, child if child in modules else base, base == "workbench.quant"))
    return edges


def test_no_quant_module_imports_the_package_face():
    modules = _quant_modules()
    found = []
    for path in modules.values():
        if path == QUANT / "__init__.py":
            continue
        for line, target, names_face in _imports(path, modules):
            if names_face:
                found.append(f"{path.relative_to(ROOT)}:{line}: imports the package face ({target})")
    assert not found, "import from the defining module instead:\n" + "\n".join(found)


def test_quant_import_graph_has_no_circle():
    modules = _quant_modules()
    graph = {name: sorted({target for _, target, _ in _imports(path, modules) if target in modules and
                           target != name}) for name, path in modules.items()}
    # a package face may import its own children (that is what a face is); a child importing its
    # parent face back would close a circle, which the search below reports
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state:
            cycle = visit(node)
            assert cycle is None, "import circle inside workbench/quant: " + " -> ".join(cycle)


def test_graph_scan_sees_a_circle(tmp_path):
    """The walk above does report a circle (a <-> b through the package face)."""
    pkg = tmp_path / "workbench" / "quant"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from workbench.quant.a import x\n")
    (pkg / "a.py").write_text("from workbench.quant.b import y\nx = 1\n")
    (pkg / "b.py").write_text("def f():\n    from workbench.quant import a\ny = 2\n")
    globals_saved = dict(ROOT=ROOT, QUANT=QUANT)
    globals().update(ROOT=tmp_path, QUANT=pkg)
    try:
        modules = _quant_modules()
        edges = {name: {t for _, t, _ in _imports(path, modules)} for name, path in modules.items()}
        assert "workbench.quant.a" in edges["workbench.quant.b"]
        assert "workbench.quant.b" in edges["workbench.quant.a"]
        with pytest.raises(AssertionError, match="import circle"):
            test_quant_import_graph_has_no_circle()
    finally:
        globals().update(globals_saved)


# ----- behaviour of the public API --------------------------------------------------------------

def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(quant.QuantLinear(4, 8), nn.ReLU(), quant.QuantLinear(8, 3))


def _quantizers(model: nn.Module) -> list[TensorQuantizer]:
    return [m for m in model.modules() if isinstance(m, TensorQuantizer)]


def test_calibrator_is_public_and_read_only():
    q = TensorQuantizer(QuantDescriptor(calib_method="histogram"))
    assert type(q.calibrator).__name__ == "HistogramCalibrator"
    with pytest.raises(AttributeError):
        q.calibrator = None
    q.enable_calib()
    q(torch.tensor([0.5, -2.0]))
    assert q.calibrator.batches_seen == 1


def test_set_amax_validates_shape_and_values():
    q = TensorQuantizer(QuantDescriptor(axis=0))
    assert q.amax is None and not q.has_amax
    q.set_amax(torch.tensor([[1.0], [2.0]]))
    assert q.has_amax and q.amax.shape == (2, 1)
    with pytest.raises(RuntimeError, match=r"shape \(2, 1\), got \(3,\)"):
        q.set_amax([1.0, 2.0, 3.0])
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="finite and non-negative"):
            q.set_amax(np.full((2, 1), bad, dtype=np.float32))
    with pytest.raises(ValueError, match="reset_amax"):
        q.set_amax(None)
    with pytest.raises(ValueError, match="number or an array of numbers"):
        q.set_amax("wide")
    assert q.amax.flatten().tolist() == [1.0, 2.0]  # a refused value changes nothing
    q.amax = torch.tensor([[4.0], [0.0]])  # the property setter takes the same path
    assert q.amax.flatten().tolist() == [4.0, 0.0]
    q.reset_amax()
    q.set_amax(3.0)  # after a reset, any shape
    assert q.amax.shape == () and float(q.amax) == 3.0


def test_replace_amax_keeps_a_stored_nan_and_new_shape():
    q = TensorQuantizer()
    q.set_amax(1.0)
    q.replace_amax(torch.tensor([math.nan, 2.0]))
    assert q.amax.shape == (2,) and math.isnan(float(q.amax[0]))
    assert q.amax_summary(".1f") == "[nan, nan](2)"  # torch.min/max propagate NaN
    with pytest.raises(TypeError, match="tensor"):
        q.replace_amax([1.0])


def test_helpers_work_with_model_apply():
    model = _model()
    model.apply(quant.disable_fake_quant)
    assert all(not q.is_quant_enabled for q in _quantizers(model))
    x = torch.randn(2, 4)
    float_out = nn.functional.linear(nn.functional.relu(nn.functional.linear(x, model[0].weight, model[0].bias)),
                                     model[2].weight, model[2].bias)
    assert torch.equal(model(x), float_out)
    model.apply(quant.enable_fake_quant)
    assert not torch.equal(model(x), float_out)  # 8-bit dynamic-range fake quant changes the values

    model.apply(quant.enable_observer)
    assert all(q.is_calib_enabled for q in _quantizers(model))
    model(x)
    assert all(q.calibrator.batches_seen == 1 for q in _quantizers(model))
    model.apply(quant.disable_observer)
    model(x)
    assert all(q.calibrator.batches_seen == 1 for q in _quantizers(model))

    model.apply(quant.disable_quantizer)
    assert all(not q.is_enabled for q in _quantizers(model))
    assert torch.equal(model(x), float_out)
    model.apply(quant.enable_quantizer)
    assert all(q.is_enabled for q in _quantizers(model))
    # modules that are not quantizers are left alone (ReLU, Linear, the Sequential)
    assert isinstance(model[1], nn.ReLU)


def test_bypass_restores_exact_flags_after_an_exception():
    model = _model()
    first_in = model[0].input_quantizer
    first_in.disable()  # already off before: must stay off afterwards
    model[2].weight_quantizer.disable_quant()
    x = torch.randn(2, 4)
    before = quant.quantizer_state(model)
    quantized = model(x)
    with pytest.raises(RuntimeError, match="boom"):
        with quant.bypass_quantization(model) as inside:
            assert inside is model
            assert all(not q.is_enabled for q in _quantizers(model))
            raise RuntimeError("boom")
    assert quant.quantizer_state(model) == before
    assert not first_in.is_enabled and model[0].weight_quantizer.is_enabled
    assert torch.equal(model(x), quantized)


def test_bypass_gives_the_float_output_and_restores_by_identity():
    model = _model()
    x = torch.randn(2, 4)
    quantized = model(x)
    with quant.bypass_quantization(model):
        float_out = model(x)
        moved = model[0]._modules.pop("_input_quantizer")  # renamed inside the block
        model[0]._modules["_input_quantizer"] = moved
    assert not torch.equal(float_out, quantized)
    assert torch.equal(model(x), quantized)
    with pytest.raises(TypeError, match="nn.Module"):
        with quant.bypass_quantization("model"):
            pass


def test_learning_amax_round_trip():
    q = TensorQuantizer()
    q.set_amax(2.0)
    q.start_learning_amax(2.0)
    assert q.learn_amax and q.is_clip_enabled and float(q.clip.clip_value_max.detach()) == 2.0
    with pytest.raises(ValueError, match="already"):
        q.start_learning_amax(1.0)
    q.stop_learning_amax()
    assert not q.learn_amax and not q.is_clip_enabled and not hasattr(q, "clip")
    with pytest.raises(ValueError, match="does not learn"):
        q.stop_learning_amax()


def test_config_key_follows_every_switch():
    q = TensorQuantizer()
    keys = {q.config_key()}
    for switch in (q.disable, q.disable_quant, q.enable_calib):
        switch()
        keys.add(q.config_key())
    q.rounding = "onnx"
    keys.add(q.config_key())
    assert len(keys) == 5


def test_face_exports_the_helpers():
    for name in ("bypass_quantization", "enable_fake_quant", "disable_fake_quant", "enable_observer",
                 "disable_observer", "enable_quantizer", "disable_quantizer", "disable_quantization",
                 "enable_quantization", "quantizer_state", "restore_quantizer_state"):
        assert callable(getattr(quant, name)), name
