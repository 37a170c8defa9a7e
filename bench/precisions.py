"""Per precision, on the models of bench/model_zoo.py and the outlier block of issue 22: output SQNR against
FP32, weight bytes (scales included), the time of one calibration and of one validated export.

Each row quantizes a model one way, with the precision registry's descriptors (workbench.quant.algorithms.precision):

* ``int8``: every quantizable layer INT8 (inputs per-tensor, histogram/entropy as a new project's default;
  weights per output channel);
* ``fp8``: every layer FP8 E4M3 (amax by max, FP8's default; weights per output channel);
* ``int4w``: INT4 weights in blocks (``--block-size``) on every weight GEMM (2-D weight), the rest in float;
  ``int4w mse``: the same with the mse search per block;
* ``nvfp4``: NVFP4 (FP4 E2M1 in blocks of 16, FP8 block scales, FP32 global scale; activations scaled per block
  at run time) on every weight GEMM, the rest in float; ``nvfp4 + fp8``: the same with the other layers in FP8
  (Model Optimizer's NVFP4 recipe quantizes Linear layers only); the export is validated on onnx's reference
  evaluator (onnxruntime has no CPU kernel for FP4);
* ``float``: the model as it is (the byte count of reference);
* on the outlier block also ``int8 + fp8 fc2``: the issue's mix (INT8, FP8 on the layer reading the outliers).

SQNR is measured on a held-out batch (not the calibration batches). Layers are quantized module by module
(``replace_to_quantization_module``), as the session does before its functional rewrite. A step that
cannot run shows "n/a (reason)". Times are wall-clock of one run on this machine (say its load).

    python bench/precisions.py [--batches 4] [--block-size 128] [--only outlier]
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "transformers"))
import models as zoo  # noqa: E402

from workbench.export import export_qdq_onnx  # noqa: E402
from workbench.project.settings import make_descriptor  # noqa: E402
from workbench.quant import replace_to_quantization_module  # noqa: E402
from workbench.quant.algorithms.batches import sqnr_db  # noqa: E402
from workbench.quant.algorithms.calibrate import calibrate  # noqa: E402
from workbench.quant.algorithms.precision import Precision, descriptors_for, weight_bytes  # noqa: E402
from workbench.sources.outliers import calibration_batches, outlier_block  # noqa: E402

Mix = Callable[[str, nn.Module], Precision]


def _is_gemm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def mixes(model_name: str) -> dict[str, tuple[Mix, str]]:
    """Row label -> (precision per layer, block method)."""
    rows: dict[str, tuple[Mix, str]] = {
        "int8": (lambda name, module: Precision.INT8, "max"),
        "fp8": (lambda name, module: Precision.FP8, "max"),
        "int4w": (lambda name, module: Precision.INT4W if _is_gemm(module) else Precision.FLOAT, "max"),
        "int4w mse": (lambda name, module: Precision.INT4W if _is_gemm(module) else Precision.FLOAT, "mse"),
        "nvfp4": (lambda name, module: Precision.NVFP4 if _is_gemm(module) else Precision.FLOAT, "max"),
        "nvfp4 + fp8": (lambda name, module: Precision.NVFP4 if _is_gemm(module) else Precision.FP8, "max"),
    }
    if model_name == "outlier block":
        rows["int8 + fp8 fc2"] = (lambda name, module: Precision.FP8 if name == "fc2" else Precision.INT8, "max")
    return rows


def quantize(model: nn.Module, mix: Mix, block_size: int) -> tuple[nn.Module, dict[str, Precision]]:
    chosen: dict[str, Precision] = {}

    def choose(name: str, module: nn.Module):
        precision = mix(name, module)
        chosen[name] = precision
        if precision is Precision.FLOAT:
            return make_descriptor({"num_bits": 8, "enabled": False}), make_descriptor({"num_bits": 8,
                                                                                        "enabled": False})
        weight = getattr(module, "weight", None)
        # a project's defaults: histogram inputs for INT8 (entropy), max for FP8 (descriptors_for drops it)
        inputs, weights = descriptors_for(precision, type(module).__name__, block_size=block_size,
                                          weight_ndim=weight.dim() if isinstance(weight, torch.Tensor) else None,
                                          base_input={"calib_method": "histogram"})
        return make_descriptor(inputs), make_descriptor(weights)

    replace_to_quantization_module(model, descriptor_for=choose)
    return model, chosen


def measure(name: str, build: Callable[[], nn.Module], batches: list[tuple], held_out: tuple, block_size: int,
            rows: list[list[str]]) -> None:
    reference_model = build().eval()
    with torch.no_grad():
        reference = reference_model(*held_out)
    float_bytes = weight_bytes(reference_model, {})
    rows.append([name, "float", "inf", f"{float_bytes / 1024:.1f}", "1.00", "-", "-"])
    for label, (mix, block_method) in mixes(name).items():
        row = [name, label]
        try:
            model, chosen = quantize(copy.deepcopy(reference_model), mix, block_size)
            started = time.perf_counter()
            calibrate(model, batches, num_batches=len(batches), method="entropy", report_sqnr=False,
                      block_method=block_method)
            calib_s = time.perf_counter() - started
            with torch.no_grad():
                sqnr = sqnr_db(reference, model(*held_out))
            size = weight_bytes(model, chosen, block_size=block_size)
            with tempfile.TemporaryDirectory() as folder:
                started = time.perf_counter()
                # 4-bit activations turn the last-bit differences between numpy's float kernels (the reference
                # evaluator) and torch's into FP4 steps that grow layer by layer: a looser bar, the cosine shown
                loose = {"min_cosine": 0.99} if label.startswith("nvfp4") else {}
                report = export_qdq_onnx(model, held_out, Path(folder) / "m.onnx", **loose)
                export_s = time.perf_counter() - started
            row += [f"{sqnr:.1f}", f"{size / 1024:.1f}", f"{size / float_bytes:.2f}", f"{calib_s:.2f}",
                    f"{export_s:.1f} (opset {report.opset}, cos {report.cosine:.5f})"]
        except Exception as error:  # noqa: BLE001 - a row says why it could not run, the others go on
            row += [f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:80]})"] + ["-"] * (7 - len(row) - 1)
        rows.append(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--only", help="models whose name contains this")
    args = parser.parse_args()
    torch.manual_seed(0)

    def images(size: int, batch: int = 8):
        return [(zoo.images(batch, size, seed=i),) for i in range(args.batches + 1)]

    def ids(vocab: int, batch: int = 8, length: int = 32):
        return [(zoo.tokens(batch, length, vocab, seed=i),) for i in range(args.batches + 1)]

    outlier_data = [(t,) for t in calibration_batches(args.batches + 1)]
    models = [
        ("outlier block", outlier_block, outlier_data),
        ("vit-like @ (192d, 4 blocks)", lambda: zoo.ViTLike(192, 4, 3, False, image=64, patch=8), images(64)),
        ("resnet-style (timm/tv blocks)", lambda: zoo.ResNetStyle(16), images(32)),
    ]
    try:
        import transformers  # noqa: F401

        models.append(("HF BertModel (eager)", lambda: zoo.hf_bert("eager"), ids(64)))
    except ImportError:
        print("HF BertModel: n/a (transformers is not installed)")
    rows: list[list[str]] = []
    for name, build, data in models:
        if args.only and args.only not in name:
            continue
        measure(name, build, data[:-1], data[-1], args.block_size, rows)
    header = ["model", "precision", "SQNR dB", "weight KiB", "x float", "calib s", "export s"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"block size {args.block_size}, {args.batches} calibration batches, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
