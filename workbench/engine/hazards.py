"""What went wrong with the quantization in the engine, as hazards a deployment engineer acts on.

Each check is a function over the mapped engine (:mod:`workbench.engine.graph`) returning
:class:`EngineHazard` records of one of :data:`HAZARD_KINDS`; format-specific checks (FP8, INT4) join as
further functions and kinds. What is expected is not a hazard: the network input's Quantize, the output's
Dequantize, and a classifier head whose output count is the number of classes.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.engine.costs import EngineCost
from workbench.engine.graph import EngineGraph, MappedLayer
from workbench.quant.algorithms.tensorrt_rules import INT8_CHANNEL_ALIGNMENT, misaligned_channels

__all__ = ["HAZARD_KINDS", "FLOAT_PRECISIONS", "EngineHazard", "quantized_ran_float", "layer_hazards",
           "cost_hazards"]

# one vocabulary for the CLI, the GUI and the JSON: kind -> what it means
HAZARD_KINDS = {
    "quantized_not_int8": "a layer the project quantizes ran in floating point",
    "unfused_qdq": "a Quantize/Dequantize left as a standalone Scale layer",
    "int8_reformat": "a Reformat layer converting between INT8 and floating point",
    "requantize": "a float layer at a quantized boundary: its output is quantized again for the next INT8 layer",
    "misaligned_int8_conv": f"an INT8 convolution whose channel counts are not multiples of {INT8_CHANNEL_ALIGNMENT}",
}

FLOAT_PRECISIONS = ("FP32", "FP16", "BF16")


@dataclass
class EngineHazard:
    kind: str
    modules: list[str]
    engine_layer: str
    advice: str


def quantized_ran_float(module: str, mapped: MappedLayer, precision: str) -> EngineHazard:
    """A layer the project quantizes whose engine layer read (some of) its inputs in floating point."""
    layer = mapped.layer
    floats = [f"input {i} is {layer.inputs[i].precision}" for i in mapped.inputs_of(module)
              if i < len(layer.inputs) and layer.inputs[i].precision in FLOAT_PRECISIONS]
    which = f" ({', '.join(floats)} of a layer that reads INT8 too)" if floats and "INT8" in layer.input_precisions \
        else ""
    return EngineHazard(
        "quantized_not_int8", [module], layer.name,
        f"TensorRT ran {module} in {precision}{which} although the project quantizes it: check that the engine was "
        "built with INT8 allowed (--int8, --best or --stronglyTyped) and that the layer's inputs have Q/DQ "
        "(`workbench lint`); if INT8 is slower here, leave the layer in float.")


def layer_hazards(index: int, graph: EngineGraph, detailed: bool) -> list[EngineHazard]:
    """The hazards of engine layer ``index`` on its own: unfused Q/DQ, INT8 reformats, misaligned channels."""
    mapped = graph.layers[index]
    layer = mapped.layer
    found: list[EngineHazard] = []
    kind = layer.kind.lower()
    qdq_modules = [p.module for p in mapped.parts if p.qdq and p.module is not None]
    modules = list(dict.fromkeys(qdq_modules or mapped.modules))
    precision_in, precision_out = layer.precision, layer.output_precision
    int8_in, int8_out = precision_in == "INT8", precision_out == "INT8"
    # the network input's Quantize and the output's Dequantize are needed: not hazards
    expected = (layer.reads_input and int8_out and not int8_in) or (layer.writes_output and int8_in and not int8_out)
    if "reformat" in kind:
        if int8_in != int8_out and None not in (precision_in, precision_out) and not expected \
                and not (detailed and mapped.quantizes):  # a standalone Quantize: a "requantize" cost
            found.append(EngineHazard(
                "int8_reformat", modules, layer.name,
                f"TensorRT converts {precision_in} to {precision_out} here: an INT8 tensor meets a float layer. "
                "Quantize the float neighbour too, or leave the INT8 one in float, so both sides agree."))
        return found
    only_qdq = bool(mapped.parts) and all(p.qdq for p in mapped.parts if p.module is not None) and bool(qdq_modules)
    # without formats, only a layer of nothing but Dequantize nodes is surely standalone
    plain_dq = not detailed and only_qdq and all("DequantizeLinear" in p.part for p in mapped.parts
                                                 if p.module is not None)
    if plain_dq or (detailed and (only_qdq or "scale" in kind) and not expected and int8_in != int8_out
                    and not mapped.quantizes):
        role = "Dequantize" if int8_in else "Quantize" if int8_out else "Quantize/Dequantize"
        found.append(EngineHazard(
            "unfused_qdq", modules, layer.name,
            f"a standalone {role} costs a pass over the tensor without INT8 compute: its neighbour has no INT8 "
            "kernel, or the scales around it differ. `workbench lint` names the fix (share the scale, or leave "
            "the layer in float)."))
    first_int8 = bool(layer.inputs) and layer.inputs[0].precision == "INT8"
    if first_int8 and ("convolution" in kind or "deconvolution" in kind):
        channels = _channels(mapped)
        # a classifier head's output count is the number of classes: the task fixes it, not a hazard
        why = misaligned_channels(*channels, output_is_result=graph.feeds_output(index)) \
            if channels is not None else None
        if why is not None:
            found.append(EngineHazard(
                "misaligned_int8_conv", [mapped.main or m for m in modules[:1]] or modules, layer.name,
                f"{why}. Round the channel counts up, or leave a small layer in float."))
    return found


def _channels(mapped: MappedLayer) -> tuple[int, int] | None:
    layer = mapped.layer
    if not layer.inputs or not layer.outputs:
        return None
    dims_in, dims_out = layer.inputs[0].dims, layer.outputs[0].dims
    if not dims_in or not dims_out or len(dims_in) < 2 or len(dims_out) < 2:
        return None
    return dims_in[1], dims_out[1]


def cost_hazards(costs: list[EngineCost]) -> list[EngineHazard]:
    """One hazard per cause of re-quantization, naming the modules whose float boundary forces it."""
    found = []
    for cost in costs:
        if cost.kind != "requantize":
            continue
        more = f" (+{len(cost.layers) - 1} more)" if len(cost.layers) > 1 else ""
        found.append(EngineHazard("requantize", list(cost.modules), cost.layers[0] + more, cost.text()))
    return found
