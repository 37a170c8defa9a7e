"""What TensorRT does with a mix of precisions: the GPUs each format needs, and where a mix breaks fusion.

One home for this knowledge, read by the ladder search (its notes), the lint (:mod:`workbench.export.lint`)
and the engine report. From NVIDIA's documentation (TensorRT's explicit quantization; Model Optimizer's
support matrix: FP8 "Ada and later", INT4 weight-only W4A16 "Ampere and later"):

* FP8 (E4M3) Q/DQ builds FP8 kernels on compute capability 8.9 and newer (Ada, Hopper, Blackwell), with
  TensorRT 8.6+ (TensorRT's custom FP8 ops) or 10+ (standard ONNX QuantizeLinear to float8e4m3fn).
* INT4 weight-only (blockwise ``DequantizeLinear`` into a GEMM's weight) builds with TensorRT 10 and newer;
  its weight-only GEMM kernels need compute capability 8.0 and newer (Ampere onwards).
* NVFP4 (FP4 E2M1 values in blocks of 16 with FP8 E4M3 block scales and an FP32 global scale; weights as FP4
  initializers, activations through ``TRT_FP4DynamicQuantize``) builds with TensorRT 10.8 and newer on
  compute capability 10.0 and newer (Blackwell: B200, GB200, RTX 50xx), for GEMMs.
* INT8 builds on every GPU TensorRT supports.

A layer whose precision differs from both neighbours runs alone: TensorRT cannot fuse a Q/DQ boundary into
the neighbouring float (or other-format) kernels, so it adds reformatting layers before and after it, and a
single INT8/FP8 layer between float ones often costs more in reformats than it saves.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["FormatNeeds", "FORMAT_NEEDS", "gpu_requirement", "isolated_layers", "reformat_boundaries",
           "mix_notes", "supports", "order_neighbours", "isolated_in_flow", "switches_in_flow", "flow_notes"]


@dataclass(frozen=True)
class FormatNeeds:
    """What a precision needs from the GPU and TensorRT."""

    precision: str
    min_compute_capability: tuple[int, int] | None  # None: any GPU TensorRT runs on
    min_tensorrt: str
    gpus: str  # in words


FORMAT_NEEDS: dict[str, FormatNeeds] = {
    "int8": FormatNeeds("int8", None, "8.0", "every GPU TensorRT supports"),
    "fp8": FormatNeeds("fp8", (8, 9), "8.6 (TRT_FP8 custom ops) / 10.0 (standard Q/DQ)",
                       "compute capability 8.9+: Ada (L4, L40, RTX 40xx), Hopper (H100, H200), Blackwell"),
    "int4w": FormatNeeds("int4w", (8, 0), "10.0", "compute capability 8.0+: Ampere (A100, A10) and newer"),
    "nvfp4": FormatNeeds("nvfp4", (10, 0), "10.8", "compute capability 10.0+: Blackwell (B200, GB200, RTX 50xx)"),
}


def gpu_requirement(precision: str) -> str | None:
    """One sentence: what ``precision`` needs to build in TensorRT (None for float)."""
    needs = FORMAT_NEEDS.get(precision)
    if needs is None:
        return None
    return f"{precision} needs TensorRT {needs.min_tensorrt} and {needs.gpus}"


def supports(precision: str, compute_capability: tuple[int, int] | None) -> bool | None:
    """Whether a GPU of ``compute_capability`` builds ``precision`` kernels (None: not known)."""
    needs = FORMAT_NEEDS.get(precision)
    if needs is None or needs.min_compute_capability is None:
        return True
    if compute_capability is None:
        return None
    return tuple(compute_capability) >= needs.min_compute_capability


def _quantized(precision: str | None) -> bool:
    return precision not in (None, "float", "custom")


def isolated_layers(order: Sequence[str], precisions: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """Quantized layers whose neighbours in ``order`` (model order of the layers with a precision) both run in
    float: ``(layer, its precision, previous, next)``. Each needs a reformat on either side."""
    names = [n for n in order if n in precisions]
    found = []
    for i in range(1, len(names) - 1):
        here = precisions[names[i]]
        before, after = precisions[names[i - 1]], precisions[names[i + 1]]
        if _quantized(here) and before == "float" and after == "float":
            found.append((names[i], here, names[i - 1], names[i + 1]))
    return found


def reformat_boundaries(order: Sequence[str], precisions: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """Quantized layers in a format other than both their quantized neighbours' shared format (an FP8 layer
    between two INT8 layers): ``(layer, its precision, the neighbours' precision, "prev/next")``. TensorRT
    converts between the formats there instead of fusing."""
    names = [n for n in order if n in precisions]
    found = []
    for i in range(1, len(names) - 1):
        here, before, after = precisions[names[i]], precisions[names[i - 1]], precisions[names[i + 1]]
        if _quantized(here) and _quantized(before) and before == after and here != before:
            found.append((names[i], here, before, f"{names[i - 1]}/{names[i + 1]}"))
    return found


def mix_notes(order: Sequence[str], precisions: Mapping[str, str]) -> list[str]:
    """Readable notes on a mix: isolated quantized layers, format switches, and what the formats need."""
    notes = [f"{layer} runs {precision} between float layers {before} and {after}: TensorRT adds a reformat on "
             f"each side; consider leaving it in float too" for layer, precision, before, after
             in isolated_layers(order, precisions)]
    notes += [f"{layer} runs {precision} between two {around} layers ({where}): TensorRT converts {around} <-> "
              f"{precision} there instead of fusing" for layer, precision, around, where
              in reformat_boundaries(order, precisions)]
    used = sorted({p for p in precisions.values() if p in FORMAT_NEEDS and p != "int8"})
    notes += [text for text in (gpu_requirement(p) for p in used) if text]
    return notes


Flow = Mapping[str, "tuple[set[str], set[str]]"]  # layer -> (its producers, its consumers) in the data flow


def order_neighbours(order: Sequence[str]) -> dict[str, tuple[set[str], set[str]]]:
    """Each layer's producers and consumers when nothing better is known: the layers before and after it in
    ``order``."""
    names = list(order)
    return {name: ({names[i - 1]} if i else set(), {names[i + 1]} if i + 1 < len(names) else set())
            for i, name in enumerate(names)}


def _sides(flow: Flow, layer: str, precisions: Mapping[str, str]) -> tuple[list[str], list[str]] | None:
    """The producers and consumers of ``layer`` that have a precision; None unless both sides have some (a layer
    at the start or the end of the network is not between anything)."""
    producers, consumers = flow[layer]
    before = sorted(n for n in producers if n in precisions)
    after = sorted(n for n in consumers if n in precisions)
    return (before, after) if before and after else None


def isolated_in_flow(flow: Flow, precisions: Mapping[str, str],
                     gemms: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, str, list[str]]]:
    """Quantized layers whose producers and consumers in the data flow (``flow``) all run in float:
    ``(layer, its precision, the neighbours)``. A GEMM (``gemms``: a Linear, a convolution, an activation product)
    is never listed: a quantized GEMM with float input and output is TensorRT's normal W8A8 pattern (the input Q
    runs as its own kernel, the output is written in float), worth its Q/DQ; a lone quantized add or pool is not."""
    found = []
    for layer in flow:
        here = precisions.get(layer)
        sides = _sides(flow, layer, precisions)
        if layer in gemms or not _quantized(here) or sides is None:
            continue
        around = sides[0] + sides[1]
        if all(precisions[n] == "float" for n in around):
            found.append((layer, str(here), around))
    return found


def switches_in_flow(flow: Flow, precisions: Mapping[str, str]) -> list[tuple[str, str, str, list[str]]]:
    """Quantized layers whose producers and consumers in the data flow all run in one other quantized format (FP8
    between INT8 layers): ``(layer, its precision, the neighbours' precision, the neighbours)``."""
    found = []
    for layer in flow:
        here = precisions.get(layer)
        sides = _sides(flow, layer, precisions)
        if not _quantized(here) or sides is None:
            continue
        around = sides[0] + sides[1]
        formats = {precisions[n] for n in around}
        if len(formats) == 1:
            (other,) = formats
            if _quantized(other) and other != here:
                found.append((layer, str(here), other, around))
    return found


def flow_notes(flow: Flow, precisions: Mapping[str, str], gemms: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """:func:`mix_notes` in the data flow: a quantized layer (not a GEMM) alone among float producers and
    consumers, a format switch among one other format, and what the formats need."""
    notes = [f"{layer} runs {precision} while every layer it reads from and writes to runs in float "
             f"({', '.join(around[:3])}): TensorRT adds a reformat on each side; consider leaving it in float too"
             for layer, precision, around in isolated_in_flow(flow, precisions, gemms)]
    notes += [f"{layer} runs {precision} while every layer it reads from and writes to runs {other} "
              f"({', '.join(around[:3])}): TensorRT converts {other} <-> {precision} there instead of fusing"
              for layer, precision, other, around in switches_in_flow(flow, precisions)]
    used = sorted({p for p in precisions.values() if p in FORMAT_NEEDS and p != "int8"})
    notes += [text for text in (gpu_requirement(p) for p in used) if text]
    return notes
