"""The two ONNX exporters: torch.export-based (torch's default) and TorchScript, with the fallback
between them and errors that name the operation and the layer that calls it."""
from __future__ import annotations

import ast
import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import onnx
import torch
from torch import nn

from workbench.export import streamed_weights
from workbench.export.errors import ExportError, UnsupportedOperationError
from workbench.export.naming import tag_torchscript_modules
from workbench.export.notes import ReportLog
from workbench.export.onnx_file import (
    EXTERNAL_DATA_THRESHOLD,
    SMALL_TENSOR,
    STREAM_THRESHOLD,
    external_data_file,
    temporary_name,
)
from workbench.export.opset import MIN_OPSET, convert_opset, default_opset
from workbench.export.qdq import register_torchscript_symbolic, translation_table
from workbench.export.reference import ExportCall, grow_batch
from workbench.export.torch_modes import function_modes_kept
from workbench.export.torchscript_weights import WEIGHT_PREFIX, attach_weights, weight_inputs

logger = logging.getLogger(__name__)

__all__ = ["Exporter", "DYNAMO_MIN_OPSET", "run_exporter", "quiet", "first_line", "token_inputs", "unwrap_names",
           "fast_path_refusal", "clean_torchscript_graph", "FAST_PATH_NOTE"]

Exporter = Literal["auto", "dynamo", "torchscript"]
DYNAMO_MIN_OPSET = 18
# The TorchScript exporter builds the whole graph, weights included, as one protobuf message in memory
# (it writes external data only to a file path of its own): a model over protobuf's 2 GB limit cannot go
# through it. Tests lower this to stand for a model that large.
TORCHSCRIPT_LIMIT = EXTERNAL_DATA_THRESHOLD
# what torch itself says when it reaches that limit (the weights estimate can miss folded constants)
_PROTOBUF_LIMIT_MESSAGES = ("larger than the 2GiB limit", "exceed maximum protobuf size")


# ----- exporters --------------------------------------------------------------------------------


class _CaptureError(Exception):
    """torch.export could not capture the model (not an unsupported-operator problem)."""


# A requested opset at or above this is a default more than a target: when onnx.version_converter cannot bring
# the torch.export graph down to it, the graph keeps the exporter's opset (one or two above) rather than being
# re-exported by TorchScript. Below it (an old TensorRT asked for on purpose) the TorchScript fallback writes it.
KEEP_EXPORTER_OPSET_FROM = 17


class _TooLargeForTorchScript(ExportError):
    """The graph is over protobuf's 2 GB limit, which the TorchScript exporter cannot write."""


