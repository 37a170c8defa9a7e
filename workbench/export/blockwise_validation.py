"""Validation of an exported graph block by block (issue 37 point 4): a decoder whose weights do not fit in memory
twice is checked without ever loading the whole file.

The graph is cut at its decoder blocks' boundaries (:func:`plan_pieces`): every node belongs to the block its
module is in (the ``workbench.module`` metadata :mod:`workbench.export.naming` writes, Q/DQ nodes to their
layer's), and a node outside every block (the embedding, the rotary tables, the mask, the final norm and head) joins
the first piece that reads what it computes, or the piece after the blocks when only the graph's outputs do.
:class:`PiecewiseSession` then runs the pieces in order as one onnxruntime-like session: each piece is a small
model holding only its nodes and its initializers, read from the external data file when that piece runs (a bf16
network's on onnx's reference evaluator, which onnxruntime's missing bf16 CPU kernels leave; the others on
onnxruntime with the graph as written), fed the tensors earlier pieces computed; a tensor no later piece reads is
let go. Each node runs with the same kernel and the same inputs as in the whole graph, so the outputs are the whole
graph's, and the parity checks give the same verdict (tested).

Each block's hidden state (its output the next block reads) is kept for the sample and compared with the
fake-quant PyTorch block's output (:func:`block_parity`): the report's per-block rows, and on a failed check the
first block that parts (:func:`block_diagnosis`), with whether that block alone computes differently (run again
on PyTorch's own input to it) or the blocks' rounding accumulates.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import external_data_helper, helper
from torch import nn

from workbench.export import streamed_weights
from workbench.export.fp4 import fp4_dynamic_quantize_op
from workbench.export.memory import available_memory
from workbench.export.naming import node_module
from workbench.export.network_dtype import bfloat16_matmul_op
from workbench.export.onnx_file import temporary_name
from workbench.export.parity import ParityDiagnosis, input_nudge, nudged_by_one_ulp, within_sensitivity
from workbench.export.reference import rounding, without_cache
from workbench.export.report import OutputParity, ParityCheck
from workbench.export.validation import compare
from workbench.quant.algorithms.block_walk import find_blocks, hidden_of

__all__ = ["Piece", "plan_pieces", "PiecewiseSession", "BlockRow", "block_parity", "block_names", "BEFORE", "AFTER",
           "STREAMED_BLOCK_BY_BLOCK", "BLOCKWISE_NOTE", "BlockwiseValidation", "piecewise_session", "block_rows",
           "block_diagnosis", "block_sensitivity", "blocks_kept", "sample_blocks_kept"]

BEFORE = "before the blocks"
AFTER = "after the blocks"


@dataclass
class Piece:
    """One piece of the graph: a block's nodes (with those outside the blocks that only it and later pieces read),
    what it reads from earlier pieces or the graph's inputs, what later pieces or the graph's outputs read from it,
    and the initializers its nodes read."""

    name: str  # the block's module path, or BEFORE / AFTER
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    initializers: list[str] = field(default_factory=list)
    block_outputs: list[str] = field(default_factory=list)  # outputs computed by the block's own nodes


def block_names(model: nn.Module) -> list[str]:
    """The module paths of the model's decoder (or encoder) blocks, in order; empty when it has none
    (:func:`~workbench.quant.algorithms.block_walk.find_blocks`)."""
    blocks = find_blocks(model)
    return [] if blocks is None else [name for name, _ in blocks.items]


def _block_index(module: str | None, index_of: dict[str, int]) -> int | None:
    if not module:
        return None
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = index_of.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for attribute in node.attribute)


def plan_pieces(graph: onnx.GraphProto, blocks: Sequence[str]) -> list[Piece] | None:
    """The pieces of ``graph`` cut at ``blocks``' boundaries (see the module's docstring), in the order they run;
    None when the graph cannot be cut so (fewer than two blocks found among its nodes, a block reading what a later
    block computes, a node with a subgraph)."""
    index_of = {name: i + 1 for i, name in enumerate(blocks)}  # piece 0: before the blocks; last: after them
    after = len(blocks) + 1
    nodes = list(graph.node)
    if any(_has_subgraph(node) for node in nodes):
        return None
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.output:
            if name:
                producer[name] = i
    consumers: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name in producer:
                consumers[producer[name]].append(i)
    outputs = {value.name for value in graph.output}
    fixed = [_block_index(node_module(node), index_of) for node in nodes]
    if len({piece for piece in fixed if piece is not None}) < 2:
        return None
    # forward: the least piece each node can run in (after everything it reads)
    lowest = [0] * len(nodes)
    for i, node in enumerate(nodes):
        least = max((lowest[producer[name]] for name in node.input if name in producer), default=0)
        if fixed[i] is not None:
            if least > fixed[i]:  # a block reads what a later block computes: not a chain of blocks
                return None
            least = fixed[i]
        lowest[i] = least
    # backward: a node outside the blocks runs in the first piece that reads it (the piece after the blocks when
    # only the graph's outputs do)
    piece_of = list(lowest)
    for i in range(len(nodes) - 1, -1, -1):
        if fixed[i] is not None:
            continue
        reads = [piece_of[c] for c in consumers[i]]
        if any(name in outputs for name in nodes[i].output):
            reads.append(after)
        if reads:
            piece_of[i] = max(lowest[i], min(reads))
    for i, node in enumerate(nodes):
        if any(piece_of[producer[name]] > piece_of[i] for name in node.input if name in producer):
            return None
    initializers = {init.name for init in graph.initializer}
    last_use: dict[str, int] = {name: after + 1 for name in outputs}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                last_use[name] = max(last_use.get(name, -1), piece_of[i])
    names = [BEFORE, *blocks, AFTER]
    pieces = [Piece(name) for name in names]
    for i, node in enumerate(nodes):
        pieces[piece_of[i]].nodes.append(node)
    for index, piece in enumerate(pieces):
        made: set[str] = set()
        seen: set[str] = set()
        for node in piece.nodes:
            for name in node.input:
                if not name or name in made or name in seen:
                    continue
                seen.add(name)
                (piece.initializers if name in initializers else piece.inputs).append(name)
            made.update(name for name in node.output if name)
        piece.outputs = [name for node in piece.nodes for name in node.output
                         if name and last_use.get(name, -1) > index]
        if 0 < index < after:
            own = {name for node, where in zip(nodes, fixed) if where == index for name in node.output}
            piece.block_outputs = [name for name in piece.outputs if name in own]
    return [piece for piece in pieces if piece.nodes]


def _value_info(name: str, array: np.ndarray | None) -> onnx.ValueInfoProto:
    if array is None:
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), None)


class _Input:
    def __init__(self, name: str) -> None:
        self.name = name


class PiecewiseSession:
    """The graph at ``path`` run piece by piece (:func:`plan_pieces`) behind the two methods of an onnxruntime
    session the validation uses; ``evaluator``: ``"reference"`` (onnx's reference evaluator: bfloat16, FP4) or
    ``"onnxruntime"`` (the graph as written, optimizations off). ``hidden``: after each run, the block outputs of
    each block piece (name -> value), the last run's."""

    def __init__(self, path: str | os.PathLike, proto: onnx.ModelProto, pieces: list[Piece], evaluator: str) -> None:
        self.path = Path(path)
        self.pieces = pieces
        self.evaluator = evaluator
        self._opsets = list(proto.opset_import)
        self._ir_version = proto.ir_version
        self._functions = list(proto.functions)
        self._initializers = {init.name: init for init in proto.graph.initializer}
        self._outputs = [value.name for value in proto.graph.output]
        self._inputs = [_Input(value.name) for value in proto.graph.input if value.name not in self._initializers]
        self._types = {value.name: value for value in list(proto.graph.value_info) + list(proto.graph.output)}
        self.hidden: dict[str, dict[str, np.ndarray]] = {}
        self.piece_runs = 0

    @classmethod
    def open(cls, path: str | os.PathLike, blocks: Sequence[str], evaluator: str) -> PiecewiseSession | None:
        """The session over the graph file at ``path`` (its weights left in their data file), or None when its
        graph cannot be cut at ``blocks`` (:func:`plan_pieces`)."""
        proto = onnx.load(str(path), load_external_data=False)
        pieces = plan_pieces(proto.graph, blocks)
        return None if pieces is None else cls(path, proto, pieces, evaluator)

    def get_inputs(self) -> list[_Input]:
        return list(self._inputs)

    def _model(self, piece: Piece, env: dict[str, Any]) -> onnx.ModelProto:
        inits = []
        for name in piece.initializers:
            copy = onnx.TensorProto()
            copy.CopyFrom(self._initializers[name])
            inits.append(copy)
        outputs = [self._types[name] if name in self._types else _value_info(name, None) for name in piece.outputs]
        graph = helper.make_graph(piece.nodes, piece.name, [_value_info(name, env[name]) for name in piece.inputs],
                                  outputs, initializer=inits)
        model = helper.make_model(graph, opset_imports=self._opsets, ir_version=self._ir_version)
        model.functions.extend(self._functions)
        return model

    def _run_piece(self, piece: Piece, env: dict[str, Any]) -> list[Any]:
        model = self._model(piece, env)
        feeds = {name: env[name] for name in piece.inputs}
        if self.evaluator == "reference":
            from onnx.reference import ReferenceEvaluator

            external_data_helper.load_external_data_for_model(model, str(self.path.parent))
            evaluator = ReferenceEvaluator(model, new_ops=[fp4_dynamic_quantize_op(), bfloat16_matmul_op()])
            del model  # the evaluator holds its own arrays of the weights
            return evaluator.run(piece.outputs, feeds)
        with _piece_file(model, self.path) as file:
            session = _ort_session(file)
        return session.run(piece.outputs, feeds)

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray], *,
            replace: dict[str, np.ndarray] | None = None, stop_after: str | None = None) -> list[np.ndarray]:
        """The graph's outputs (``output_names``, default all) on ``feeds``, computed piece by piece.
        ``replace``: tensors given these values as soon as a piece has computed them (the diagnosis feeds a block
        PyTorch's input); ``stop_after``: the last piece to run (no outputs are returned then).

        Raises:
            RuntimeError: a piece failed; the message names it (its block) and says why.
        """
        env: dict[str, Any] = dict(feeds)
        wanted = list(output_names or self._outputs)
        last = {}
        for index, piece in enumerate(self.pieces):
            for name in piece.inputs:
                last[name] = index
        hidden: dict[str, dict[str, np.ndarray]] = {}
        for index, piece in enumerate(self.pieces):
            try:
                values = self._run_piece(piece, env)
            except Exception as error:
                what = f"block {piece.name}" if piece.name not in (BEFORE, AFTER) else f"the part {piece.name}"
                said = str(error).strip().splitlines()
                raise RuntimeError(f"{what} ({len(piece.nodes)} nodes, from {piece.nodes[0].name!r}): "
                                   f"{said[0] if said else type(error).__name__}") from error
            self.piece_runs += 1
            env.update(zip(piece.outputs, values))
            for name, value in (replace or {}).items():
                if name in env:
                    env[name] = value.astype(env[name].dtype) if hasattr(env[name], "dtype") else value
            if piece.block_outputs:
                hidden[piece.name] = {name: env[name] for name in piece.block_outputs}
            for name in [name for name in env if last.get(name, -1) <= index and name not in wanted]:
                if not any(name in kept for kept in hidden.values()):
                    del env[name]
            if piece.name == stop_after:
                self.hidden = hidden
                return []
        self.hidden = hidden
        return [np.asarray(env[name], dtype=np.float32) if getattr(env[name], "dtype", None) is not None
                and env[name].dtype.kind == "V" else env[name] for name in wanted]


