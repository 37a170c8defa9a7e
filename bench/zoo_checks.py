"""One architecture of the conformance sweep, end to end through the Session, and the checks of its row.

:func:`run_entry` does what ``quant-workbench new -> calibrate -> export`` does with the defaults and reads the
row's checks off the exported graph: weight GEMMs (Conv/Gemm/MatMul with a constant weight) with Q/DQ on the
weight, attention products (MatMuls between two activations) with Q/DQ on both inputs, and the ONNX outputs
against the tensors the model returns. :func:`attention_products` and :func:`tensor_leaves` are shared with the
tests (tests/zoo/).
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from zoo_factories import revive_degenerate_weights, set_batchnorm_statistics

# ops TensorRT moves a DequantizeLinear across (they only move data): a DQ -> Transpose -> MatMul is quantized
SHAPE_OPS = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Flatten", "Identity", "Cast"}


def attention_products(path: str | Path, not_attention: dict[str, int] | None = None) -> tuple[int, int]:
    """(MatMuls between two activations with DequantizeLinear on both inputs, all MatMuls between two activations)
    in the ONNX file at ``path``. A MatMul input counts as quantized when a DequantizeLinear produces it, directly
    or through ops that only move data (``SHAPE_OPS``).

    ``not_attention``: module -> how many of its products the placement rules left in float as no attention (a
    state-space model's scan steps: ``workbench.graph.placement.is_attention``, as ``show`` lists them); that many
    float MatMuls of the module (the node's module, ``workbench.export.naming.node_module``) are not counted."""
    import onnx

    from workbench.export.naming import node_module

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    constants = {i.name for i in graph.initializer}
    memo: dict[str, bool] = {}

    def constant(name: str) -> bool:
        if name in constants:
            return True
        if name in memo:
            return memo[name]
        memo[name] = False  # a cycle cannot happen in ONNX, but guard the recursion
        node = producer.get(name)
        memo[name] = node is not None and (node.op_type in ("Constant", "ConstantOfShape", "Shape") or all(
            constant(i) for i in node.input if i))
        return memo[name]

    def dequantized(name: str) -> bool:
        node = producer.get(name)
        while node is not None and node.op_type in SHAPE_OPS:
            node = producer.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    excused = dict(not_attention or {})
    products = quantized = 0
    for node in graph.node:
        # an Einsum of two activations is a product too (torchvision's MaxViT writes its attention so)
        if node.op_type not in ("MatMul", "Einsum") or len(node.input) < 2 or any(constant(i) for i in node.input[:2]):
            continue
        both = all(dequantized(i) for i in node.input[:2])
        owner = node_module(node) or ""
        if not both and excused.get(owner, 0) > 0:  # left float by a rule that says it is no attention
            excused[owner] -= 1
            continue
        products += 1
        quantized += both
    return quantized, products


def not_attention_products(summary: dict[str, Any]) -> dict[str, int]:
    """module -> products of two activations the placement rules left in float as no attention, read off the
    project's summary (``Session.summary()``, what ``workbench show`` prints)."""
    out: dict[str, int] = {}
    for item in summary.get("functional", {}).get("left_float_operations", []):
        if item.get("kind") == "matmul" and not item.get("attention", True):
            module = "" if item["module"] == "<model>" else item["module"]
            out[module] = out.get(module, 0) + item["count"]
    return out


def _leaves(value: Any):
    """The tensors in a model's output (ModelOutput fields, tuples, lists, dicts, nested), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict of its non-None fields
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)


def tensor_leaves(output: Any) -> int:
    """Distinct tensors a model returned (ModelOutput fields, tuples, lists, dicts, nested); None fields do not
    count, and a tensor returned twice (ultralytics' segmentation head returns its mask prototypes in both of its
    results) is one ONNX output, so it counts once."""
    return len({id(t) for t in _leaves(output)})


def build_source(entry, folder: Path, root: Path, row: dict[str, Any] | None = None):
    """The ModelSpec a user would give for ``entry``: an hf: folder saved here from the tiny config, or a timm
    name with the weights file a trained model comes with where the library's init leaves a weight matrix at zero
    (timm's zero-initialised heads). ``row`` gets the number of weights :func:`revive_degenerate_weights`
    changed."""
    import torch

    from workbench.sources.model_source import ModelSpec

    torch.manual_seed(0)
    if entry.source == "hf":
        import transformers

        transformers.utils.logging.set_verbosity_error()
        config = transformers.AutoConfig.for_model(entry.model_type, **entry.kwargs)
        model = getattr(transformers, entry.target).from_config(config)
        revived = revive_degenerate_weights(model)
        if row is not None:
            row["revived_weights"] = len(revived)
        if entry.batchnorm_statistics_size:  # the catalogue says why (BATCHNORM_STATISTICS)
            set_batchnorm_statistics(model, entry.batchnorm_statistics_size, key="pixel_values")
        target = folder / "model"
        model.save_pretrained(target, safe_serialization=True)
        return ModelSpec("hf", str(target))
    if entry.source == "timm":
        import timm
        from safetensors.torch import save_file

        model = timm.create_model(entry.target, pretrained=False, **entry.kwargs)
        revived = revive_degenerate_weights(model)
        if row is not None:
            row["revived_weights"] = len(revived)
        if not revived:  # the model exactly as timm builds it
            return ModelSpec("timm", entry.target, dict(entry.kwargs))
        weights = folder / "weights.safetensors"  # timm:NAME@weights.safetensors, as a trained model is given
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
        return ModelSpec("timm", entry.target, dict(entry.kwargs), str(weights))
    file, factory = entry.target.rsplit(":", 1)
    return ModelSpec("entrypoint", f"{root / file}:{factory}", dict(entry.kwargs))


def constant_output(output: Any) -> str | None:
    """Why the float model's output says nothing (every floating tensor it returns holds one value: a zero head
    returns its bias whatever the input), or None."""
    import torch

    floats = [t.detach() for t in _leaves(output)
              if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1]
    if not floats or any(float(t.max()) != float(t.min()) for t in floats):
        return None
    values = {float(t.flatten()[0]) for t in floats}
    if values == {0.0}:
        return "float output all zero"
    return f"float output constant ({', '.join(f'{v:g}' for v in sorted(values)[:3])} in every element)"


def degenerate_output(row: dict[str, Any]) -> str | None:
    """Why the row's parity and INT8 SQNR say nothing about the architecture, or None: the float output is
    constant (recorded by :func:`run_entry` as ``degenerate_output``), or the INT8 SQNR is inf (INT8 output
    equal to the float output: on a random network, a constant one), NaN, or 0 dB (INT8 output all zero: every
    amax collapsed). Rows written before the flag existed are judged on their SQNR."""
    if row.get("degenerate_output"):
        return row["degenerate_output"]
    sqnr = row.get("sqnr_db")
    if not isinstance(sqnr, (int, float)):
        return None
    if sqnr != sqnr:
        return "INT8 SQNR NaN"
    if sqnr == float("inf"):
        return "INT8 SQNR inf: the INT8 output equals the float output"
    if sqnr == 0.0:
        return "INT8 SQNR 0 dB: the INT8 output is zero"
    return None


def shortfalls(row: dict[str, Any]) -> list[str]:
    """What keeps a finished row from being accepted: the parity not explained, a count short, or an output that
    makes the parity say nothing."""
    out = []
    if row.get("export_ok") and not parity_explained(row):
        out.append(f"file not validated (cosine {row.get('cosine', float('nan')):.6f})")
    for key, what in (("gemms", "weight GEMMs quantized"), ("attention", "attention products quantized"),
                      ("outputs", "outputs kept")):
        pair = row.get(key)
        if isinstance(pair, list) and pair[0] != pair[1]:
            out.append(f"{what} {pair[0]}/{pair[1]}")
    reason = degenerate_output(row)
    if reason:
        out.append(f"output constant: parity says nothing ({reason})")
    return out


def validated(row: dict[str, Any]) -> bool:
    """The file passed the parity check (rows from before the flag was recorded: cosine at the default 0.999)."""
    return bool(row.get("validated", (row.get("cosine") or 0.0) >= 0.999))


def parity_explained(row: dict[str, Any]) -> bool:
    """The file passed the parity check, or was written "not validated" with the diagnosis that explains it as
    rounding (issue 34's "parity explained"): every operation of the file computes what PyTorch does from the same
    inputs, the first codes that differ are rounding ties, and the file's difference is within the fake-quant model's
    own movement under a 1-ulp change of its input (workbench/export/parity.py; a difference far beyond it is
    "unexplained"). A random-weight network that amplifies one flipped code that much is chaotic, not exported
    wrongly; the README lists these rows apart, with both cosines."""
    return validated(row) or (bool(row.get("export_ok")) and row.get("parity_verdict") == "rounding")


def run_entry(entry, root: Path, progress=None) -> dict[str, Any]:
    """``new -> calibrate -> export`` for one architecture; the row (plain data) with what failed where.
    ``progress(row)`` is called as each stage begins (the row then holds ``stage_seconds`` so far): a sweep that
    kills a model at its time limit still knows where the time went."""
    import tempfile
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    row: dict[str, Any] = {"model": entry.name, "family": entry.family, "stage": "build"}
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="zoo-model-") as name:
            folder = Path(name)
            _run(entry, root, folder, row, torch, progress)
    except BaseException as error:  # the row says what failed; the sweep goes on
        lines = [line for line in str(error).splitlines() if line.strip()]
        row["failure"] = f"{row['stage']}: {type(error).__name__}: {lines[0] if lines else ''}"[:400]
        row["traceback"] = "".join(traceback.format_exception(error)[-3:])[-1500:]
    row["seconds"] = time.perf_counter() - start
    if "_stage_start" in row:
        row.setdefault("stage_seconds", {})[row["stage"]] = round(time.perf_counter() - row.pop("_stage_start"), 1)
    row["shortfalls"] = found = shortfalls(row)
    if not row.get("failure") and found:
        row["failure"] = "; ".join(found)
        if row.get("float_gemms"):
            row["failure"] += f" (float: {', '.join(row['float_gemms'][:3])})"
    return row


def _stage(row: dict[str, Any], stage: str, progress) -> None:
    """Begin ``stage``: the time of the one before goes into ``row["stage_seconds"]``."""
    now = time.perf_counter()
    times = row.setdefault("stage_seconds", {})
    previous = row.get("stage")
    if previous is not None and "_stage_start" in row:
        times[previous] = round(now - row["_stage_start"], 1)
    row["stage"], row["_stage_start"] = stage, now
    if progress is not None:
        progress({k: v for k, v in row.items() if k != "_stage_start"})


def _run(entry, root: Path, folder: Path, row: dict[str, Any], torch, progress=None) -> None:
    from workbench.quant.algorithms.batches import run_model
    from workbench.session import Session
    from workbench.sources.data_source import DataSpec

    _stage(row, "build", progress)
    data = folder / "calibration.npz"
    np.savez(data, **entry.inputs())
    spec = build_source(entry, folder, root, row)
    _stage(row, "new", progress)
    session = Session.create(spec, DataSpec("tensors", str(data), batch_size=2), trust_code=True, base_dir=folder)
    with torch.no_grad():
        output = run_model(session.float_model, session.sample_inputs(batch=2), session.device)
        returned = tensor_leaves(run_model(session.float_model, session.sample_inputs(batch=1), session.device))
    constant = constant_output(output)  # two samples: a tensor holding one value holds it for any input
    if constant:
        row["degenerate_output"] = constant
    _stage(row, "calibrate", progress)
    result = session.calibrate()
    row["sqnr_db"] = result.output_sqnr_db
    row["quantizers"] = len(result.quantizers)
    row["unreached"] = len(result.unused)
    _stage(row, "export", progress)
    path = folder / "model.qdq.onnx"
    report = session.export(path)
    _stage(row, "done", progress)
    row["export_ok"] = path.is_file()
    row["validated"] = bool(report.validated)  # a file whose parity check failed is written "not validated"
    row["exporter"] = report.exporter
    row["opset"] = report.opset
    row["cosine"] = float(report.cosine)
    row["gemms"] = [report.weight_gemms - len(report.float_weight_gemms), report.weight_gemms]
    row["float_gemms"] = list(report.float_weight_gemms)
    row["attention"] = list(attention_products(path, not_attention_products(session.summary())))
    row["outputs"] = [len(report.output_names), returned]
    row["qdq_pairs"] = report.qdq_pairs
    row["warnings"] = [w.splitlines()[0][:200] for w in report.warnings][:5]
    diagnosis = getattr(report, "parity_diagnosis", None)
    if diagnosis:  # where and why onnxruntime and the model part (or "selection": validated before NMS / top-k)
        row["parity_verdict"], row["parity_diagnosis"] = diagnosis.get("verdict"), diagnosis.get("text", "")[:1500]
        row["parity_sensitivity_cosine"] = diagnosis.get("sensitivity_cosine")  # the model's own 1-ulp spread
    if row["sqnr_db"] is None and report.int8_vs_fp32:
        row["sqnr_db"] = report.int8_vs_fp32.get("output_sqnr_db")
    reason = degenerate_output(row)
    if reason:
        row["degenerate_output"] = reason


def main() -> None:
    """``python bench/zoo_checks.py NAME``: one architecture in this process (a debugger can follow it), its row
    as JSON."""
    import json
    import sys

    import zoo_catalog

    root = Path(__file__).resolve().parents[1]
    entry = next(e for e in zoo_catalog.all_entries() if e.name == sys.argv[1])
    print(json.dumps(run_entry(entry, root), indent=1))


if __name__ == "__main__":
    main()