class _Collect(logging.Handler):
    """Keeps every record torch's loggers emit while an exporter runs (for --debug and the report's JSON)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.extend(f"{record.name}: {line}" for line in record.getMessage().splitlines())
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not worth failing an export for
            pass


class _Lines(io.TextIOBase):
    """A text stream that keeps what is written to it as lines (torch's print()s while it exports)."""

    def __init__(self, lines: list[str], prefix: str) -> None:
        self.lines, self.prefix = lines, prefix

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.lines.extend(f"{self.prefix}{line}" for line in text.splitlines() if line.strip())
        return len(text)


# the loggers whose records torch writes while exporting: their own handlers (torch._logging puts one on "torch")
_TORCH_LOGGERS = ("torch", "onnxscript", "onnx_ir")
# what the report's JSON keeps of the captured output (all of it goes to the debug log)
CAPTURED_LINES = 400


@contextlib.contextmanager
def quiet(captured: list[str] | None = None) -> Iterator[list[str]]:
    """Keep the exporters' output out of the user's console: torch's log records (torch.export's graph dump
    before a fallback, ~2,700 lines for DETR), its print()s and its warnings. Yields the tracer warnings worth a
    line in the report; everything else goes to ``captured`` (and to this module's debug log)."""
    collected: list[str] = []
    kept = captured if captured is not None else []
    handler = _Collect(kept)
    saved = []
    chatty = [(logging.getLogger(name), logging.getLogger(name).level)
              for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    # torch._logging gives some of its loggers (torch.fx.experimental.symbolic_shapes...) handlers of their own
    names = [name for name in list(logging.root.manager.loggerDict)
             if any(name == root or name.startswith(root + ".") for root in _TORCH_LOGGERS)
             and isinstance(logging.root.manager.loggerDict[name], logging.Logger)
             and (logging.getLogger(name).handlers or not logging.getLogger(name).propagate)]
    for name in dict.fromkeys(list(_TORCH_LOGGERS) + names):
        lg = logging.getLogger(name)
        saved.append((lg, lg.handlers[:], lg.propagate, lg.level))
        lg.handlers = [handler]
        lg.propagate = False
    # the exporters' progress at INFO, and torch's own noise below WARNING, are not worth keeping
    for lg, _ in chatty:
        lg.setLevel(logging.WARNING)
    start = len(kept)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(_Lines(kept, "stdout: ")), \
            contextlib.redirect_stderr(_Lines(kept, "stderr: ")):
        warnings.simplefilter("always")
        try:
            yield collected
        finally:
            for lg, handlers, propagate, _ in saved:
                lg.handlers, lg.propagate = handlers, propagate
            for lg, level in chatty:
                lg.setLevel(level)
            for w in caught:
                message = str(w.message).splitlines()[0] if str(w.message) else ""
                if issubclass(w.category, torch.jit.TracerWarning):
                    collected.append(f"TorchScript tracer: {message}")
            if len(kept) > start:
                logger.debug("exporter output (kept out of the console):\n%s", "\n".join(kept[start:]))


def _unsupported_ops(error: BaseException) -> list[str]:
    text = "".join(str(e) for e in _chain(error))
    ops = re.findall(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)", text)
    found = [f"{op}.{overload}" for op, overload in ops]
    found += [m for m in re.findall(r"target=torch\.ops\.([\w.]+)", text)]
    found += re.findall(r"symbolic function for '?([\w:]+)'?", text)
    found += re.findall(r"operator '?(aten::\w+|[\w]+::\w+)'? .*not supported", text)
    unique: list[str] = []
    for op in found:
        if op not in unique:
            unique.append(op)
    return unique


def _chain(error: BaseException) -> list[BaseException]:
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _layers_calling(program, ops: list[str]) -> list[str]:
    layers: list[str] = []
    if program is None:
        return layers
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        if any(target == op or target.startswith(op + ".") for op in ops):
            stack = node.meta.get("nn_module_stack") or {}
            name = list(stack.values())[-1][0] if stack else ""
            # the exported module is the ExportCall around the user's model: name layers as the model does
            name = "" if name == "model" else name.removeprefix("model.")
            label = name or "<model>"
            if label not in layers:
                layers.append(label)
    return layers


def _export_dynamo(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str],
                   opset: int, dynamic_batch: bool, log: ReportLog, target_path: Path | None = None,
                   threshold: int = EXTERNAL_DATA_THRESHOLD, dynamic_sequence: bool = True,
                   ) -> tuple[onnx.ModelProto, bool, str]:
    trace_inputs = inputs
    dynamic_shapes = None
    if dynamic_batch:
        # torch.export specialises a dimension of size 1, so trace with at least two samples
        if any(t.dim() > 0 and t.shape[0] == 1 for t in inputs):
            trace_inputs = grow_batch(inputs)
        batch = torch.export.Dim("batch", min=1)
        tokens = token_inputs(trace_inputs) if dynamic_sequence else set()
        # the sequence axis of token inputs is dynamic where the model allows it (AUTO: static otherwise)
        per_input = tuple(({0: batch, 1: torch.export.Dim.AUTO} if i in tokens else {0: batch}) if t.dim() > 0
                          else None for i, t in enumerate(trace_inputs))
        dynamic_shapes = (per_input,)  # the ExportCall's forward takes *tensors: one entry holding them all
    try:
        with function_modes_kept():
            program = torch.export.export(model, trace_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as error:
        if dynamic_shapes is None:
            raise _CaptureError(_capture_reason(error)) from error
        # a model that fixes its batch size (view(2, -1), say) still exports with a static batch
        try:
            with function_modes_kept():
                program = torch.export.export(model, inputs, strict=False)
        except Exception as static_error:
            raise _CaptureError(_capture_reason(static_error)) from static_error
        dynamic_batch = False
        log.add("dynamic_batch_off", f"dynamic batch turned off: the model fixes its batch size ({first_line(error)})")
    target = max(opset, DYNAMO_MIN_OPSET)
    try:
        onnx_program = torch.onnx.export(
            program, (), None, dynamo=True, opset_version=target, input_names=input_names,
            output_names=output_names, custom_translation_table=translation_table(),
            optimize=streamed_weights.active() is None, verbose=False, external_data=False)
    except Exception as error:
        ops = [op for op in _unsupported_ops(error) if not op.startswith("workbench")]
        layers = _layers_calling(program, ops)
        what = ", ".join(ops) if ops else "an operation"
        where = f" called by {', '.join(layers)}" if layers else ""
        raise UnsupportedOperationError(
            f"The ONNX exporter cannot translate {what}{where}: {first_line(error)}. Replace that operation, "
            "or leave that part of the model out of the export.", ops, layers) from error
    if streamed_weights.fill_initializers(onnx_program.model):  # weights read when written (a streamed export)
        onnx_program.optimize()
    weights = sum(v.const_value.nbytes for v in onnx_program.model.graph.initializers.values()
                  if v.const_value is not None)
    # over the threshold the weights must stay external; over STREAM_THRESHOLD they go through a temporary
    # data file anyway, so that no serialised copy of them is ever held (folded into one file on commit)
    over_limit = weights > threshold
    large = target_path is not None and (over_limit or weights > STREAM_THRESHOLD)
    proto = _graph_only(onnx_program.model, target_path) if large else onnx_program.model_proto
    try:
        unwrap_names(proto)
        if dynamic_batch:
            _name_dynamic_axes(proto, token_inputs(inputs) if dynamic_sequence else set())
        note = "torch.export-based exporter (torch's default)"
        if default_opset(proto) != opset:
            try:
                proto, notes = convert_opset(proto, opset)
            except ValueError as error:
                if opset < KEEP_EXPORTER_OPSET_FROM and not over_limit:
                    raise  # an old target asked for on purpose: the TorchScript fallback writes that opset
                # keep the graph the exporter wrote, at its own opset: the TorchScript fallback would record
                # another graph (the sample's path only) and often cannot write it at the lower opset either
                written = default_opset(proto)
                log.add("opset_kept", f"opset {written} instead of the requested {opset} (TensorRT 10 reads it; "
                                      f"TensorRT 8.6 reads up to 17): {error}")
                note += f", at opset {written}: converting it down to {opset} failed"
            else:
                note += f", converted from opset {target} to {opset} with onnx.version_converter"
                log.extend("opset_conversion", notes)
    except BaseException:
        if large:
            _discard_data(proto, target_path)
        raise
    return proto, dynamic_batch, note


def _graph_only(model, target_path: Path) -> onnx.ModelProto:
    """The exported graph without its weights: they go to a temporary data file beside ``target_path``
    (adopted by :func:`~workbench.export.onnx_file.stage`), so no step has to serialise a proto holding
    them (protobuf cannot encode a message over 2 GB). Small tensors (scales, shapes) stay in the graph."""
    import onnx_ir

    graph_file = temporary_name(target_path, ".export.onnx")
    data_file = graph_file.with_name(graph_file.name + ".data")
    try:
        onnx_ir.save(model, graph_file, external_data=data_file.name, size_threshold_bytes=SMALL_TENSOR)
        return onnx.load(str(graph_file), load_external_data=False)
    except BaseException:
        data_file.unlink(missing_ok=True)
        raise
    finally:
        graph_file.unlink(missing_ok=True)


def _discard_data(proto: onnx.ModelProto, target_path: Path) -> None:
    data_file = external_data_file(proto, target_path.parent)
    if data_file is not None:
        data_file.unlink(missing_ok=True)


def _weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once (shared weights, views)."""
    storages: dict[int, int] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        storage = tensor.untyped_storage()
        if storage.data_ptr():
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _gigabytes(size: int) -> str:
    return f"{size / 1024 ** 3:.3g} GB"


def _torchscript_too_large(model: nn.Module) -> str | None:
    """Why the TorchScript exporter cannot write ``model`` (its weights are over the protobuf limit), or None."""
    size = _weight_bytes(model)
    if size <= TORCHSCRIPT_LIMIT:
        return None
    return (f"the TorchScript exporter cannot write a graph over {_gigabytes(TORCHSCRIPT_LIMIT)} (protobuf's limit "
            f"for one message; it has no external data for a graph kept in memory) and this model's weights are "
            f"{_gigabytes(size)}")


def _export_torchscript(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str],
                        opset: int, dynamic_batch: bool, target_path: Path | None = None,
                        dynamic_sequence: bool = True) -> onnx.ModelProto:
    """The TorchScript exporter's graph, its weights attached from the model's tensors (with ``target_path``, a
    model over :data:`~workbench.export.onnx_file.STREAM_THRESHOLD` keeps them in a temporary data file beside
    it, as the torch.export-based path does; see :mod:`workbench.export.torchscript_weights`)."""
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old for per-channel Q/DQ; use opset {MIN_OPSET} or newer.")
    too_large = _torchscript_too_large(model)
    if too_large is not None:  # refused before minutes of tracing and a second copy of the weights
        raise _TooLargeForTorchScript(too_large[0].upper() + too_large[1:] + ".")
    register_torchscript_symbolic()
    dynamic_axes = None
    if dynamic_batch:
        tokens = token_inputs(inputs) if dynamic_sequence else set()
        # TorchScript cannot tell which lengths are tied: the inputs' names say it (decoder_* apart)
        dynamic_axes = {name: {0: "batch", 1: sequence_axis_name(name)} if i in tokens
                        else {0: "batch"}
                        for i, name in enumerate(input_names)}
        dynamic_axes.update({name: {0: "batch"} for name in output_names})
    # the tracer runs the model on real tensors: a model that edits its input in place must not edit the
    # sample that onnxruntime is given next
    inputs = tuple(t.clone() for t in inputs)
    stream = target_path is not None and _weight_bytes(model) > STREAM_THRESHOLD
    # the model's tensors go into the trace as inputs: torch holds them by reference, and they come back as
    # initializers over the tensors' own memory (see workbench.export.torchscript_weights)
    weights = weight_inputs(model.model) if isinstance(model, ExportCall) else {}
    names = [WEIGHT_PREFIX + name for name in weights]
    model_weight_names = getattr(model, "weight_names", None)
    if weights:
        model.weight_names = list(weights)
    try:
        proto = _torchscript_graph(model, inputs + tuple(weights.values()), input_names + names, output_names, opset,
                                   dynamic_axes)
    finally:
        if weights:
            model.weight_names = model_weight_names
    attach_weights(proto, dict(zip(names, weights.values())), target_path, stream)
    try:
        # each node's module, from TorchScript's scopes and the wrapper's module paths (repeated calls resolved)
        tag_torchscript_modules(proto, [name for name, _ in model.named_modules() if name], root="model")
        unwrap_names(proto)
        return clean_torchscript_graph(proto, None if target_path is None else target_path.parent)
    except BaseException:
        if target_path is not None:
            _discard_data(proto, target_path)
        raise


def _torchscript_graph(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str], opset: int,
                       dynamic_axes: dict | None) -> onnx.ModelProto:
    buffer = io.BytesIO()
    try:
        torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True)
    except Exception as error:
        if any(text in str(error) for text in _PROTOBUF_LIMIT_MESSAGES):
            raise _TooLargeForTorchScript(
                f"The TorchScript exporter cannot write a graph over {_gigabytes(TORCHSCRIPT_LIMIT)} (protobuf's "
                "limit for one message) and this one, with the constants it folds, is larger.") from error
        ops = _unsupported_ops(error)
        raise UnsupportedOperationError(f"The TorchScript ONNX exporter failed: {first_line(error)}", ops,
                                        []) from error
    return onnx.load_from_string(buffer.getvalue())


def clean_torchscript_graph(proto: onnx.ModelProto, base_dir: Path | None = None) -> onnx.ModelProto:
    """Give a TorchScript graph the Q/DQ structure the torch.export-based exporter writes.

    TorchScript gives each quantizer its own scale and zero point (or shares equal constants through
    ``Identity`` nodes), leaves identical Q/DQ pairs on one tensor (a block's conv and its downsample reading the
    same input with the same amax) apart, and keeps small constants as ``Constant`` nodes; torch.export's graph
    reads equal constants as one, merges the pairs and keeps constants as initializers. These onnx_ir passes do
    just that (about 0.02 s on a ResNet-18, where onnxscript's whole optimiser takes 0.2-0.4 s and renames what
    its rewrite rules touch, such as the final Flatten). Where they are missing (an older onnx_ir), onnxscript's
    optimiser does the same and more. ``base_dir``: where the graph's external data files are (the passes read
    the small ones' values).
    """
    try:
        import onnx_ir
        from onnx_ir.passes.common import (
            CommonSubexpressionEliminationPass,
            DeduplicateInitializersPass,
            IdentityEliminationPass,
            LiftConstantsToInitializersPass,
            RemoveUnusedNodesPass,
        )
        from onnxscript.optimizer import fold_constants
    except ImportError:
        import onnxscript.optimizer

        return onnxscript.optimizer.optimize(proto)
    model = onnx_ir.from_proto(proto)
    if base_dir is not None:
        onnx_ir.external_data.set_base_dir(model.graph, base_dir)
    IdentityEliminationPass()(model)
    fold_constants(model)
    DeduplicateInitializersPass()(model)  # equal scales and zero points (small tensors only) read as one
    CommonSubexpressionEliminationPass()(model)
    RemoveUnusedNodesPass()(model)
    # torch.export's graph holds no Constant nodes: their values are initializers (a ReLU6's Clip bounds)
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    proto = onnx_ir.to_proto(model)
    _produce_subgraph_outputs(proto.graph)
    return proto


def _produce_subgraph_outputs(graph: onnx.GraphProto) -> None:
    """Give back the Identity of each If/Loop branch output that onnx_ir's IdentityEliminationPass (1.1) took away.

    A scripted branch that returns a value of the outer graph (``return boxes``) is an Identity in TorchScript's
    graph; without it the branch's output names a value it does not produce, which onnx.checker refuses
    (torchvision's detectors). Each such output is produced again by an Identity of its own name.
    """
    for node, attribute, sub in _subgraphs(graph):
        _produce_subgraph_outputs(sub)
        local = {o for n in sub.node for o in n.output} | {i.name for i in sub.input} | \
            {i.name for i in sub.initializer}
        for index, output in enumerate(sub.output):
            if output.name not in local:
                name = f"{node.name or node.op_type}/{attribute.name}/output_{index}"
                sub.node.append(onnx.helper.make_node("Identity", [output.name], [name], name=name + "/Identity"))
                output.name = name


def unwrap_names(proto: onnx.ModelProto, prefix: str = "model") -> None:
    """Drop the ExportCall's attribute from the graph's names (``model.fc.weight`` -> ``fc.weight``,
    ``/model/fc/Gemm`` -> ``/fc/Gemm``), so the file names tensors and nodes as the user's model does."""
    dotted, scoped = prefix + ".", f"/{prefix}/"
    # subgraphs (an If's branches, a Loop's body) read the outer graph's values by name: renamed with it
    graphs = list(_graphs(proto.graph))
    nodes = [node for graph in graphs for node in graph.node]
    used = {v for n in nodes for v in list(n.input) + list(n.output)} | \
        {i.name for graph in graphs for i in graph.initializer}
    renamed = {name: name[len(dotted):] for name in used
               if name.startswith(dotted) and name[len(dotted):] not in used}
    # TorchScript's value names carry the wrapper's scope too (/model/conv1/Conv_output_0)
    renamed.update({name: "/" + name[len(scoped):] for name in used
                    if name.startswith(scoped) and "/" + name[len(scoped):] not in used})

    def fix(values) -> None:
        for index, value in enumerate(values):
            if value in renamed:
                values[index] = renamed[value]

    for node in nodes:
        fix(node.input)
        fix(node.output)
        _unwrap_scopes(node, prefix)
        if node.name.startswith(scoped):  # TorchScript scopes: /model/layer1/layer1.0/Conv, the wrapper first
            # only the wrapper's own scope goes: the scopes after it are the user's module paths, which may
            # start with "model." themselves (YOLOv5's self.model: /model/model.0/conv/Conv -> /model.0/conv/Conv)
            node.name = "/" + node.name[len(scoped):]
    for graph in graphs:
        for collection in (graph.initializer, graph.value_info, graph.input, graph.output):
            for item in collection:
                if item.name in renamed:
                    item.name = renamed[item.name]


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in its nodes' attributes, at any depth."""
    yield graph
    for _, _, sub in _subgraphs(graph):
        yield from _graphs(sub)


def _subgraphs(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, onnx.AttributeProto, onnx.GraphProto]]:
    """The subgraphs held by ``graph``'s own nodes (an If's branches, a Loop's body), with their node and
    attribute."""
    for node in graph.node:
        for attribute in node.attribute:
            for sub in list(attribute.graphs) + ([attribute.g] if attribute.HasField("g") else []):
                yield node, attribute, sub


def _unwrap_scopes(node: onnx.NodeProto, prefix: str) -> None:
    """torch.export's per-node module scopes (``['', 'model', 'model.fc', 'linear']``) without the wrapper."""
    entries = {entry.key: entry for entry in node.metadata_props}
    scopes_entry = entries.get("pkg.torch.onnx.name_scopes")
    if scopes_entry is None:
        return
    try:
        scopes = ast.literal_eval(scopes_entry.value)
    except (ValueError, SyntaxError):
        return
    if not isinstance(scopes, list) or prefix not in scopes:
        return
    index = scopes.index(prefix)
    scopes_entry.value = repr([s.removeprefix(prefix + ".") if isinstance(s, str) else s
                               for i, s in enumerate(scopes) if i != index])
    hierarchy_entry = entries.get("pkg.torch.onnx.class_hierarchy")
    if hierarchy_entry is not None:
        try:
            hierarchy = ast.literal_eval(hierarchy_entry.value)
        except (ValueError, SyntaxError):
            return
        if isinstance(hierarchy, list) and len(hierarchy) == len(scopes) and index > 0:
            # the root scope "" was the wrapper; the model's own class takes its place
            hierarchy_entry.value = repr([c for i, c in enumerate(hierarchy) if i != index - 1])


def token_inputs(inputs: tuple) -> set[int]:
    """Indices of the inputs whose axis 1 is a sequence length: integer tensors (token ids, masks) of rank >= 2."""
    return {i for i, t in enumerate(inputs)
            if t.dim() >= 2 and not t.is_floating_point() and not t.is_complex()}


def sequence_axis_name(input_name: str) -> str:
    """The dynamic axis 1 of a token input, by the Hugging Face naming convention: ``decoder_sequence`` for the
    ``decoder_*`` inputs of an encoder-decoder, ``sequence`` for the others (ids, mask, token types)."""
    return "decoder_sequence" if input_name.startswith("decoder_") else "sequence"


def _name_dynamic_axes(proto: onnx.ModelProto, tokens: set[int]) -> None:
    """Give torch.export's symbolic dimensions (``s77``) readable names: ``batch`` on axis 0 of the inputs,
    ``sequence`` on axis 1 of token inputs, and the same names wherever those symbols reappear."""
    renamed: dict[str, str] = {}
    for index, value in enumerate(proto.graph.input):
        dims = value.type.tensor_type.shape.dim
        if len(dims) > 0 and dims[0].dim_param:
            renamed.setdefault(dims[0].dim_param, "batch")
        if index in tokens and len(dims) > 1 and dims[1].dim_param and dims[1].dim_param not in renamed:
            # inputs whose lengths torch.export tied share one name; an independent one (a decoder's ids
            # beside an encoder's) gets its own, so the graph never declares the two lengths equal
            taken = set(renamed.values())
            wanted = sequence_axis_name(value.name)
            renamed[dims[1].dim_param] = wanted if wanted not in taken else f"{value.name}_sequence"
    for value in list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renamed:
                dim.dim_param = renamed[dim.dim_param]


def _capture_reason(error: BaseException) -> str:
    """torch.export's first line, with the line of the model's code it stopped at (its own frames skipped)."""
    text = "\n".join(str(e) for e in _chain(error))
    frames = [m for m in re.finditer(r'File "([^"]+)", line (\d+), in (\w+)', text)
              if "/torch/" not in m.group(1) and "/workbench/" not in m.group(1)]
    reason = first_line(error)
    if frames:
        path, line, function = frames[-1].groups()
        reason += f" (at {path.rsplit('/', 1)[-1]}:{line}, in {function})"
    return reason


def first_line(error: BaseException) -> str:
    for line in str(error).splitlines():
        line = line.strip()
        if line and not line.startswith("Failed to convert the exported program"):
            return line[:500]
    return type(error).__name__



# "auto" tries the TorchScript exporter first where its graph is the one torch.export would record (see
# fast_path_refusal): it traces the sample once and translates it directly, where torch.export traces twice
# (capture, then decompositions) before the translation: 2-4x less time for a CNN. Both stream the weights
# (see torchscript_weights); a model over TorchScript's own limit takes torch.export, which has none.
FAST_PATH_MAX_BYTES = TORCHSCRIPT_LIMIT
# the newest opset torch's TorchScript exporter writes
TORCHSCRIPT_MAX_OPSET = 20
FAST_PATH_NOTE = ("TorchScript exporter (the fast path: float inputs, INT8 Q/DQ, and a trace without data-dependent "
                  "Python values or run-time shapes, so its graph is the one torch.export records)")


def fast_path_refusal(model: nn.Module, inputs: tuple, opset: int, formats: set[str]) -> str | None:
    """Why ``"auto"`` cannot take the TorchScript fast path for this model, or None where it can.

    The TorchScript trace and torch.export record the same graph for a model whose inputs are all floating
    point (token ids and masks need torch.export's symbolic sequence length), whose quantizers are INT8 (FP8
    and INT4 need opsets 19 and 21 and torch.export's translations), without recurrent layers (TorchScript writes
    them with its own batch handling), and whose trace reads no tensor value into Python and computes no shape at
    run time (checked on the trace: :func:`run_exporter` goes on to torch.export when the tracer warns or the
    graph has a ``Shape`` node, as attention's head split gives).
    """
    if any(not t.is_floating_point() for t in inputs):
        return "an input is not floating point (token ids, masks)"
    if formats - {"int8"}:
        return f"{', '.join(sorted(formats - {'int8'}))} quantizers"
    if opset > TORCHSCRIPT_MAX_OPSET:
        return f"opset {opset} is above the TorchScript exporter's {TORCHSCRIPT_MAX_OPSET}"
    if any(isinstance(m, nn.RNNBase) or type(m).__name__ == "QuantLSTM" for m in model.modules()):
        return "a recurrent layer"
    size = _weight_bytes(model)
    if size > FAST_PATH_MAX_BYTES:
        return f"weights of {_gigabytes(size)}, over the TorchScript exporter's {_gigabytes(FAST_PATH_MAX_BYTES)}"
    return None


def _fast_path(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str], opset: int,
               dynamic_batch: bool, target_path: Path | None) -> tuple[onnx.ModelProto | None, str]:
    """The TorchScript graph when its trace is clean, else None and why (a tracer warning, an error)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            proto = _export_torchscript(model, inputs, input_names, output_names, opset, dynamic_batch, target_path)
        except Exception as error:  # torch.export may still capture it: its errors are the ones to report
            return None, first_line(error)
    traced = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    reason = ""
    if traced:
        reason = f"TorchScript tracer: {traced[0]}"
    elif any(node.op_type == "Shape" for node in proto.graph.node):
        # shapes computed at run time (attention's head split, say), where torch.export's are symbolic or folded
        reason = "the TorchScript graph computes shapes at run time"
    if reason:
        if target_path is not None:
            _discard_data(proto, target_path)
        return None, reason
    return proto, ""


def run_exporter(model: nn.Module, inputs: tuple, input_names: list[str], output_names: list[str], opset: int,
                 dynamic_batch: bool, exporter: Exporter, log: ReportLog, target_path: Path | None = None,
                 threshold: int = EXTERNAL_DATA_THRESHOLD, formats: set[str] | None = None,
                 dynamic_sequence: bool = True):
    """Run the chosen exporter; with "auto", fall back to TorchScript and say why. With ``dynamic_sequence``
    False, axis 1 of token inputs keeps the sample's length (a loop the trace unrolls at that length).

    With "auto" and the quantizers' ``formats``, a model :func:`fast_path_refusal` accepts goes through the
    TorchScript exporter first (its trace checked for tracer warnings); the torch.export-based exporter takes
    over when that trace is not clean.

    With ``target_path``, a torch.export-based graph whose weights exceed ``threshold`` bytes comes back
    without them: they are in a temporary data file beside ``target_path`` (see
    :func:`~workbench.export.onnx_file.external_data_file`), which the caller commits or removes.

    When the fallback fails too, the error shows both exporters' messages, the torch.export-based
    one's first: it is usually the real cause (the fallback's is about what it cannot record). A model
    whose weights are over :data:`TORCHSCRIPT_LIMIT` (protobuf's 2 GB) is never handed to TorchScript:
    the error gives the torch.export-based exporter's problem and says the fallback cannot write it.
    """
    if exporter == "auto" and formats is not None:
        refusal = fast_path_refusal(model, inputs, opset, formats)
        if refusal is None:
            proto, refusal = _fast_path(model, inputs, input_names, output_names, opset, dynamic_batch, target_path)
            if proto is not None:
                return proto, "torchscript", FAST_PATH_NOTE, dynamic_batch
        logger.debug("export: the torch.export-based exporter, not the TorchScript fast path: %s", refusal)
    if exporter == "torchscript":
        try:
            proto = _export_torchscript(model, inputs, input_names, output_names, opset, dynamic_batch,
                                        target_path, dynamic_sequence)
        except _TooLargeForTorchScript as error:
            raise ExportError(f"{error} Export with the torch.export-based exporter ('auto' or 'dynamo'): it "
                              "writes the weights to ONNX external data beside the file.") from error
        return proto, "torchscript", "TorchScript exporter (requested)", dynamic_batch
    try:
        proto, dynamic_batch, note = _export_dynamo(model, inputs, input_names, output_names, opset, dynamic_batch,
                                                    log, target_path, threshold, dynamic_sequence)
        return proto, "dynamo", note, dynamic_batch
    except _CaptureError as error:
        if exporter == "dynamo":
            raise ExportError(f"torch.export could not capture the model: {error}") from error
        primary: ExportError | ValueError | _CaptureError = error
        reason = f"torch.export could not capture the model ({error}); the TorchScript exporter records the " \
                 "path the sample inputs take"
    except ValueError as error:  # opset conversion
        if exporter == "dynamo":
            raise ExportError(str(error)) from error
        primary = error
        reason = f"the torch.export-based exporter writes opset >= {DYNAMO_MIN_OPSET} and {error}"
    except UnsupportedOperationError as error:
        if exporter == "dynamo":
            raise
        primary = error
        reason = f"the torch.export-based one failed ({error})"
    try:
        proto = _export_torchscript(model, inputs, input_names, output_names, opset, dynamic_batch, target_path,
                                    dynamic_sequence)
    except _TooLargeForTorchScript as fallback:
        # the fallback never had a chance: the torch.export-based exporter's problem is the one to fix
        message = (f"The torch.export-based exporter failed: {primary}\n"
                   f"The TorchScript fallback cannot take over: {fallback} Make the model exportable with "
                   "torch.export (the problem above).")
        if isinstance(primary, UnsupportedOperationError):
            raise UnsupportedOperationError(message, primary.operations, primary.layers) from primary
        raise ExportError(message) from primary
    except ExportError as fallback:
        message = (f"Both ONNX exporters failed. The torch.export-based exporter: {primary}\n"
                   f"The TorchScript fallback: {fallback}")
        if isinstance(primary, UnsupportedOperationError):
            raise UnsupportedOperationError(message, primary.operations, primary.layers) from primary
        raise ExportError(message) from primary
    return proto, "torchscript", f"TorchScript exporter: {reason}", dynamic_batch
