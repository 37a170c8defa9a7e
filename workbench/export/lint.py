"""Fusion lint: predict, from an exported QDQ graph, where TensorRT will not fuse the Q/DQ nodes.

TensorRT's explicit-quantization rules ("Working with Quantized Types", Q/DQ layer placement): a
DequantizeLinear is fused into the operation that reads it when that operation has an INT8 kernel
(convolution, deconvolution, matrix multiply, pooling, element-wise add); it is carried forward
through data-movement operations that commute with it (reshape, transpose, slice, concat, ...). Where
it meets anything else it stays a standalone Scale layer. A residual add fuses into the convolution
before it only when that convolution's branch is float and the identity branch is quantized; a
Concat runs in INT8 without re-quantization only when its inputs share one scale; and a quantized
layer between float neighbours pays for Q/DQ without INT8 gain. INT8 tensor-core convolutions want
channel counts that are multiples of 16.

Each finding names the modules (through :mod:`workbench.export.naming`) and carries its fix as data
(:class:`LintFix`: one of :data:`FIX_ACTIONS` and its targets) for the session to apply.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from workbench.export.naming import QUANTIZER_KEY, layer_of_quantizer, node_module
from workbench.quant.algorithms.format_rules import gpu_requirement, reformat_boundaries
from workbench.quant.algorithms.tensorrt_rules import INT8_CHANNEL_ALIGNMENT, int4_block_problem, misaligned_channels

__all__ = ["LINT_KINDS", "FIX_ACTIONS", "LintFix", "LintWarning", "lint_qdq_graph", "INT8_OPS", "COMMUTING_OPS",
           "COMPUTE_OPS", "PROPAGATION_OPS", "AVERAGE_POOL_OPS", "count_text", "layer_formats", "format_findings",
           "MIXED_FORMAT_OPS", "mixed_formats", "int4_blocks"]

# operations with INT8 kernels, into which TensorRT fuses a DequantizeLinear on their input
INT8_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "AveragePool", "MaxPool", "GlobalAveragePool",
                      "GlobalMaxPool", "ReduceMean", "Add", "Sub"})
# data-movement operations a DequantizeLinear is propagated through
COMMUTING_OPS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split", "Concat",
                           "Pad", "Identity", "Gather", "Expand"})
# operations TensorRT's Q/DQ propagation crosses besides data movement: a max commutes with a positive scale,
# so a Quantize after a MaxPool moves before it (and the pool fuses into the INT8 layer before it), when every
# reader of the pool's output is quantized
PROPAGATION_OPS = frozenset({"MaxPool", "GlobalMaxPool", "ReduceMax"})
# pools that average: TensorRT runs them in INT8 only when their input is quantized; left in float between INT8
# layers they make the layer before write float and a Quantize follow them
AVERAGE_POOL_OPS = frozenset({"AveragePool", "GlobalAveragePool", "ReduceMean"})
# what TensorRT fuses after a convolution or GEMM (its epilogue); a Quantize after them fuses too
_EPILOGUE_OPS = frozenset({"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "BatchNormalization", "Add", "Mul",
                           "HardSigmoid", "HardSwish", "Elu", "Selu"})
# the weighted operations a Conv/Linear layer exports to (its main arithmetic)
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})

LINT_KINDS = {
    "dq_into_float_op": "a Dequantize feeds an operation without an INT8 kernel: it will be a standalone Scale layer",
    "residual_not_fusable": "the branches of a residual add are quantized so that it cannot fuse into the convolution",
    "concat_scales_differ": "the inputs of a Concat are quantized with different scales (or some not at all)",
    "isolated_quantized_layer": "a quantized layer whose neighbours are all float: Q/DQ cost without INT8 gain",
    "misaligned_channels": f"a quantized convolution whose channel counts are not multiples of "
                           f"{INT8_CHANNEL_ALIGNMENT}",
    "float_pool_requantized": "an average pool left in float between INT8 layers: the layer before it writes float "
                              "and its output is quantized again",
    "format_needs": "layers TensorRT runs in FP8 or INT4, and the TensorRT version and GPUs those formats need",
    "mixed_formats": "a product or elementwise operation whose quantized inputs are in different formats (INT8 x FP8): "
                     "TensorRT has no kernel for it",
    "int4_block_size": "an INT4 weight in blocks TensorRT does not build (it takes 64 or 128 elements, dividing the "
                       "input features)",
    "format_switch": "a layer in another quantized format than both its neighbours (FP8 between INT8 layers): "
                     "TensorRT converts between the formats there instead of fusing",
}

# the fixes the session knows how to apply
FIX_ACTIONS = {
    "pin": "share one quantizer (scale) between the targets",
    "quantize": "quantize the target layers",
    "leave_float": "leave the target layers in floating point",
    "enable_rule": "switch on the named placement rule",
}


def count_text(warnings: list[Any]) -> str:
    """``"3 fusion warnings"``, ``"1 fusion warning"``, ``"no fusion warnings"``: one wording for the CLI and app."""
    count = len(warnings)
    return f"{count or 'no'} fusion warning{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class LintFix:
    action: str                # a key of FIX_ACTIONS
    targets: tuple[str, ...]   # quantizer or layer names, or the rule's name
    description: str

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "targets": list(self.targets), "description": self.description}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LintFix:
        """The fix :meth:`to_dict` wrote (a project keeps its last lint)."""
        return cls(str(data["action"]), tuple(str(t) for t in data["targets"]), str(data["description"]))


@dataclass
class LintWarning:
    kind: str                  # a key of LINT_KINDS
    modules: list[str]
    message: str
    fix: LintFix | None = None
    severity: str = "warning"  # "warning" or "info"
    nodes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fix"] = self.fix.to_dict() if self.fix is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LintWarning:
        """The warning :meth:`to_dict` wrote (a project keeps its last lint)."""
        fix = data.get("fix")
        return cls(str(data["kind"]), [str(m) for m in data["modules"]], str(data["message"]),
                   LintFix.from_dict(fix) if isinstance(fix, dict) else None, str(data.get("severity", "warning")),
                   [str(n) for n in data.get("nodes") or []])


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {i.name: i for i in graph.initializer}
        for node in self.nodes:
            if node.op_type == "Constant" and node.attribute:
                self.initializers.setdefault(node.output[0], node.attribute[0].t)
        self.outputs = {o.name for o in graph.output}

    def array(self, name: str) -> np.ndarray | None:
        """An initializer's values; None when there is none, or its data lies in a file not loaded (lint reads
        a big model's graph without its weights)."""
        tensor = self.initializers.get(name)
        if tensor is None or (tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data):
            return None
        return numpy_helper.to_array(tensor)

    def quantize_of(self, dq: onnx.NodeProto) -> onnx.NodeProto | None:
        """The QuantizeLinear behind a DequantizeLinear (through the narrow-range Clip)."""
        source = self.producer.get(dq.input[0])
        if source is not None and source.op_type == "Clip":
            source = self.producer.get(source.input[0])
        return source if source is not None and source.op_type == "QuantizeLinear" else None

    def is_weight_dq(self, dq: onnx.NodeProto) -> bool:
        q = self.quantize_of(dq)
        return q is not None and q.input[0] in self.initializers

    def dq_producing(self, tensor: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    def weight_shape(self, node: onnx.NodeProto) -> tuple[int, ...] | None:
        if len(node.input) < 2:
            return None
        dq = self.dq_producing(node.input[1])
        q = self.quantize_of(dq) if dq is not None else None
        tensor = self.initializers.get(q.input[0] if q is not None else node.input[1])
        return tuple(tensor.dims) if tensor is not None else None  # the shape, without reading the weights

    def forward(self, tensor: str, through: frozenset[str] = COMMUTING_OPS) -> Iterator[onnx.NodeProto]:
        """The readers of ``tensor``, looking through operations of the ``through`` types (by default those a
        Dequantize commutes with)."""
        return self.walk(tensor, lambda reader: reader.op_type in through)

    def walk(self, tensor: str, passes: Callable[[onnx.NodeProto], bool]) -> Iterator[onnx.NodeProto]:
        """The readers of ``tensor``, looking through every reader for which ``passes`` is true."""
        seen: set[str] = set()
        stack = [tensor]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            for reader in self.consumers.get(name, []):
                if passes(reader):
                    stack.extend(reader.output)
                else:
                    yield reader


def _quantizer(node: onnx.NodeProto) -> str:
    for entry in node.metadata_props:
        if entry.key == QUANTIZER_KEY:
            return entry.value
    return node.name.rsplit("/", 1)[0]


def _module(node: onnx.NodeProto) -> str:
    module = node_module(node)
    return module if module is not None else node.name


def _activation_input_dq(g: _Graph, node: onnx.NodeProto) -> onnx.NodeProto | None:
    return g.dq_producing(node.input[0]) if node.input else None


def lint_qdq_graph(model: onnx.ModelProto) -> list[LintWarning]:
    """Every fusion hazard in an exported (and module-named) QDQ graph, in graph order."""
    g = _Graph(model)
    found: list[LintWarning] = []
    found += _dq_into_float_ops(g)
    found += _residual_adds(g)
    found += _concats(g)
    found += _isolated_layers(g)
    found += _float_pools(g)
    found += _misaligned(g)
    found += format_findings(g)
    found += mixed_formats(g)
    found += int4_blocks(g)
    unique: dict[tuple, LintWarning] = {}
    for warning in found:
        unique.setdefault((warning.kind, tuple(warning.modules)), warning)
    return list(unique.values())


def _dq_into_float_ops(g: _Graph) -> list[LintWarning]:
    found = []
    for dq in g.nodes:
        if dq.op_type != "DequantizeLinear" or g.is_weight_dq(dq):
            continue
        quantizer = _quantizer(dq)
        layer = layer_of_quantizer(quantizer)[0]
        for reader in g.forward(dq.output[0]):
            if reader.op_type in INT8_OPS or reader.op_type == "QuantizeLinear":
                continue
            found.append(LintWarning(
                "dq_into_float_op", list(dict.fromkeys([layer, _module(reader)])),
                f"{quantizer} is dequantized into {reader.op_type} ({reader.name}), which TensorRT has no INT8 kernel "
                "for: it becomes a standalone Scale layer. Leave that input in float.",
                LintFix("leave_float", (layer,), f"leave {layer} in float"), nodes=[dq.name, reader.name]))
    return found


def _conv_branch(g: _Graph, tensor: str) -> onnx.NodeProto | None:
    """The convolution whose output (through a BatchNormalization) ``tensor`` is, else None."""
    node = g.producer.get(tensor)
    if node is not None and node.op_type == "BatchNormalization":
        node = g.producer.get(node.input[0])
    return node if node is not None and node.op_type in ("Conv", "ConvTranspose") else None


def _residual_adds(g: _Graph) -> list[LintWarning]:
    found = []
    for add in g.nodes:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        operands = []
        for tensor in add.input:
            dq = g.dq_producing(tensor)
            q = g.quantize_of(dq) if dq is not None else None
            source = q.input[0] if q is not None else tensor
            operands.append((dq is not None and q is not None, _conv_branch(g, source)))
        convs = [conv for _, conv in operands if conv is not None and _activation_input_dq(g, conv) is not None]
        if not convs:
            continue  # no INT8 convolution to fuse into
        quantized = [q for q, _ in operands]
        add_module = _module(add)
        modules = list(dict.fromkeys([add_module] + [_module(c) for c in convs]))
        if all(quantized):
            found.append(LintWarning(
                "residual_not_fusable", modules,
                f"both operands of {add.name} are quantized: TensorRT cannot fuse the add into {convs[-1].name} and "
                "runs it as a separate INT8 layer. Leave the convolution's branch in float (the residual rule).",
                LintFix("enable_rule", ("residual",), "switch on the residual placement rule"), nodes=[add.name]))
        elif not any(quantized):
            found.append(LintWarning(
                "residual_not_fusable", modules,
                f"neither operand of {add.name} is quantized: the INT8 convolution {convs[-1].name} must output float "
                "and the add runs in float. Quantize the identity branch.",
                LintFix("quantize", (add_module,), f"quantize the identity branch ({add_module})"), nodes=[add.name]))
        else:
            (quantized_a, conv_a), (quantized_b, conv_b) = operands
            if (quantized_a and conv_a is not None and conv_b is None) or (
                    quantized_b and conv_b is not None and conv_a is None):
                found.append(LintWarning(
                    "residual_not_fusable", modules,
                    f"in {add.name} the convolution's branch is quantized and the identity branch is float, the "
                    "reverse of what TensorRT fuses. Quantize the identity branch and leave the convolution's in "
                    "float.",
                    LintFix("enable_rule", ("residual",), "switch on the residual placement rule"), nodes=[add.name]))
    return found


def _concats(g: _Graph) -> list[LintWarning]:
    found = []
    for concat in g.nodes:
        if concat.op_type != "Concat":
            continue
        dqs = [g.dq_producing(t) for t in concat.input]
        if not any(dqs):
            continue
        names = [_quantizer(dq) for dq in dqs if dq is not None]
        modules = list(dict.fromkeys([_module(concat)] + [layer_of_quantizer(n)[0] for n in names]))
        if not all(dqs):
            found.append(LintWarning(
                "concat_scales_differ", modules,
                f"{concat.name} joins quantized and float inputs: TensorRT re-quantizes around it. Quantize every "
                "input with one shared quantizer, or none.",
                LintFix("leave_float", tuple(dict.fromkeys(layer_of_quantizer(n)[0] for n in names)),
                        "leave the quantized inputs in float"), nodes=[concat.name]))
            continue
        scales = [g.array(dq.input[1]) for dq in dqs]
        if any(s is None for s in scales) or all(np.array_equal(scales[0], s) for s in scales[1:]):
            continue
        unique_names = tuple(dict.fromkeys(names))
        found.append(LintWarning(
            "concat_scales_differ", modules,
            f"the inputs of {concat.name} have different scales ({', '.join(unique_names)}): TensorRT cannot "
            "concatenate INT8 tensors without re-quantizing. Share one quantizer.",
            LintFix("pin", unique_names, "share one scale between " + ", ".join(unique_names)), nodes=[concat.name]))
    return found


def _pool_passes(g: _Graph, pool: onnx.NodeProto) -> bool:
    """Whether TensorRT moves the Quantize after a MaxPool before it: every reader of the pool's output is a
    Quantize (a float reader, such as a residual add's float identity, keeps the pool in float)."""
    readers = list(g.forward(pool.output[0]))
    return bool(readers) and all(reader.op_type == "QuantizeLinear" for reader in readers)


def _reaches_quantize(g: _Graph, tensor: str) -> bool:
    """Whether ``tensor`` reaches a Quantize through epilogue and data-movement ops only, and through the pools
    TensorRT propagates a Quantize across (:data:`PROPAGATION_OPS`)."""
    def passes(reader: onnx.NodeProto) -> bool:
        return reader.op_type in _EPILOGUE_OPS or reader.op_type in COMMUTING_OPS or (
            reader.op_type in PROPAGATION_OPS and _pool_passes(g, reader))

    return any(reader.op_type == "QuantizeLinear" for reader in g.walk(tensor, passes))


def _input_is_int8(g: _Graph, tensor: str) -> bool:
    """Whether the tensor a Quantize reads comes out of an INT8 layer (so the Quantize fuses into it), looking
    back through epilogue and data-movement ops and the pools TensorRT propagates a Quantize across."""
    node = g.producer.get(tensor)
    while node is not None and (node.op_type in _EPILOGUE_OPS or node.op_type in COMMUTING_OPS
                                or (node.op_type in PROPAGATION_OPS and _pool_passes(g, node))):
        if node.op_type in INT8_OPS and node.op_type not in PROPAGATION_OPS \
                and any(g.dq_producing(t) for t in node.input):
            return True
        node = g.producer.get(node.input[0]) if node.input else None
    if node is None:
        return False
    return node.op_type in INT8_OPS and any(g.dq_producing(t) is not None for t in node.input)


def _isolated_layers(g: _Graph) -> list[LintWarning]:
    found = []
    for node in g.nodes:
        if node.op_type not in COMPUTE_OPS:
            continue
        dq = _activation_input_dq(g, node)
        q = g.quantize_of(dq) if dq is not None else None
        if q is None or q.input[0] in g.initializers:
            continue
        if _input_is_int8(g, q.input[0]) or _reaches_quantize(g, node.output[0]):
            continue
        if _after_float_average_pool(g, q.input[0]) or any(
                reader.op_type in AVERAGE_POOL_OPS and _reaches_quantize(g, reader.output[0])
                for reader in g.forward(node.output[0], _EPILOGUE_OPS | COMMUTING_OPS)):
            continue  # the pool's own warning (float_pool_requantized) names the fix: quantizing it joins the two
        module = _module(node)
        found.append(LintWarning(
            "isolated_quantized_layer", [module],
            f"{module} is quantized but what feeds it and what reads it run in float: TensorRT quantizes its input and "
            "dequantizes its output around it, which may cost more than INT8 saves.",
            LintFix("leave_float", (module,), f"leave {module} in float"), severity="info", nodes=[node.name]))
    return found


def _after_float_average_pool(g: _Graph, tensor: str) -> bool:
    """Whether ``tensor`` is a float average pool's output (through data movement), quantized for what reads it."""
    node = g.producer.get(tensor)
    while node is not None and node.op_type in COMMUTING_OPS and node.input:
        node = g.producer.get(node.input[0])
    return node is not None and node.op_type in AVERAGE_POOL_OPS and bool(node.input) \
        and g.dq_producing(node.input[0]) is None


def _float_pools(g: _Graph) -> list[LintWarning]:
    """Average pools read in float whose output is quantized again: TensorRT Engine Explorer's qgap case."""
    found = []
    for pool in g.nodes:
        if pool.op_type not in AVERAGE_POOL_OPS or not pool.input or g.dq_producing(pool.input[0]) is not None:
            continue
        if not _reaches_quantize(g, pool.output[0]):
            continue
        source = g.producer.get(pool.input[0])
        while source is not None and (source.op_type in _EPILOGUE_OPS or source.op_type in COMMUTING_OPS) \
                and source.op_type not in COMPUTE_OPS and source.input:
            if source.op_type == "Add" and any(g.dq_producing(t) for t in source.input):
                break
            source = g.producer.get(source.input[0])
        before = _module(source) if source is not None else "the layer before it"
        module = _module(pool)
        found.append(LintWarning(
            "float_pool_requantized", [module],
            f"{module} ({pool.op_type}) runs in float between INT8 layers: TensorRT makes {before} write its output in "
            "float and quantizes the pool's output again for the next layer. Quantize the pool's input so it runs in "
            "INT8 (TensorRT Engine Explorer's qgap step).",
            LintFix("quantize", (module,), f"quantize {module}"), nodes=[pool.name]))
    return found


def _feeds_graph_output(g: _Graph, node: onnx.NodeProto) -> bool:
    """Whether ``node``'s output is the graph's output, directly or through epilogue and data-movement ops."""
    seen: set[str] = set()
    stack = list(node.output)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in g.outputs:
            return True
        for reader in g.consumers.get(name, []):
            if reader.op_type in _EPILOGUE_OPS or reader.op_type in COMMUTING_OPS or reader.op_type in QDQ_PAIR:
                stack.extend(reader.output)
    return False


QDQ_PAIR = frozenset({"QuantizeLinear", "DequantizeLinear"})


def _misaligned(g: _Graph) -> list[LintWarning]:
    found = []
    for node in g.nodes:
        if node.op_type not in ("Conv", "ConvTranspose") or _activation_input_dq(g, node) is None:
            continue
        shape = g.weight_shape(node)
        if shape is None or len(shape) < 3:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type == "Conv":
            out_channels, in_channels = shape[0], shape[1] * group
        else:
            in_channels, out_channels = shape[0], shape[1] * group
        # a head writing the network's result (a 1x1 convolution to the classes) keeps its count: no hazard
        why = misaligned_channels(in_channels, out_channels, output_is_result=_feeds_graph_output(g, node))
        if why is None:
            continue
        module = _module(node)
        found.append(LintWarning(
            "misaligned_channels", [module],
            f"{module}: {why}. Round the channel counts up, or leave a small layer in float.",
            LintFix("leave_float", (module,), f"leave {module} in float"), severity="info", nodes=[node.name]))
    return found


# ----- formats (FP8, INT4 weight-only) ------------------------------------------------------------------

_FP8_TYPES = frozenset({onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ})


def _dq_format(g: _Graph, dq: onnx.NodeProto) -> str | None:
    """"fp8", "int8" or "int4" from a DequantizeLinear's zero point or quantized input; None if not told."""
    if dq.op_type.startswith("TRT_FP8"):  # pytorch-quantization's custom FP8 ops (TensorRT before 10)
        return "fp8"
    values = g.initializers.get(dq.input[0]) if dq.input else None
    cast = g.producer.get(dq.input[0]) if dq.input else None
    if (values is not None and values.data_type == onnx.TensorProto.FLOAT4E2M1) or (
            cast is not None and cast.op_type == "TRT_FP4DynamicQuantize"):
        return "nvfp4"
    if (values is not None and values.data_type == onnx.TensorProto.INT4) or (
            cast is not None and cast.op_type == "Cast"
            and any(a.name == "to" and a.i == onnx.TensorProto.INT4 for a in cast.attribute)):
        return "int4"
    zero = g.initializers.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if zero is not None:
        if zero.data_type in _FP8_TYPES:
            return "fp8"
        if zero.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
            return "int8"
    return "int8"  # no zero point: ONNX's default is uint8


def _dq_of(g: _Graph, tensor: str) -> onnx.NodeProto | None:
    node = g.producer.get(tensor)
    return node if node is not None and (node.op_type == "DequantizeLinear" or node.op_type.startswith(
        "TRT_FP8Dequantize")) else None


def layer_formats(model_or_graph: onnx.ModelProto | _Graph) -> dict[str, str]:
    """The precision each compute operation (Conv, Gemm, MatMul) of a QDQ graph runs in, by module, in graph
    order: ``int8`` / ``fp8`` / ``nvfp4`` (its input's Q/DQ), ``int4w`` (an INT4 blockwise weight, float input),
    ``float``."""
    g = model_or_graph if isinstance(model_or_graph, _Graph) else _Graph(model_or_graph)
    formats: dict[str, str] = {}
    for node in g.nodes:
        if node.op_type not in COMPUTE_OPS:
            continue
        activation = _dq_of(g, node.input[0]) if node.input else None
        weight = _dq_of(g, node.input[1]) if len(node.input) > 1 else None
        if activation is not None:
            fmt = _dq_format(g, activation)
            fmt = "int8" if fmt == "int4" else fmt
        elif weight is not None and _dq_format(g, weight) == "int4":
            fmt = "int4w"
        else:
            fmt = "float"
        formats.setdefault(_module(node), fmt)
    return formats


def format_findings(g: _Graph) -> list[LintWarning]:
    """Which layers run in FP8 or INT4 and what that needs from TensorRT and the GPU (one note per format),
    and the layers whose format differs from both quantized neighbours (a conversion between formats)."""
    formats = layer_formats(g)
    found = []
    for fmt, label in (("fp8", "FP8 (E4M3)"), ("int4w", "INT4 weight-only"),
                       ("nvfp4", "NVFP4 (FP4 E2M1, FP8 block scales)")):
        modules = [m for m, f in formats.items() if f == fmt]
        if modules:
            shown = ", ".join(modules[:6]) + (f" and {len(modules) - 6} more" if len(modules) > 6 else "")
            found.append(LintWarning(
                "format_needs", modules, f"TensorRT runs {len(modules)} layer{'s' if len(modules) > 1 else ''} in "
                f"{label}: {shown}. {gpu_requirement(fmt)}; on an older GPU TensorRT refuses the Q/DQ (or, built "
                "weakly typed, runs those layers in FP16/FP32).", severity="info"))
    order = list(formats)
    for module, fmt, around, where in reformat_boundaries(order, formats):
        found.append(LintWarning(
            "format_switch", [module], f"{module} runs {fmt} between two {around} layers ({where}): TensorRT converts "
            f"{around} to {fmt} and back around it instead of fusing. Run it in {around} too if its accuracy allows.",
            None, severity="info"))
    return found


# operations that combine their inputs' values (products, elementwise arithmetic): TensorRT runs them in one format,
# so their dequantized inputs must agree (an INT8 x FP8 product has no kernel)
MIXED_FORMAT_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Add", "Sub", "Mul", "Div"})


def _dq_behind(g: _Graph, tensor: str) -> onnx.NodeProto | None:
    """The DequantizeLinear whose output ``tensor`` is, looking back through data movement (a transposed key)."""
    node = g.producer.get(tensor)
    while node is not None and node.op_type in COMMUTING_OPS and node.op_type != "Concat" and node.input:
        node = g.producer.get(node.input[0])
    return node if node is not None and (node.op_type == "DequantizeLinear" or node.op_type.startswith(
        "TRT_FP8Dequantize")) else None


def mixed_formats(g: _Graph) -> list[LintWarning]:
    """Products and elementwise operations (:data:`MIXED_FORMAT_OPS`) whose dequantized inputs are in different
    formats, INT8 and FP8 (an INT4 weight is left out: TensorRT pairs it with FP8 or float activations)."""
    found = []
    for node in g.nodes:
        if node.op_type not in MIXED_FORMAT_OPS:
            continue
        dqs = [dq for dq in (_dq_behind(g, tensor) for tensor in node.input if tensor) if dq is not None]
        formats = {_quantizer(dq): _dq_format(g, dq) for dq in dqs}
        kinds = sorted({fmt for fmt in formats.values() if fmt != "int4"})
        if len(kinds) < 2:
            continue
        module = _module(node)
        layers = list(dict.fromkeys(layer_of_quantizer(q)[0] for q in formats))
        found.append(LintWarning(
            "mixed_formats", list(dict.fromkeys([module, *layers])),
            f"{node.op_type} {module} ({node.name}) takes inputs in different formats "
            f"({', '.join(f'{q}: {fmt}' for q, fmt in formats.items())}): TensorRT has no kernel that mixes "
            f"{' and '.join(k.upper() for k in kinds)}; it refuses the graph or inserts conversions. Set the layer's "
            "precision as a whole (workbench set --precision) so that every input is in one format.",
            None, nodes=[node.name]))
    return found


def int4_blocks(g: _Graph) -> list[LintWarning]:
    """INT4 weights dequantized in blocks TensorRT does not build (:func:`int4_block_problem`: 64 or 128 elements
    dividing the input features): a project set before the workbench checked them exports them as they are."""
    found = []
    for dq in g.nodes:
        if dq.op_type != "DequantizeLinear" or _dq_format(g, dq) != "int4":
            continue
        attributes = {a.name: a.i for a in dq.attribute}
        block = attributes.get("block_size")
        values = g.initializers.get(dq.input[0])
        if values is None:  # an INT4 Cast of a computed tensor: its shape is not in the file
            cast = g.producer.get(dq.input[0])
            values = g.initializers.get(cast.input[0]) if cast is not None and cast.input else None
        if not block or values is None:
            continue
        axis = attributes.get("axis", 1) % max(len(values.dims), 1)
        problem = int4_block_problem(int(block), int(values.dims[axis]) if values.dims else None)
        if problem is None:
            continue
        layer = layer_of_quantizer(_quantizer(dq))[0]
        readers = [_module(reader) for reader in g.forward(dq.output[0])]
        module = readers[0] if readers else layer
        found.append(LintWarning(
            "int4_block_size", [module], f"{module}: {problem} Set it again with workbench set --layer {module} "
            "--precision int4w (the block is chosen to fit) or --block-size.", None, nodes=[dq.name]))
    return found
