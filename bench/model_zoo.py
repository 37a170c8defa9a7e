"""One row per architecture: prepare, calibrate, export, and what came out of each step.

Columns: quantizers created / reached by calibration, layers or operations left in floating point
(reasons in the notes below the table), Q/DQ pairs in the exported graph, weight GEMMs (Conv/Gemm/MatMul with a
constant weight) whose weight has Q/DQ over all of them, attention products whose two
MatMul inputs both come from DequantizeLinear, onnxruntime vs fake-quant PyTorch (cosine, max |diff|),
calibrate and export wall time, and the calibration pass (collection) over an FP32 forward on the same
batches, measured in the same run (goal: at most 1.3x on the ViT-like model, attention included).

Architectures are built in code with random weights (tests/transformers/models.py): a ViT-like with
``@`` attention, one with ``F.scaled_dot_product_attention``, ``nn.TransformerEncoder`` over token ids,
a ResNet-style CNN with timm/torchvision BasicBlocks, tiny Hugging Face BERT / ViT / Llama / GPT-2 (Conv1D
projections) / T5 (encoder-decoder, two token lengths) when
``transformers`` imports, timm models when ``timm`` imports. A step that cannot run shows
"n/a (reason)", never a made-up value.

    python bench/model_zoo.py [--batches 4] [--repeats 3] [--only vit-like] [--input-calibrator histogram]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "transformers"))
import models as zoo  # noqa: E402

from workbench.export import export_qdq_onnx  # noqa: E402
from workbench.graph import prepare_for_tensorrt  # noqa: E402
from workbench.quant.algorithms.calibrate import calibrate  # noqa: E402
from workbench.quant.algorithms.snapshot import all_quantizers  # noqa: E402
from workbench.quant.tensor_quant import CALIB_METHODS, QuantDescriptor  # noqa: E402


class Row:
    """One architecture's cells by column, and the notes printed under the table."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cells: dict[str, str] = {}
        self.notes: list[str] = []


COLUMNS = ["quantizers", "reached", "float ops", "Q/DQ pairs", "GEMMs q/all", "attn products", "ort cos",
           "ort max|d|", "calib s", "export s", "calib/fp32"]


def _first(output):
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "to_tuple"):
        return output.to_tuple()[0]
    return output[0]


def attention_products_quantized(path: str) -> int:
    """MatMuls between two activations whose both inputs come from DequantizeLinear."""
    graph = onnx.load(path).graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {i.name for i in graph.initializer}

    def constant(name: str) -> bool:
        if name in initializers:
            return True
        node = producer.get(name)
        return node is not None and (node.op_type == "Constant" or all(constant(i) for i in node.input if i))

    count = 0
    for node in graph.node:
        if node.op_type != "MatMul" or any(constant(i) for i in node.input):
            continue
        if all(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in node.input):
            count += 1
    return count


def median(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(name: str, build: Callable[[], nn.Module], make_batch: Callable[[int], tuple], num_batches: int,
            repeats: int, quant_desc_input: QuantDescriptor | None = None) -> Row:
    row = Row(name)
    torch.manual_seed(0)
    try:
        model = build().eval()
    except Exception as error:  # an optional ecosystem that is not usable here
        row.cells = {c: f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:60]})" if c == COLUMNS[0]
                     else "" for c in COLUMNS}
        return row
    batches = [make_batch(i) for i in range(num_batches)]

    def fp32_pass() -> None:
        with torch.no_grad():
            for batch in batches:  # positional inputs, or keyword inputs by name (an encoder-decoder's three)
                model(**batch) if isinstance(batch, dict) else model(*batch)

    fp32_pass()
    # prepare swaps submodules in place: the FP32 reference keeps a model of its own
    quantized, report = prepare_for_tensorrt(copy.deepcopy(model), example_inputs=batches[0],
                                             quant_desc_input=quant_desc_input)
    for quantizer in all_quantizers(quantized):
        quantizer.rounding = "onnx"  # what the session does: PyTorch computes what the QDQ graph computes
    functional = report.functional
    if functional is not None:
        row.notes += [f"{s.owner or '<model>'}: {s.operation[:50]} -> {s.reason[:90]}" for s in functional.skipped[:4]]
        row.notes += [f"not traced {f.name or '<model>'}: {f.reason[:100]}" for f in functional.failures[:3]]
        row.notes += [f"attention {s.owner}: {s.reason}" for s in functional.unquantized_attention[:2]]
    quantizers = len(all_quantizers(quantized))
    row.cells["quantizers"] = str(quantizers)
    float_ops = (len(functional.skipped) + len(functional.unquantized_attention)) if functional is not None else 0
    row.cells["float ops"] = str(float_ops)
    start = time.perf_counter()
    result = calibrate(quantized, batches, num_batches=None, method="max", report_sqnr=False)
    row.cells["calib s"] = f"{time.perf_counter() - start:.2f}"
    row.cells["reached"] = f"{len(result.quantizers) - len(result.unused)}/{len(result.quantizers)}"
    ratios = []
    for _ in range(repeats):  # interleaved, so that machine noise hits both alike
        fp32 = median(fp32_pass, 1)
        collect = calibrate(quantized, batches, num_batches=None, method="max", report_sqnr=False).collect_time_s
        ratios.append(collect / fp32)
    row.cells["calib/fp32"] = f"{statistics.median(ratios):.2f}x"
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "model.onnx")
        try:
            start = time.perf_counter()
            export = export_qdq_onnx(quantized, batches[0], path)
            row.cells["export s"] = f"{time.perf_counter() - start:.2f}"
            row.cells["Q/DQ pairs"] = str(export.qdq_pairs)
            row.cells["GEMMs q/all"] = f"{export.weight_gemms - len(export.float_weight_gemms)}/{export.weight_gemms}"
            if export.float_weight_gemms:
                row.notes.append(f"float weight GEMMs: {', '.join(export.float_weight_gemms[:4])}")
            if export.opset != export.requested_opset:
                row.notes.append(f"opset {export.opset} (requested {export.requested_opset}): {export.exporter_note}")
            row.cells["attn products"] = str(attention_products_quantized(path))
            row.cells["ort cos"] = f"{export.cosine:.6f}"
            row.cells["ort max|d|"] = f"{export.max_abs_diff:.2g}"
            if export.exporter != "dynamo":
                row.notes.append(f"exported with {export.exporter}: {export.exporter_note[:100]}")
        except Exception as error:
            reason = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:70]})"
            for column in ("export s", "Q/DQ pairs", "GEMMs q/all", "attn products", "ort cos", "ort max|d|"):
                row.cells[column] = reason if column == "export s" else "n/a"
    return row


