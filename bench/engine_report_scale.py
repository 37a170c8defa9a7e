"""How reading an engine report grows with the engine: 2,500 to 20,000 modules (two engine layers each).

Issue 38 case 9: reports grew worse than quadratically (2,500 layers 20 s, 5,000 layers 122 s). Prints the
time of reading + analysing + rendering each size and its ratio to the previous size (2.0 is linear).

    python bench/engine_report_scale.py [--sizes 2500,5000,10000,20000]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from workbench.engine.report import import_engine_report

INT8 = "Thirty-two wide channel vectorized row major Int8 format."
FP32 = "Row major linear FP32"


def _tensor(name: str, fmt: str) -> dict:
    return {"Name": name, "Location": "Device", "Dimensions": [1, 4], "Format/Datatype": fmt}


def write_engine(folder: Path, modules: int) -> tuple[Path, Path]:
    """layers.json and profile.json of a chain of ``modules`` Linear layers, each with a standalone Quantize."""
    layers = []
    for i in range(modules):
        layers.append({"Name": f"layers.{i}._input_quantizer/QuantizeLinear", "LayerType": "Scale",
                       "ParameterType": "Scale", "Inputs": [_tensor(f"x{i}", FP32)],
                       "Outputs": [_tensor(f"q{i}", INT8)]})
        layers.append({"Name": f"layers.{i}._weight_quantizer/QuantizeLinear + layers.{i}/Gemm",
                       "LayerType": "CaskGemmMatrixMultiply", "ParameterType": "MatrixMultiply",
                       "Inputs": [_tensor(f"q{i}", INT8)],
                       "Outputs": [_tensor(f"x{i + 1}", FP32 if i % 7 == 0 else INT8)]})
    info, profile = folder / f"layers{modules}.json", folder / f"profile{modules}.json"
    info.write_text(json.dumps({"Layers": layers, "Bindings": ["x0", f"x{modules}"]}))
    records = [{"count": 10}] + [{"name": layer["Name"], "timeMs": 1.0, "averageMs": 0.1, "medianMs": 0.1,
                                  "percentage": 100.0 / len(layers)} for layer in layers]
    profile.write_text(json.dumps(records))
    return info, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2500,5000,10000,20000")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    previous = None
    print(f"{'modules':>8} {'engine layers':>14} {'seconds':>8} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as folder:
        for modules in sizes:
            info, profile = write_engine(Path(folder), modules)
            project_layers = {f"layers.{i}": True for i in range(modules)}
            start = time.perf_counter()
            report = import_engine_report(str(info), str(profile), project_layers)
            report.text()
            json.dumps(report.to_dict())
            seconds = time.perf_counter() - start
            ratio = f"{seconds / previous:.2f}" if previous else "-"
            print(f"{modules:>8} {2 * modules:>14} {seconds:>8.2f} {ratio:>6}")
            previous = seconds


if __name__ == "__main__":
    main()
