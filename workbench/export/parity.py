"""Where onnxruntime and the fake-quant PyTorch model part, and why: the diagnosis behind a failed parity check.

A cosine below the threshold says *that* the file and the model disagree, not where. :func:`diagnose` finds it:

1. PyTorch: the fake-quant model runs on the failing check's inputs with ONNX's rounding, and a forward hook on
   every active quantizer keeps what it got and what it returned (the tensors at each Q/DQ boundary).
2. onnxruntime: a copy of the file lists every activation QuantizeLinear's input and DequantizeLinear's output as
   graph outputs; the Q/DQ nodes carry their quantizer's name (``conv1._input_quantizer/QuantizeLinear``), so each
   is matched to the PyTorch call it stands for.
3. The *cut* run: a second copy takes each matched DequantizeLinear output as a graph input and is fed PyTorch's
   value for it. Every Q input (and graph output) is then computed by onnxruntime from PyTorch's own upstream
   values: a segment that still differs computes an operation differently (a wrong graph), whatever happened
   upstream. Inside the first such segment, module outputs (PyTorch forward hooks; ONNX nodes carry their module,
   :mod:`workbench.export.naming`) narrow it to the first module whose output parts while its inputs agree.
4. Where no segment differs on its own, the disagreement is rounding: values within float error of a .5 boundary
   flip one quantization step, and the flips travel. How far they may travel is the model's own business: the
   fake-quant model is run again on its inputs moved by one ulp, and that spread is compared with the file's
   disagreement. Within it: rounding accumulated in a sensitive network; far beyond it: unexplained.

The diagnosis is data (:class:`ParityDiagnosis`), with :meth:`ParityDiagnosis.text` for the report.
"""
from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from workbench.export.naming import node_module
from workbench.export.parity_selection import after_selection, selection_verdict

__all__ = ["VERDICTS", "Boundary", "ParityDiagnosis", "diagnose", "one_ulp_spread", "nudged_by_one_ulp", "input_nudge",
           "within_sensitivity", "SENSITIVITY_FACTOR"]

# what a diagnosis concludes, one definition for the report, the CLI and the GUI
VERDICTS = {
    "operation": "an operation computed differently (a wrong graph)",
    "shape": "a shape fixed in the graph at the sample's size",
    "rounding": "rounding flips accumulating in a sensitive network",
    "unexplained": "rounding flips only, yet far more than the model's own 1-ulp sensitivity",
    "selection": "the outputs after a selection by value (NMS, top-k) part; everything before it agrees",
}
# A segment between two Q/DQ boundaries computed by onnxruntime from PyTorch's own inputs differs by float
# error only (float32 sums in another order: ~1e-6 of the values' scale); beyond this it computes something else.
LOCAL_TOLERANCE = 1e-3
# the file's disagreement is "within the model's sensitivity" up to this multiple of its 1-ulp spread
SENSITIVITY_FACTOR = 10.0
_QUANTIZE, _DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"


@dataclass(frozen=True)
class Boundary:
    """One compared tensor: a quantizer's input (its QuantizeLinear) or a graph output.

    ``max_abs_diff``/``cosine``: onnxruntime's value in the full run against PyTorch's. ``local_diff``: the largest
    difference, relative to PyTorch's largest value, when onnxruntime computes it from PyTorch's upstream values
    (the cut run); ``steps``: the full run's largest difference in quantization steps; ``flipped``: codes that
    differ after the quantizer, ``ties`` of them one step apart with PyTorch's value within float error of a .5
    boundary."""

    name: str
    kind: str  # "quantizer" or "output"
    module: str
    shape: tuple[int, ...]
    max_abs_diff: float
    cosine: float
    local_diff: float | None
    steps: float | None = None
    flipped: int = 0
    ties: int = 0
    size: int = 0
    ort_shape: tuple[int, ...] | None = None  # an output onnxruntime returns at another shape than PyTorch's