@contextlib.contextmanager
def _piece_file(model: onnx.ModelProto, beside: Path) -> Iterator[str]:
    """``model`` (its initializers still pointing into the data file beside ``beside``) written to a temporary
    file in the same folder, so that onnxruntime reads the piece's weights from the data file itself."""
    file = temporary_name(beside, ".piece.onnx")
    try:
        onnx.save_model(model, str(file))
        yield str(file)
    finally:
        file.unlink(missing_ok=True)


def _ort_session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as the whole graph's check
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


@dataclass
class BlockRow:
    """One block's hidden state in the file against the fake-quant PyTorch block's output (the sample)."""

    block: str
    tensor: str
    parity: OutputParity


@contextlib.contextmanager
def blocks_kept(model: nn.Module, names: Sequence[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Within it, each forward of ``model`` keeps the output (hidden state) of each block named in ``names``."""
    modules = dict(model.named_modules())
    captured: dict[str, torch.Tensor] = {}
    handles = []
    for name in names:
        module = modules.get(name)
        if module is None:
            continue

        def keep(_module, _args, output, name=name):
            captured[name] = hidden_of(name, output).detach()
        handles.append(module.register_forward_hook(keep))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def sample_blocks_kept(job: Any) -> Iterator[None]:
    """Around the sample's reference run of a streamed export (the one validated block by block): its blocks'
    outputs kept in ``job.block_outputs``, so that the per-block rows need no forward of their own."""
    names = block_names(job.model) if streamed_weights.active() is not None else []
    if not names:
        yield
        return
    with blocks_kept(job.model, names) as captured:
        yield
    job.block_outputs = captured


def block_parity(model: nn.Module, call: Any, inputs: tuple[torch.Tensor, ...], session: PiecewiseSession,
                 captured: dict[str, torch.Tensor] | None = None) -> tuple[list[BlockRow], dict[str, torch.Tensor]]:
    """Each block's output in PyTorch (``call`` run on ``inputs``, the caller's rounding and paging in force; or
    ``captured``, the blocks' outputs kept from such a run) against the file's for the same inputs
    (``session.hidden``, from its last run: run it on ``inputs`` first); and PyTorch's outputs by block."""
    names = [piece.name for piece in session.pieces if piece.name in session.hidden]
    if captured is None:
        with blocks_kept(model, names) as captured, torch.no_grad():
            call(*(t.clone() for t in inputs))
    rows = []
    for name in names:
        torch_value = captured.get(name)
        if torch_value is None:
            continue
        candidates = [(tensor, value) for tensor, value in session.hidden[name].items()
                      if tuple(np.shape(value)) == tuple(torch_value.shape)]
        if not candidates:
            continue
        tensor, value = candidates[-1]  # the last one computed: the block's output (its residual sum)
        if getattr(value, "dtype", None) is not None and value.dtype.kind == "V":
            value = np.asarray(value, dtype=np.float32)
        rows.append(BlockRow(name, tensor, compare([tensor], [torch_value], [value])[0]))
    return rows, captured


# ----- the export's validation ---------------------------------------------------------------------------------

# A streamed export (weights read from the checkpoint) is validated block by block whatever its size: the outputs
# are the whole graph's (the same verdict) and no step then holds every weight; other exports when the file's
# weights would not fit in the memory left (the reference evaluator holds two copies of them)
STREAMED_BLOCK_BY_BLOCK = True
BLOCKWISE_NOTE = "validation_route"  # the report's note saying whether the whole graph or its blocks were checked


@dataclass
class BlockwiseValidation:
    """What the block-by-block validation of one export found: its session, and the sample's per-block rows."""

    session: PiecewiseSession
    rows: list[BlockRow] = field(default_factory=list)
    torch_hidden: dict[str, torch.Tensor] = field(default_factory=dict)


def _too_large(path: Path, data_path: Path | None, reference: bool) -> bool:
    if data_path is None:
        return False
    weights = data_path.stat().st_size * (2 if reference else 1)  # the evaluator: the proto's bytes and its arrays
    available = available_memory()
    return available is not None and weights > available


def piecewise_session(job: Any, why_reference: str | None) -> PiecewiseSession | None:
    """The session that validates ``job``'s staged file block by block, or None for the whole graph (not a
    streamed export and the weights fit, or no blocks to cut at); the report's note says which and why."""
    staged = job.staged
    streamed = streamed_weights.active() is not None
    too_large = _too_large(staged.path, staged.data_path, why_reference is not None)
    engine = "onnx's reference evaluator" if why_reference else "onnxruntime"
    if not too_large and not (streamed and STREAMED_BLOCK_BY_BLOCK):
        if streamed:  # (an ordinary export's report is as it was: the whole graph, the weights in memory)
            job.log.add(BLOCKWISE_NOTE, f"validated as a whole graph on {engine} (its weights fit in memory)")
        return None
    blocks = block_names(job.model)
    evaluator = "reference" if why_reference else "onnxruntime"
    session = PiecewiseSession.open(staged.path, blocks, evaluator) if blocks else None
    if session is None:
        why = ("it has no blocks to cut at" if not blocks else
               f"its graph cannot be cut at {blocks[0].rsplit('.', 1)[0]}'s blocks")
        job.log.add(BLOCKWISE_NOTE, f"validated as a whole graph on {engine} ({why})")
        return None
    reason = "the file's weights do not fit in the memory left" if too_large else "a streamed export"
    job.log.add(BLOCKWISE_NOTE, f"validated block by block ({reason}): {len(session.pieces)} pieces run in turn on "
                f"{engine}, each with only its own weights read from the data file, the outputs the whole graph's")
    job.blockwise = BlockwiseValidation(session)
    return session


def block_rows(job: Any, session: Any, inputs: tuple[torch.Tensor, ...]) -> list[ParityCheck]:
    """Each block's output in the file against the fake-quant PyTorch block's, on ``inputs`` (the last run of
    ``session``), as the report's rows (not in the headline); none for a whole-graph validation."""
    if not isinstance(session, PiecewiseSession) or job.blockwise is None:
        return []
    kept = job.block_outputs if inputs is job.inputs else None  # the sample's reference run kept them
    with without_cache(job.model), rounding(list(job.active.values()), "onnx"):
        rows, captured = block_parity(job.model, job.call, inputs, session, kept)
    job.blockwise.rows, job.blockwise.torch_hidden = rows, captured
    return [ParityCheck.of(f"block {row.block} output (sample inputs)", row.parity, in_headline=False)
            for row in rows]


class _BlockDone(Exception):
    """Raised after the block under study ran: the layers after it need not run."""


def block_sensitivity(job: Any, block: str, inputs: tuple[torch.Tensor, ...], expected: torch.Tensor,
                      tries: int = 2) -> tuple[float, float]:
    """The fake-quant ``block``'s own sensitivity, :func:`~workbench.export.parity.one_ulp_spread` for one block:
    the worst (cosine, max abs diff) of its output against ``expected`` (its output on ``inputs``) when its
    hidden-state input and the input of each of its activation quantizers move by one ulp, up or down at random.
    Another kernel's float rounding reaches every quantizer the same way. The blocks before it run as they did;
    the layers after it do not run."""
    module = job.model.get_submodule(block)
    quantizers = [q for key, q in job.active.items()
                  if job.names.get(key, "").startswith(f"{block}.") and "weight_quantizer" not in job.names[key]]
    generator = torch.Generator().manual_seed(0)
    kept: dict[str, torch.Tensor] = {}

    def nudge_block(_module, args, kwargs):
        if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            return (nudged_by_one_ulp(args[0], generator), *args[1:]), kwargs
        hidden = kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor) and hidden.is_floating_point():
            return args, {**kwargs, "hidden_states": nudged_by_one_ulp(hidden, generator)}
        return None

    def stop(_module, _args, output):
        kept["output"] = hidden_of(block, output).detach()
        raise _BlockDone

    handles = [module.register_forward_pre_hook(nudge_block, with_kwargs=True), module.register_forward_hook(stop)]
    nudge = input_nudge(generator)
    handles += [quantizer.register_forward_pre_hook(nudge) for quantizer in quantizers]
    worst = (1.0, 0.0)
    try:
        for _ in range(tries):
            kept.clear()
            with contextlib.suppress(_BlockDone), torch.no_grad(), streamed_weights.paged(), \
                    without_cache(job.model), rounding(list(job.active.values()), "onnx"):
                job.call(*(t.clone() for t in inputs))
            if "output" in kept:
                parity = compare(["block"], [expected], [kept["output"].float().numpy()])[0]
                worst = (min(worst[0], parity.cosine), max(worst[1], parity.max_abs_diff))
    finally:
        for handle in handles:
            handle.remove()
    return worst


def block_diagnosis(job: Any, check: str, inputs: tuple[torch.Tensor, ...], min_cosine: float,
                    worst: Any = None) -> ParityDiagnosis:
    """Where the file parts from the model on ``inputs`` (the failing check's), block by block: the first block
    whose output falls below ``min_cosine``, and whether that block alone computes differently (run again on
    PyTorch's own input to it) or the blocks' small differences accumulate."""
    blockwise: BlockwiseValidation = job.blockwise
    session = blockwise.session
    feeds = {name.name: t.detach().cpu().numpy() for name, t in zip(session.get_inputs(), inputs)}
    if inputs is not job.inputs or not blockwise.rows:
        session.run(None, feeds)
        with without_cache(job.model), rounding(list(job.active.values()), "onnx"):
            blockwise.rows, blockwise.torch_hidden = block_parity(job.model, job.call, inputs, session)
    rows = blockwise.rows
    diagnosis = ParityDiagnosis(check=check, verdict="rounding", first=None, module=None)
    if worst is not None:
        diagnosis.disagreement_cosine, diagnosis.disagreement_max_abs_diff = worst.cosine, worst.max_abs_diff
    listed = ", ".join(f"{row.block} {row.parity.cosine:.6f}" for row in rows)
    parting = next((index for index, row in enumerate(rows) if not row.parity.cosine >= min_cosine), None)
    if parting is None:
        diagnosis.reason = (f"Validated block by block: every block's output agrees with PyTorch's to cosine "
                            f"{min_cosine} or better ({listed}); the layers after the blocks part.")
        diagnosis.verdict = "operation"
        diagnosis.module = AFTER
        return diagnosis
    row = rows[parting]
    diagnosis.first, diagnosis.module = row.tensor, row.block
    local = row.parity
    if parting > 0:  # the block again, fed PyTorch's own output of the block before it
        before = rows[parting - 1]
        value = blockwise.torch_hidden[before.block].float().numpy()
        with contextlib.suppress(KeyError):
            session.run(None, feeds, replace={before.tensor: value}, stop_after=row.block)
            onnx_value = np.asarray(session.hidden[row.block][row.tensor], dtype=np.float32)
            local = compare([row.tensor], [blockwise.torch_hidden[row.block]], [onnx_value])[0]
    alone = f"fed PyTorch's own input, it gives cosine {local.cosine:.6f} (max abs diff {local.max_abs_diff:.4g})"
    if not local.cosine >= min_cosine:
        # below the threshold on PyTorch's own input: another computation, or rounding flips in a sensitive block
        spread = block_sensitivity(job, row.block, inputs, blockwise.torch_hidden[row.block])
        own = (f"the fake-quant block itself moves by up to {spread[1]:.4g} (cosine {spread[0]:.6f}) when its input "
               f"and each of its quantizers' inputs change by 1 ulp")
        if within_sensitivity((local.cosine, local.max_abs_diff), spread):
            diagnosis.reason = (f"Validated block by block: block {row.block} is the first whose output "
                                f"({row.tensor!r}) parts from PyTorch's (cosine {row.parity.cosine:.6f}); {alone}, "
                                f"but {own}: that is rounding flipping quantization codes in that block, not another "
                                f"computation; lower the parity threshold (export.min_cosine) or compare on more "
                                f"data. Per block: {listed}.")
            return diagnosis
        diagnosis.verdict = "operation"
        diagnosis.reason = (f"Validated block by block: block {row.block} is the first whose output ({row.tensor!r}) "
                            f"parts from PyTorch's (cosine {row.parity.cosine:.6f}); {alone}, far beyond its own "
                            f"rounding ({own}): that block computes differently. Per block: {listed}.")
    else:
        diagnosis.reason = (f"Validated block by block: block {row.block} is the first whose output ({row.tensor!r}) "
                            f"falls below cosine {min_cosine} ({row.parity.cosine:.6f}), but {alone}: each block "
                            f"computes its part, and the small differences accumulate over the blocks. Per block: "
                            f"{listed}.")
    return diagnosis
