"""Checks of a calibrated amax against the histogram it came from: warnings that name the quantizer.

A calibration that loses a layer must not pass silently. Three things are checked per histogram quantizer,
each from the histogram of |x| and the amax alone (no pass over the data):

- ``clipped``: the amax cuts a large share of the values, or most of the range, off;
- ``zeros``: most of the tensor is exact zeros (padding, a dead ReLU), which is what misleads entropy
  (it ignores the zero bin) and percentile (it counts every zero);
- ``zeroed``: the amax is so large against the values that most non-zero inputs quantize to 0.

Plain numbers in, :class:`CalibrationWarning` out: nothing here knows of modules.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from workbench.quant.tensor_quant import max_bound_of

__all__ = ["CalibrationWarning", "WARNING_KINDS", "histogram_warnings", "CLIP_MASS", "CLIP_RANGE", "MOSTLY_ZEROS",
           "HALF_ZEROS", "ZEROED_SHARE"]

# What each kind of warning means, for --help texts, the JSON's readers and the GUI's tooltips.
WARNING_KINDS: dict[str, str] = {
    "clipped": "the amax cuts off a large share of the values or most of the range",
    "zeros": "most of the tensor is exact zeros (padding, dead activations)",
    "zeroed": "the amax quantizes most non-zero inputs to 0",
    "collapsed": "the amax is 0: every input quantizes to 0",
    "thin": "too few values for the histogram method",
}

# An amax that leaves more than this share of the values above it clips the distribution's body, not its tail.
CLIP_MASS = 0.01
# An amax under this share of the largest |x| cuts most of the range (CREPE's padded conv input: 0.99 of 10).
CLIP_RANGE = 0.2
# A tensor whose share of values in the zero bin is above this is "mostly zeros" (a ReLU output often has half
# its values at 0, so the warning waits for more, or for a clipping amax: the padded input that misleads entropy).
MOSTLY_ZEROS = 0.9
HALF_ZEROS = 0.3
# Above this share of the non-zero values quantizing to 0, the quantizer zeroes its input.
ZEROED_SHARE = 0.5


@dataclass(frozen=True)
class CalibrationWarning:
    """A warning about one quantizer's calibration: ``kind`` (a key of :data:`WARNING_KINDS`) and a message
    that starts with the quantizer's name."""

    quantizer: str
    kind: str
    message: str

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationWarning:
        return cls(str(data["quantizer"]), str(data["kind"]), str(data["message"]))


def histogram_warnings(name: str, hist: np.ndarray, bin_width: float, amax: float, max_value: float, *,
                       num_bits: int, unsigned: bool, method: str) -> list[CalibrationWarning]:
    """Warnings about ``amax`` (chosen by ``method``) for quantizer ``name`` whose histogram of |x| is
    ``hist`` (bins of ``bin_width`` from 0) with largest value ``max_value``."""
    counts = np.asarray(hist, dtype=np.float64)
    total = float(counts.sum())
    if total <= 0 or not max_value > 0 or not bin_width > 0:
        return []
    warnings = []
    zero_share = float(counts[0]) / total
    if zero_share > MOSTLY_ZEROS and amax > 2.0 ** -24:
        warnings.append(CalibrationWarning(
            name, "zeros", f"{name}: {zero_share:.0%} of its {int(total)} input values are 0 (|x| under "
            f"{bin_width:.3g}, the histogram's first bin), e.g. padding or dead activations; methods disagree "
            "most on such tensors (entropy ignores the zeros, percentile counts them): compare them, or use 'auto'."))
    if amax <= 2.0 ** -24:
        warnings.append(CalibrationWarning(
            name, "collapsed", f"{name}: {method} amax {amax:.3g} quantizes every input to 0, while the largest |x| "
            f"seen is {max_value:.4g}; pick another method for this quantizer or leave the layer in float."))
        return warnings
    # bins wholly above amax are clipped; a bin that straddles it counts in proportion
    edges_low = np.arange(counts.size) * bin_width
    above = np.clip((edges_low + bin_width - amax) / bin_width, 0.0, 1.0)
    clipped_share = float((counts * above).sum()) / total
    range_kept = amax / max_value
    if amax < max_value and (clipped_share > CLIP_MASS or range_kept < CLIP_RANGE):
        zeros = (f" {zero_share:.0%} of its values are 0 (padding?), which {method} may discount;"
                 if HALF_ZEROS < zero_share <= MOSTLY_ZEROS else "")
        warnings.append(CalibrationWarning(
            name, "clipped", f"{name}: {method} amax {amax:.4g} is {range_kept:.1%} of the largest |x| "
            f"({max_value:.4g}) and clips {clipped_share:.2%} of the values to it;{zeros} if the clipped values "
            "matter, try max or mse, or 'auto'."))
    step = amax / max_bound_of(num_bits, unsigned)
    nonzero = total - float(counts[0])
    below = int(np.floor(step / 2 / bin_width))  # bins wholly under half a step round to 0
    if nonzero > 0 and below > 1:
        zeroed = float(counts[1:min(below, counts.size)].sum())
        if zeroed / nonzero > ZEROED_SHARE:
            warnings.append(CalibrationWarning(
                name, "zeroed", f"{name}: with amax {amax:.4g} ({method}) a quantization step is {step:.3g}, so "
                f"{zeroed / nonzero:.0%} of its non-zero inputs quantize to 0; the values are far below the amax "
                "(one outlier?): try percentile or mse, or 'auto'."))
    return warnings