@dataclass
class ParityDiagnosis:
    """Where and why onnxruntime and the fake-quant model part on one check (see the module's docstring)."""

    check: str
    verdict: str  # a key of VERDICTS
    first: str | None  # the first boundary (quantizer or output) that parts
    module: str | None  # the module (or node) found responsible
    nodes: list[str] = field(default_factory=list)  # the ONNX nodes of the parting segment
    reason: str = ""
    disagreement_cosine: float = 1.0
    disagreement_max_abs_diff: float = 0.0
    sensitivity_cosine: float | None = None  # the fake-quant model's worst cosine under a 1-ulp input change
    sensitivity_max_abs_diff: float | None = None
    boundaries: list[Boundary] = field(default_factory=list)  # the compared tensors around the parting point

    def text(self) -> str:
        """The diagnosis in a few sentences (the report, the CLI, the GUI's export dialog)."""
        lines = [f"parity diagnosis ({self.check}): {VERDICTS.get(self.verdict, self.verdict)}."]
        if self.reason:
            lines.append(self.reason)
        if self.sensitivity_cosine is not None:
            lines.append(f"The fake-quant model itself moves by up to {self.sensitivity_max_abs_diff:.3g} (cosine "
                         f"{self.sensitivity_cosine:.6f}) when its input and each quantizer's input change by 1 ulp; "
                         "the file differs by "
                         f"{self.disagreement_max_abs_diff:.3g} (cosine {self.disagreement_cosine:.6f}).")
        return " ".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with :meth:`text` under ``"text"`` (what the report's readers show)."""
        return {**asdict(self), "label": VERDICTS.get(self.verdict, self.verdict), "text": self.text()}


# ----- PyTorch's side --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _onnx_rounding(quantizers: Sequence[nn.Module]) -> Iterator[None]:
    saved = [(q, q.rounding) for q in quantizers]
    try:
        for q in quantizers:
            q.rounding = "onnx"
        yield
    finally:
        for q, value in saved:
            q.rounding = value


def _capture(model: nn.Module, inputs: tuple[torch.Tensor, ...], quantizers: dict[str, nn.Module],
             modules: dict[str, nn.Module] | None = None) -> tuple[dict[str, list[tuple[np.ndarray, np.ndarray]]],
                                                                   dict[str, list[np.ndarray]]]:
    """Each activation quantizer's calls (input, output) and each of ``modules``' tensor outputs, on ``inputs``."""
    calls: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    outputs: dict[str, list[np.ndarray]] = {}
    handles = []

    def keep(name):
        def hook(module, args, output):
            if args and isinstance(args[0], torch.Tensor) and not isinstance(args[0], nn.Parameter) \
                    and isinstance(output, torch.Tensor):
                calls.setdefault(name, []).append((_numpy(args[0]), _numpy(output)))
        return hook

    def keep_output(name):
        def hook(module, args, output):
            if isinstance(output, torch.Tensor):
                outputs.setdefault(name, []).append(_numpy(output))
        return hook

    for name, quantizer in quantizers.items():
        handles.append(quantizer.register_forward_hook(keep(name)))
    for name, module in (modules or {}).items():
        handles.append(module.register_forward_hook(keep_output(name)))
    try:
        with torch.no_grad(), _onnx_rounding(list(quantizers.values())):
            model(*(t.clone() for t in inputs))
    finally:
        for handle in handles:
            handle.remove()
    return calls, outputs


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()
    return tensor.numpy().copy()


def nudged_by_one_ulp(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``tensor`` with every value moved by one ulp, up or down at random."""
    up = (torch.rand(tensor.shape, generator=generator) < 0.5).to(tensor.device)
    target = torch.where(up, torch.full_like(tensor, math.inf), torch.full_like(tensor, -math.inf))
    return torch.nextafter(tensor, target)


def input_nudge(generator: torch.Generator) -> Callable[[nn.Module, tuple], tuple | None]:
    """A forward pre-hook for a quantizer: its floating-point input (not a weight) moved by one ulp."""
    def nudge(_module: nn.Module, args: tuple) -> tuple | None:
        if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() \
                and not isinstance(args[0], nn.Parameter):
            return (nudged_by_one_ulp(args[0], generator), *args[1:])
        return None
    return nudge


def one_ulp_spread(model: nn.Module, inputs: tuple[torch.Tensor, ...], reference: Sequence[torch.Tensor],
                   quantizers: Sequence[nn.Module], tries: int = 2) -> tuple[float, float] | None:
    """The fake-quant model's own sensitivity: its outputs' worst (cosine, max abs diff) against ``reference`` when
    every floating-point input, and the input of every quantizer, moves by one ulp (up or down at random).

    The quantizers' inputs are moved too because the first quantizer absorbs a 1-ulp change of the model's input
    (no value crosses a rounding boundary: the outputs do not move at all), while another kernel's float
    rounding (onnxruntime's) reaches every quantizer. None without a floating-point input."""
    if not any(t.is_floating_point() for t in inputs):
        return None
    generator = torch.Generator().manual_seed(0)
    nudge = input_nudge(generator)
    worst_cosine, worst_diff = 1.0, 0.0
    handles = [q.register_forward_pre_hook(nudge) for q in quantizers]
    try:
        for _ in range(tries):
            moved = tuple(nudged_by_one_ulp(t, generator) if t.is_floating_point() else t for t in inputs)
            with torch.no_grad(), _onnx_rounding(quantizers):
                out = model(*moved)
            for ref, got in zip(reference, out if isinstance(out, (tuple, list)) else (out,)):
                if not (isinstance(got, torch.Tensor) and got.is_floating_point()):
                    continue
                # a detector keeps another number of boxes when a score moves by an ulp: that output parts entirely
                cosine, diff = _compare(_numpy(ref), _numpy(got)) if got.shape == ref.shape else (0.0, math.inf)
                worst_cosine, worst_diff = min(worst_cosine, cosine), max(worst_diff, diff)
    finally:
        for handle in handles:
            handle.remove()
    return worst_cosine, worst_diff


def within_sensitivity(disagreement: tuple[float, float], spread: tuple[float, float]) -> bool:
    """Whether a (cosine, max abs diff) disagreement is within :data:`SENSITIVITY_FACTOR` times a 1-ulp ``spread``
    (:func:`one_ulp_spread`'s (cosine, max abs diff)) by either measure: rounding, not another computation."""
    gap, own = 1.0 - disagreement[0], 1.0 - spread[0]
    return not (gap > SENSITIVITY_FACTOR * max(own, 1e-7)
                and disagreement[1] > SENSITIVITY_FACTOR * max(spread[1], 1e-7))


def _compare(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(cosine, max abs diff) of two arrays of one shape, over the values finite in both."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    finite = np.isfinite(a64) & np.isfinite(b64)
    a64, b64 = a64[finite], b64[finite]
    if not a64.size:
        return 1.0, 0.0
    diff = float(np.abs(a64 - b64).max())
    na, nb = float(np.linalg.norm(a64)), float(np.linalg.norm(b64))
    if na == 0.0 and nb == 0.0:
        return 1.0, diff
    if na == 0.0 or nb == 0.0:
        return 0.0, diff
    return float(np.dot(a64, b64) / (na * nb)), diff


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over max |a| (finite values), the measure of a segment's own error."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(a64) & np.isfinite(b64)
    if not finite.any():
        return 0.0
    scale = float(np.abs(a64[finite]).max())
    diff = float(np.abs(a64[finite] - b64[finite]).max())
    return diff / scale if scale > 0 else diff


# ----- onnxruntime's side ----------------------------------------------------------------------------------------


@dataclass
class _QDQ:
    quantizer: str
    q_input: str
    dq_output: str
    dq_node: str
    scale: np.ndarray | None
    axis: int | None
    order: int


def _qdq_pairs(proto: onnx.ModelProto, quantizers: set[str]) -> list[_QDQ]:
    """Every activation Q -> (Clip) -> DQ of the graph whose Q is named after one of ``quantizers``, in graph
    order (weight Q/DQ, on initializers, stay inside the segments that read them)."""
    initializers = {i.name: i for i in proto.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    pairs = []
    for order, node in enumerate(proto.graph.node):
        if node.op_type != _QUANTIZE or node.input[0] in initializers or "/" not in node.name:
            continue
        quantizer = node.name.rsplit("/", 1)[0]
        if quantizer not in quantizers:
            continue
        after = consumers.get(node.output[0], [])
        if after and after[0].op_type == "Clip":
            after = consumers.get(after[0].output[0], [])
        dq = next((n for n in after if n.op_type == _DEQUANTIZE), None)
        if dq is None:
            continue
        scale_init = initializers.get(node.input[1])
        scale = None
        if scale_init is not None and scale_init.data_location != onnx.TensorProto.EXTERNAL:
            scale = numpy_helper.to_array(scale_init).astype(np.float64)
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        pairs.append(_QDQ(quantizer, node.input[0], dq.output[0], dq.name, scale, axis, order))
    return pairs


def _session(proto: onnx.ModelProto, folder: Path):
    """An onnxruntime session (optimizations off: the graph as written) over ``proto`` saved in ``folder``, where
    its external data file, if any, lies."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    with tempfile.NamedTemporaryFile(suffix=".diagnosis.onnx", dir=folder, delete=False) as handle:
        path = Path(handle.name)
    try:
        onnx.save(proto, str(path))
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    finally:
        path.unlink(missing_ok=True)


def _with_outputs(proto: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    present = {o.name for o in copy.graph.output}
    for name in names:
        if name not in present:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return copy


def _cut(proto: onnx.ModelProto, cut: dict[str, np.ndarray], outputs: Sequence[str]) -> onnx.ModelProto:
    """``proto`` with the DequantizeLinear nodes producing the tensors of ``cut`` removed, those tensors graph
    inputs instead, and ``outputs`` listed as graph outputs."""
    copy = _with_outputs(proto, outputs)
    kept = [n for n in copy.graph.node if not (n.op_type == _DEQUANTIZE and n.output[0] in cut)]
    del copy.graph.node[:]
    copy.graph.node.extend(kept)
    for name, value in cut.items():
        element = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        copy.graph.input.append(onnx.helper.make_tensor_value_info(name, element, None))
    return copy


def _segment(proto: onnx.ModelProto, tensor: str, stops: set[str]) -> list[onnx.NodeProto]:
    """The nodes that compute ``tensor`` from ``stops`` (cut tensors), graph inputs and initializers, in order."""
    producers = {out: (i, n) for i, n in enumerate(proto.graph.node) for out in n.output}
    found: dict[int, onnx.NodeProto] = {}
    todo = [tensor]
    while todo:
        name = todo.pop()
        if name in stops or name not in producers:
            continue
        index, node = producers[name]
        if index in found:
            continue
        found[index] = node
        todo.extend(i for i in node.input if i)
    return [found[i] for i in sorted(found)]


# ----- the diagnosis ---------------------------------------------------------------------------------------------


def diagnose(model: nn.Module, proto: onnx.ModelProto, folder: Path, inputs: tuple[torch.Tensor, ...],
             input_names: Sequence[str], output_names: Sequence[str], quantizers: dict[str, nn.Module],
             check: str, shape_check: bool = False, min_cosine: float = 0.999) -> ParityDiagnosis:
    """Find where onnxruntime running ``proto`` and the fake-quant ``model`` part on ``inputs`` (see the module's
    docstring).

    Args:
        model: the fake-quant model as exported (its forward returns the graph's outputs as a tuple).
        proto: the exported graph after the naming passes (its Q/DQ nodes named after their quantizers).
        folder: where the graph's external data file lies (the copies are written there, then removed).
        quantizers: the exported (active) quantizers by name.
        check: what was checked ("sample inputs", "batch size 2", ...), for the text.
        shape_check: the check runs the graph at another shape than the sample's, which passed.
        min_cosine: the parity threshold (a detector's boundaries before its selections must meet it).
    """
    calls, _ = _capture(model, inputs, quantizers)
    with torch.no_grad(), _onnx_rounding(list(quantizers.values())):
        reference = model(*(t.clone() for t in inputs))
    reference = [_numpy(t) for t in (reference if isinstance(reference, (tuple, list)) else (reference,))]
    pairs = _qdq_pairs(proto, set(quantizers))
    feeds = {name: t.detach().cpu().numpy() for name, t in zip(input_names, inputs)}

    listed = [name for pair in pairs for name in (pair.q_input, pair.dq_output)]
    session = _session(_with_outputs(proto, listed), folder)
    names = [o.name for o in session.get_outputs()]
    full = dict(zip(names, session.run(None, feeds)))
    del session

    # each Q/DQ pair of the graph stands for one PyTorch call of its quantizer: the one its input matches best
    matched: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for index, pair in enumerate(pairs):
        ort_in = full.get(pair.q_input)
        options = [c for c in calls.get(pair.quantizer, []) if ort_in is not None and c[0].shape == ort_in.shape]
        if options:
            matched[index] = min(options, key=lambda c: float(np.abs(c[0].astype(np.float64) - ort_in).max()
                                                              if c[0].size else 0.0))
    cut = {pairs[i].dq_output: matched[i][1].astype(full[pairs[i].dq_output].dtype) for i in matched
           if pairs[i].dq_output in full and pairs[i].dq_output not in feeds}
    compared = [pairs[i].q_input for i in matched] + list(output_names)
    session = _session(_cut(proto, cut, compared), folder)
    local = dict(zip([o.name for o in session.get_outputs()], session.run(None, {**feeds, **cut})))
    del session

    nodes_by_output = {out: n for n in proto.graph.node for out in n.output}
    boundaries = _boundaries(pairs, matched, full, local, nodes_by_output, output_names, reference)
    disagreement = min(((b.cosine, b.max_abs_diff) for b in boundaries if b.kind == "output"), default=(1.0, 0.0))
    diagnosis = ParityDiagnosis(check, "rounding", None, None, disagreement_cosine=disagreement[0],
                                disagreement_max_abs_diff=disagreement[1])
    parting = next((b for b in boundaries if b.local_diff is not None and b.local_diff > LOCAL_TOLERANCE), None)
    tensors = {_boundary_name(p, pairs): p.q_input for i, p in enumerate(pairs) if i in matched}
    tensors.update({name: name for name in output_names})
    reshaped = [f"output {b.name!r}: onnxruntime shape {b.ort_shape}, PyTorch {b.shape}" for b in boundaries
                if b.ort_shape is not None]
    downstream, selections = after_selection(proto)
    selected = selection_verdict(boundaries, tensors, None if parting is None else tensors.get(parting.name),
                                 downstream, selections, min_cosine)
    if selected is not None:  # a detector: compared before its NMS / top-k (workbench.export.parity_selection)
        diagnosis.verdict, diagnosis.reason = "selection", selected + "".join(f" ({r})" for r in reshaped[:3])
        diagnosis.boundaries = [b for b in boundaries if tensors.get(b.name) not in downstream][-3:] + \
            [b for b in boundaries if b.kind == "output"]
        return diagnosis
    if parting is not None and parting.ort_shape is not None:
        diagnosis.verdict, diagnosis.first, diagnosis.module = "shape", parting.name, parting.module or None
        diagnosis.reason = (f"From PyTorch's own values up to it, onnxruntime still computes output {parting.name!r} "
                            f"at shape {parting.ort_shape} where PyTorch's is {parting.shape}: the graph holds a size "
                            "the sample fixed when it was traced (a value read into Python, a loop unrolled), "
                            f"computed in module '{parting.module or '<model>'}'.")
        reshaped = [r for r in reshaped if f"{parting.name!r}" not in r]
    elif parting is not None:
        tensor = next((p.q_input for i, p in enumerate(pairs) if i in matched and _boundary_name(p, pairs) ==
                       parting.name), parting.name)
        segment = _segment(_cut(proto, cut, []), tensor, set(cut))
        _explain_operation(diagnosis, parting, segment, model, inputs, quantizers, proto, folder, cut, feeds,
                           shape_check)
    else:
        _explain_rounding(diagnosis, boundaries, model, inputs, quantizers, reference)
    if reshaped:  # whatever the verdict, the shapes that differ are said
        diagnosis.reason += " " + "; ".join(reshaped[:3]) + "."
    diagnosis.boundaries = _around(boundaries, diagnosis.first)
    return diagnosis


def _boundary_name(pair: _QDQ, pairs: list[_QDQ]) -> str:
    same = [p for p in pairs if p.quantizer == pair.quantizer]
    return pair.quantizer if len(same) == 1 else f"{pair.quantizer} (call {same.index(pair) + 1})"


def _boundaries(pairs: list[_QDQ], matched: dict[int, tuple[np.ndarray, np.ndarray]], full: dict[str, np.ndarray],
                local: dict[str, np.ndarray], nodes_by_output: dict[str, onnx.NodeProto],
                output_names: Sequence[str], reference: list[np.ndarray]) -> list[Boundary]:
    """Every compared tensor in graph order: the matched quantizer inputs, then the graph outputs."""
    found = []
    for index, pair in enumerate(pairs):
        if index not in matched:
            continue
        pt_in, pt_out = matched[index]
        ort_in, ort_out = full[pair.q_input], full[pair.dq_output]
        cosine, diff = _compare(pt_in, ort_in)
        steps = flipped = ties = None
        if pair.scale is not None:
            scale = _broadcast(pair.scale, pair.axis, pt_in.ndim)
            steps = float(np.abs(pt_in.astype(np.float64) - ort_in).max() / np.min(scale)) if pt_in.size else 0.0
            codes_pt = np.rint(pt_out.astype(np.float64) / scale)
            codes_ort = np.rint(ort_out.astype(np.float64) / scale)
            flips = codes_pt != codes_ort
            flipped = int(flips.sum())
            # a tie: one step apart, and the two inputs lie on either side of the .5 boundary between the codes
            position = pt_in.astype(np.float64) / scale
            fraction = np.abs(position - np.floor(position) - 0.5)
            moved = np.abs(pt_in.astype(np.float64) - ort_in) / scale
            ties = int((flips & (np.abs(codes_pt - codes_ort) == 1) & (fraction <= moved + 1e-6)).sum())
        producer = nodes_by_output.get(pair.q_input)
        local_value = local.get(pair.q_input)
        found.append(Boundary(_boundary_name(pair, pairs), "quantizer", _module(producer), tuple(pt_in.shape), diff,
                              cosine, None if local_value is None else _relative(pt_in, local_value), steps,
                              flipped or 0, ties or 0, int(pt_in.size)))
    for name, ref in zip(output_names, reference):
        got = full.get(name)
        if got is not None and got.shape != ref.shape:  # another number of boxes after a selection, or worse
            local_value = local.get(name)  # from PyTorch's own upstream values, still another shape: the segment's
            local_diff = None if local_value is None else 0.0 if local_value.shape == ref.shape else math.inf
            found.append(Boundary(name, "output", _module(nodes_by_output.get(name)), tuple(ref.shape), math.inf,
                                  0.0, local_diff, size=int(ref.size), ort_shape=tuple(got.shape)))
            continue
        if got is None or ref.dtype.kind not in "fc":
            continue
        cosine, diff = _compare(ref, got)
        local_value = local.get(name)
        found.append(Boundary(name, "output", _module(nodes_by_output.get(name)), tuple(ref.shape), diff, cosine,
                              None if local_value is None or local_value.shape != ref.shape
                              else _relative(ref, local_value), size=int(ref.size)))
    return found


def _broadcast(scale: np.ndarray, axis: int | None, ndim: int) -> np.ndarray:
    if scale.ndim == 0 or scale.size == 1:
        return scale.reshape(())
    shape = [1] * ndim
    shape[axis if axis is not None else 1] = scale.size
    return scale.reshape(shape)


def _module(node: onnx.NodeProto | None) -> str:
    if node is None:
        return ""
    return node_module(node) or ""


def _around(boundaries: list[Boundary], first: str | None, width: int = 3) -> list[Boundary]:
    """The boundaries just before and after ``first`` (the first few without one), for the JSON report."""
    names = [b.name for b in boundaries]
    at = names.index(first) if first in names else 0
    kept = boundaries[max(0, at - width):at + width + 1]
    outputs = [b for b in boundaries if b.kind == "output" and b not in kept]
    return kept + outputs


def _explain_operation(diagnosis: ParityDiagnosis, parting: Boundary, segment: list[onnx.NodeProto],
                       model: nn.Module, inputs: tuple[torch.Tensor, ...], quantizers: dict[str, nn.Module],
                       proto: onnx.ModelProto, folder: Path, cut: dict[str, np.ndarray],
                       feeds: dict[str, np.ndarray], shape_check: bool) -> None:
    """The segment before ``parting`` computes something else from the same inputs: narrow it to a module."""
    diagnosis.verdict = "shape" if shape_check else "operation"
    diagnosis.first = parting.name
    diagnosis.nodes = [n.name for n in segment]
    where = f"the input of {parting.name}" if parting.kind == "quantizer" else f"output {parting.name!r}"
    culprit = _first_parting_module(segment, model, inputs, quantizers, proto, folder, cut, feeds)
    if culprit is not None:
        module, op_types, relative, upstream = culprit
        diagnosis.module = module
        inputs_text = (f"its inputs agree (relative difference {upstream:.2g})" if upstream is not None
                       else "its inputs come from agreeing Q/DQ boundaries")
        what = (f"module '{module}' ({', '.join(op_types)} in the graph) is the first whose output parts: "
                f"{inputs_text}, its output differs by {relative:.3g} of its largest value")
    else:
        diagnosis.module = parting.module or None
        what = "the nodes between the last agreeing Q/DQ boundaries and it: " + ", ".join(
            diagnosis.nodes[:8]) + (" ..." if len(diagnosis.nodes) > 8 else "")
    diagnosis.reason = (f"Given PyTorch's own values at the Q/DQ boundaries before it, onnxruntime computes "
                        f"{where} {parting.local_diff:.3g} (relative) away from PyTorch, far beyond float error: "
                        f"{what}.")
    if shape_check:
        diagnosis.reason += (" The sample's shape agrees, so the graph holds a size of the sample (a loop unrolled "
                             "at its length, a shape folded to a constant); export with a static shape, or fix the "
                             "model's forward so that the size is computed.")


def _module_outputs(segment: list[onnx.NodeProto]) -> dict[str, str]:
    """module path -> the tensor of the segment that is that module's output (the last one its nodes produce
    that a node of another module reads, or the segment's result)."""
    modules: dict[str, str] = {}
    module_of = {out: node_module(n) or "" for n in segment for out in n.output}
    readers: dict[str, set[str]] = {}
    for node in segment:
        for name in node.input:
            readers.setdefault(name, set()).add(node_module(node) or "")
    last = segment[-1].output[0] if segment else None
    for node in segment:
        module = node_module(node) or ""
        if not module or node.op_type in (_QUANTIZE, _DEQUANTIZE, "Clip"):
            continue
        for out in node.output:
            if out == last or readers.get(out, set()) - {module} - {m for m in readers.get(out, set())
                                                                    if m.startswith(module + ".")}:
                modules[module] = out
    # a parent's output equals its last child's: keep each tensor once, under its innermost module
    innermost: dict[str, str] = {}
    for module, tensor in modules.items():
        if tensor not in innermost or len(module) > len(innermost[tensor]):
            innermost[tensor] = module
    return {module: tensor for tensor, module in innermost.items() if module_of.get(tensor) is not None}


def _first_parting_module(segment: list[onnx.NodeProto], model: nn.Module, inputs: tuple[torch.Tensor, ...],
                          quantizers: dict[str, nn.Module], proto: onnx.ModelProto, folder: Path,
                          cut: dict[str, np.ndarray], feeds: dict[str, np.ndarray]
                          ) -> tuple[str, list[str], float, float | None] | None:
    """The first module of ``segment`` (graph order) whose output, computed by onnxruntime from PyTorch's values
    at the boundaries, differs from its PyTorch output; with its ops, that difference and its inputs' difference."""
    outputs = _module_outputs(segment)
    if not outputs:
        return None
    inner = model.model if hasattr(model, "model") and isinstance(model.model, nn.Module) else model
    named = dict(inner.named_modules())
    hooked = {name: named[name] for name in outputs if name in named}
    if not hooked:
        return None
    _, captured = _capture(model, inputs, quantizers, hooked)
    session = _session(_cut(proto, cut, [outputs[m] for m in hooked]), folder)
    local = dict(zip([o.name for o in session.get_outputs()], session.run(None, {**feeds, **cut})))
    del session
    order = {out: i for i, n in enumerate(segment) for out in n.output}
    previous: float | None = None
    for module in sorted(hooked, key=lambda m: order.get(outputs[m], 0)):
        got = local.get(outputs[module])
        candidates = [c for c in captured.get(module, []) if got is not None and c.shape == got.shape]
        if not candidates:
            continue
        relative = min(_relative(c, got) for c in candidates)
        if relative > LOCAL_TOLERANCE:
            ops = sorted({n.op_type for n in segment if (node_module(n) or "") == module})
            return module, ops, relative, previous
        previous = relative if previous is None else max(previous, relative)
    return None


def _explain_rounding(diagnosis: ParityDiagnosis, boundaries: list[Boundary], model: nn.Module,
                      inputs: tuple[torch.Tensor, ...], quantizers: dict[str, nn.Module],
                      reference: list[np.ndarray]) -> None:
    """No segment computes anything else: the codes flip at ties and the flips travel. Weigh them against the
    model's own 1-ulp sensitivity."""
    flipped = next((b for b in boundaries if b.flipped), None)
    spread = one_ulp_spread(model, inputs, [torch.from_numpy(r) for r in reference], list(quantizers.values()))
    if spread is not None:
        diagnosis.sensitivity_cosine, diagnosis.sensitivity_max_abs_diff = spread
    if flipped is not None:
        diagnosis.first = flipped.name
        diagnosis.module = flipped.module or None
        share = f"{flipped.ties} of the {flipped.flipped}" if flipped.ties != flipped.flipped else \
            f"all {flipped.flipped}"
        text = (f"Every operation computes what PyTorch does from the same inputs; the first quantization codes that "
                f"differ are at {flipped.name} ({flipped.flipped} of {flipped.size} values), {share} of them "
                "rounding ties: values within float error of a .5 boundary that flip one step; later layers carry "
                "the flips to the outputs.")
    else:
        text = "Every operation computes what PyTorch does from the same inputs and no quantization code differs."
    if spread is not None:
        if not within_sensitivity((diagnosis.disagreement_cosine, diagnosis.disagreement_max_abs_diff), spread):
            diagnosis.verdict = "unexplained"
            text += (" But the file's disagreement is far larger than the model's own 1-ulp sensitivity: check the "
                     "boundaries listed in the JSON report.")
        else:
            text += (" That is within the model's own sensitivity to a 1-ulp change of its input: the graph is "
                     "right; lower the parity threshold (export.min_cosine) or compare on more data.")
    diagnosis.reason = text

