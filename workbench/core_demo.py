"""Headless demo of the core on the built-in digits CNN: FP32 against INT8 per calibration method.

Quantizes the model in place (per-channel max for weights, histogram for activations), collects the
histograms once, then loads each amax method from the same histograms and measures test accuracy
and output SQNR. The project-based demo of ``workbench demo`` builds on the same steps.
"""
from __future__ import annotations

import copy
import math

import torch

from workbench.quant import QuantDescriptor, TensorQuantizer, replace_to_quantization_module
from workbench.quant.calibrate import calibrate, sqnr_db
from workbench.quant.kernels import backend_name
from workbench.sources import demo

METHODS = ("max", "entropy", "mse", "percentile")


def _outputs(model: torch.nn.Module, split: demo.DigitsSplit) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(images) for images, _ in split.batches(256)])


def run_core_demo(methods: str = "all", calib_batches: int = 8, batch_size: int = 64,
                  show_progress: bool = False) -> dict:
    """Run the demo and return a report (a dict with a ``text`` rendering)."""
    if calib_batches < 1 or batch_size < 1:
        raise ValueError("calib-batches and batch-size must be positive.")
    chosen = list(METHODS) if methods == "all" else [methods]
    model = demo.load_digits_cnn()
    train = demo.load_digits_split("train")
    test = demo.load_digits_split("test")
    fp32_accuracy = demo.accuracy(model, test)
    fp32_outputs = _outputs(model, test)

    quant_model = copy.deepcopy(model)
    report = replace_to_quantization_module(
        quant_model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    for module in quant_model.modules():
        if isinstance(module, TensorQuantizer):
            module.rounding = "onnx"  # what the exported QDQ graph will compute

    progress = None
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=calib_batches, desc="calibrating", unit="batch", leave=False)

        def progress(done: int, total: int, message: str) -> None:
            bar.update(1)

    batches = train.batches(batch_size)
    result = calibrate(quant_model, batches, num_batches=calib_batches, method=chosen[0], progress=progress)
    if bar is not None:
        bar.close()

    rows = []
    for method in chosen:
        for name, module in quant_model.named_modules():
            if isinstance(module, TensorQuantizer) and name in result.quantizers and \
                    type(module._calibrator).__name__ == "HistogramCalibrator":
                module.load_calib_amax(method)  # same histograms, no new pass over the data
        rows.append({"method": method, "int8_accuracy": demo.accuracy(quant_model, test),
                     "output_sqnr_db": sqnr_db(fp32_outputs, _outputs(quant_model, test))})

    lines = [
        "Quant Workbench core demo: digits CNN (8x8 images, 10 classes)",
        f"  fake-quant kernel: {backend_name()}; {report.summary()}; "
        f"calibrated on {result.num_batches} batches of {batch_size} in {result.wall_time_s:.2f} s",
        f"  FP32 test accuracy: {fp32_accuracy:.4f} ({len(test.labels)} images)",
        "",
        f"  {'amax method':<12} {'INT8 accuracy':>14} {'delta':>8} {'output SQNR':>12}",
    ]
    for row in rows:
        sqnr = row["output_sqnr_db"]
        sqnr_text = "inf" if sqnr is not None and math.isinf(sqnr) else f"{sqnr:.1f} dB"
        lines.append(f"  {row['method']:<12} {row['int8_accuracy']:>14.4f} "
                     f"{row['int8_accuracy'] - fp32_accuracy:>+8.4f} {sqnr_text:>12}")
    lines += ["", "  quantizer amax (last method):"]
    for name, module in quant_model.named_modules():
        if isinstance(module, TensorQuantizer):
            lines.append(f"    {name:<34} {module._short_amax()}")
    return {
        "fp32_accuracy": fp32_accuracy,
        "results": rows,
        "replaced": report.replaced_names,
        "calibration_batches": result.num_batches,
        "kernel": backend_name(),
        "text": "\n".join(lines),
    }