def _timm(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10)
    return build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", metavar="TEXT", help="only the rows whose name contains TEXT (e.g. vit-like)")
    parser.add_argument("--input-calibrator", choices=CALIB_METHODS, default="max",
                        help="calibrator of the activation quantizers: max (prepare_for_tensorrt's default, the "
                             "default here) or histogram (a project's default input descriptor)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def images(size: int, batch: int = 8):
        return lambda i: (zoo.images(batch, size, seed=i),)

    def ids(vocab: int, batch: int = 8, length: int = 32):
        return lambda i: (zoo.tokens(batch, length, vocab, seed=i),)

    def seq2seq(vocab: int, batch: int = 8, source: int = 32, target: int = 12):
        # by keyword (a tuple batch reads as (inputs, labels)); the decoder's length differs from the encoder's
        return lambda i: {"input_ids": zoo.tokens(batch, source, vocab, seed=i),
                          "attention_mask": torch.ones(batch, source, dtype=torch.long),
                          "decoder_input_ids": zoo.tokens(batch, target, vocab, seed=100 + i)}

    rows_spec = [
        ("vit-like @ (192d, 4 blocks, 64 tok)", lambda: zoo.ViTLike(192, 4, 3, False, image=64, patch=8), images(64)),
        ("vit-like sdpa (same size)", lambda: zoo.ViTLike(192, 4, 3, True, image=64, patch=8), images(64)),
        ("nn.TransformerEncoder on tokens", lambda: zoo.TokenEncoder(vocab=50, dim=64), ids(50)),
        ("resnet-style (timm/tv blocks)", lambda: zoo.ResNetStyle(16), images(32)),
        ("HF BertModel (eager)", lambda: zoo.hf_bert("eager"), ids(64)),
        ("HF ViTModel (sdpa)", lambda: zoo.hf_vit("sdpa"), images(16)),
        ("HF LlamaForCausalLM (sdpa)", lambda: zoo.hf_llama("sdpa"), ids(64)),
        ("HF GPT2LMHeadModel (Conv1D)", lambda: zoo.hf_gpt2("eager"), ids(64)),
        ("HF T5 encoder-decoder", lambda: zoo.hf_t5("eager"), seq2seq(64)),
        ("timm vit_tiny_patch16_224", _timm("vit_tiny_patch16_224"), images(224, 2)),
        ("timm resnet18", _timm("resnet18"), images(64, 2)),
    ]
    if args.only:
        rows_spec = [spec for spec in rows_spec if args.only.lower() in spec[0].lower()]
        if not rows_spec:
            parser.error(f"--only {args.only!r} matches no row.")
    desc = QuantDescriptor(calib_method=args.input_calibrator) if args.input_calibrator != "max" else None
    rows = [measure(name, build, batch, args.batches, args.repeats, desc) for name, build, batch in rows_spec]
    widths = [max(len(r.name) for r in rows)] + [max(len(c), *(len(r.cells.get(c, "")) for r in rows))
                                                 for c in COLUMNS]
    print(" | ".join(["model".ljust(widths[0])] + [c.ljust(w) for c, w in zip(COLUMNS, widths[1:])]))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join([row.name.ljust(widths[0])] + [row.cells.get(c, "").ljust(w)
                                                       for c, w in zip(COLUMNS, widths[1:])]))
    print()
    for row in rows:
        for note in row.notes:
            print(f"{row.name}: {note}")


if __name__ == "__main__":
    main()
