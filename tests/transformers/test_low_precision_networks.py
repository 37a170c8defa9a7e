"""bf16 and fp16 decoders end to end: an ``hf:`` folder saved in bf16/fp16 stays in that dtype (no float32 copy),
calibrates, and exports a file whose float layers keep the dtype, with Q/DQ around float32 scales."""
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.cli_run import run

HERE = Path(__file__).resolve().parent
_TYPES = {"bfloat16": onnx.TensorProto.BFLOAT16, "float16": onnx.TensorProto.FLOAT16}


def _llama_folder(tmp_path: Path, dtype: str) -> Path:
    sys.path.insert(0, str(HERE))
    import models

    torch.manual_seed(0)
    folder = tmp_path / f"llama-{dtype}"
    models.hf_llama().to(getattr(torch, dtype)).save_pretrained(folder, safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))
    return folder


@pytest.mark.parametrize("dtype,precision", [("bfloat16", "int8"), ("bfloat16", "int4w"), ("bfloat16", "fp8"),
                                             ("float16", "int8"), ("float16", "int4w")])
def test_half_precision_llama_new_calibrate_export(tmp_path, capsys, dtype, precision):
    folder = _llama_folder(tmp_path, dtype)
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits")
    assert code == 0, err
    from workbench.session import Session

    model = Session.open(project).quantized_model()
    weights = {p.dtype for p in model.parameters()}
    assert weights == {getattr(torch, dtype)}  # loaded as saved: no silent float32 upcast
    # int4w: the MLP's down projection, whose 64 input features TensorRT's INT4 blocks divide (the others have 32)
    chosen = ["--pattern", r".*mlp\.down_proj"] if precision == "int4w" else ["--type", "Linear"]
    code, _, err = run(capsys, "set", project, *chosen, "--precision", precision)
    assert code == 0, err
    code, out, err = run(capsys, "calibrate", project, "--method", "max")
    assert code == 0, err
    output = tmp_path / "llama.onnx"
    code, out, err = run(capsys, "export", project, "-o", output)
    assert code == 0, err
    assert f"{dtype} network" in out
    # measured against the model's dtype, and named after the project's mix ("INT8+INT4 W", "INT8+FP8")
    headline = next(line for line in out.splitlines() if f" vs {'BF16' if dtype == 'bfloat16' else 'FP16'} on" in line)
    assert {"int8": "INT8", "int4w": "INT4 W", "fp8": "FP8"}[precision] in headline.split(" vs ")[0]
    proto = onnx.load(output)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.graph.output[0].type.tensor_type.elem_type == _TYPES[dtype]
    initializers = {i.name: i for i in proto.graph.initializer}
    norms = [i for name, i in initializers.items() if "norm" in name]
    assert norms and all(i.data_type == _TYPES[dtype] for i in norms)  # float layers keep the network's dtype
    quantize = [n for n in proto.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    scales = [initializers[n.input[1]] for n in quantize if n.input[1] in initializers]
    assert scales and all(s.data_type == onnx.TensorProto.FLOAT for s in scales)  # float32 scales, Casts around
    if precision == "int4w":
        assert any(i.data_type == onnx.TensorProto.INT4 for i in initializers.values())  # packed INT4 weights


def test_bf16_factory_model_reads_float32_data_without_upcast(tmp_path, capsys):
    """A bf16 model fed float32 .npy data: the inputs are cast on the way in, the weights stay bf16."""
    (tmp_path / "net.py").write_text(
        "import torch\nfrom torch import nn\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(torch.bfloat16)\n")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
    project = tmp_path / "m.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "x.npy",
                       "--batch-size", "4", "--trust-code")
    assert code == 0, err
    code, _, err = run(capsys, "calibrate", project, "--trust-code", "--method", "max")
    assert code == 0, err
    from workbench.session import Session

    model = Session.open(project, trust_code=True).quantized_model()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    code, out, err = run(capsys, "export", project, "--trust-code", "-o", tmp_path / "m.onnx")
    assert code == 0, err
    assert "bfloat16 network" in out and "opset 19" in out
    proto = onnx.load(tmp_path / "m.onnx")
    assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
