"""Issue 34, point 2 and 4: the whole model is exported (every output, named after its field; an output named as
an input renamed; no Q/DQ on a constant), torch's own output stays out of the console, and a file onnxruntime
cannot open with its default optimizations is never written."""
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from workbench import quant
from workbench.export import ExportError, export_qdq_onnx
from workbench.export.qdq import ZERO_AMAX_SCALE
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import TensorQuantizer
from workbench.quant.tensor_quant import QuantDescriptor


def calibrated(model, batches):
    model.eval()
    quant.replace_to_quantization_module(model)
    calibrate(model, batches, num_batches=len(batches), method="max", report_sqnr=False)
    return model


class Nested(nn.Module):
    """Returns a dict holding a tensor, a nested tuple (with a None) and an integer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x)
        return {"logits": h, "extra": (self.b(x), (h * 2, None)), "count": 3}


def default_session(path):
    """onnxruntime as a user's script opens the file: default (all) graph optimizations."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_every_tensor_of_a_nested_output_is_an_onnx_output_named_after_its_place(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(2, 8) for _ in range(2)]
    model = calibrated(Nested(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "nested.onnx")
    assert report.output_names == ["logits", "extra.0", "extra.1.0"]
    graph = onnx.load(str(tmp_path / "nested.onnx")).graph
    assert [o.name for o in graph.output] == ["logits", "extra.0", "extra.1.0"]
    assert any("count (int)" in note for note in report.notes)  # what is not a tensor is said, not dropped silently
    outputs = default_session(tmp_path / "nested.onnx").run(None, {"input": batches[0].numpy()})
    expected = model(batches[0])
    np.testing.assert_allclose(outputs[1], expected["extra"][0].detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(outputs[2], expected["extra"][1][0].detach().numpy(), atol=1e-5)


def test_outputs_picked_by_name_and_an_unknown_name_refused_without_a_file(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(2, 8) for _ in range(2)]
    model = calibrated(Nested(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "picked.onnx", outputs=["extra"])
    assert report.output_names == ["extra.0", "extra.1.0"]
    assert any("left out as asked" in note and "logits" in note for note in report.notes)
    with pytest.raises(ExportError, match=r"no output named 'boxes'; its outputs are: logits, extra.0, extra.1.0"):
        export_qdq_onnx(model, batches[0], tmp_path / "bad.onnx", outputs=["boxes"])
    assert not (tmp_path / "bad.onnx").exists()


class SameName(nn.Module):
    """diffusers' UNet in small: takes ``sample`` and returns ``sample``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, sample):
        return {"sample": self.fc(sample)}


def test_an_output_named_as_an_input_is_renamed_and_the_report_says_so(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(2, 8) for _ in range(2)]
    model = calibrated(SameName(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "unet.onnx")
    assert report.input_names == ["sample"] and report.output_names == ["sample_out"]
    assert any("'sample' renamed 'sample_out'" in note for note in report.notes)
    session = default_session(tmp_path / "unet.onnx")
    assert [o.name for o in session.get_outputs()] == ["sample_out"]


class ZeroQueries(nn.Module):
    """DETR's decoder in small: its first input is zeros made at run time from the input's shape."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        zeros = torch.zeros(x.shape[0], 5, 8)  # ConstantOfShape in the graph
        return self.head(self.query(zeros) + x.mean(1, keepdim=True))


def test_a_constant_gets_no_q_dq_and_the_report_names_its_quantizer(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(2, 3, 8) for _ in range(2)]
    model = calibrated(ZeroQueries(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "zeros.onnx", exporter="dynamo")
    proto = onnx.load(str(tmp_path / "zeros.onnx"))
    producers = {out: node for node in proto.graph.node for out in node.output}
    for node in proto.graph.node:
        if node.op_type == "QuantizeLinear":
            source = producers.get(node.input[0])
            assert source is None or source.op_type != "ConstantOfShape", node.name
    scales = [numpy_helper.to_array(init) for init in proto.graph.initializer if init.name.endswith(".scale")]
    assert not any(np.any(s == np.float32(ZERO_AMAX_SCALE)) for s in scales)  # no 1.27e30 scale in the file
    assert "query._input_quantizer" in report.quantizers_without_qdq
    assert any(note.startswith("query._input_quantizer: no Q/DQ on its input, the constant") for note in report.notes)
    assert not any("quantizers_without_qdq" == report.entry_kinds.get(w) for w in report.warnings)
    assert report.quantize_nodes == sum(1 for n in proto.graph.node if n.op_type == "QuantizeLinear")
    assert report.cosine > 0.999


class TransposedKey(nn.Module):
    """An attention score in small: the key is quantized, then transposed into the MatMul (as Hugging Face's
    attention functions do after the workbench quantizes their key)."""

    def __init__(self):
        super().__init__()
        self.k = nn.Linear(8, 8)
        self.key_quantizer = TensorQuantizer(QuantDescriptor(num_bits=8, calib_method="max"))

    def forward(self, x):
        key = self.key_quantizer(self.k(x))
        return torch.matmul(x, key.transpose(-1, -2))


def test_an_opset_21_file_opens_in_onnxruntime_with_its_default_optimizations(tmp_path):
    torch.manual_seed(0)
    batches = [torch.randn(2, 5, 8) for _ in range(2)]
    model = calibrated(TransposedKey(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "key.onnx", opset=21, exporter="dynamo")
    assert report.opset == 21
    # onnxruntime 1.32 copied the key's Q/DQ past the Transpose as a QuantizeLinear with output_dtype INT8, then
    # gave it a uint8 zero point: "output_dtype INT8 does not match y_zero_point type UINT8"
    outputs = default_session(tmp_path / "key.onnx").run(None, {"input": batches[0].numpy()})
    assert outputs[0].shape == (2, 5, 5)
    assert report.entry_kinds.get(next(n for n in report.notes if "repeated after the Transpose" in n)) == "pinned_qdq"
    assert report.cosine > 0.999999  # the repeated pair gives the same values


def test_a_file_onnxruntime_cannot_open_with_default_optimizations_is_an_error(tmp_path, monkeypatch):
    from workbench.export import onnx_export
    from workbench.export.errors import ExportValidationError

    real = ort.InferenceSession

    def refuses_when_optimizing(path, sess_options=None, **kwargs):
        if sess_options is None:  # the optimized check opens the file as a user's script does
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Node (t_q) Op (QuantizeLinear) [TypeInferenceError] "
                               "output_dtype INT8 does not match y_zero_point type UINT8")
        return real(path, sess_options, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", refuses_when_optimizing)
    torch.manual_seed(0)
    batches = [torch.randn(2, 8) for _ in range(2)]
    model = calibrated(SameName(), batches)
    with pytest.raises(ExportValidationError, match="default graph optimizations .ORT_ENABLE_ALL. cannot run the file"):
        onnx_export.export_qdq_onnx(model, batches[0], tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


class DataDependent(nn.Module):
    """torch.export cannot capture it (a Python branch on a tensor's value): the TorchScript fallback writes it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if bool((x.sum() > -1e9).item()):
            return self.fc(x)
        return x


def test_torch_s_graph_dump_stays_out_of_the_console_and_the_report_says_why_the_fallback(tmp_path, capsys, caplog):
    torch.manual_seed(0)
    batches = [torch.randn(2, 8) for _ in range(2)]
    model = calibrated(DataDependent(), batches)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        report = export_qdq_onnx(model, batches[0], tmp_path / "dd.onnx")
    out, err = capsys.readouterr()
    assert report.exporter == "torchscript" and "torch.export could not capture the model" in report.exporter_note
    assert "def forward(" not in out + err and "torch.ops.aten" not in out + err
    assert len((out + err).splitlines()) < 5
    assert report.exporter_log  # kept for --debug and the JSON


class Scan(nn.Module):
    """Mamba's torch path in small: a Python loop over the sequence, which a trace unrolls at the sample's length."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 8)

    def forward(self, input_ids):
        x = self.fc(self.embed(input_ids))
        state = torch.zeros_like(x[:, 0])
        steps = []
        for t in range(x.shape[1]):
            state = 0.5 * state + x[:, t]
            steps.append(state)
        return torch.stack(steps, 1)


class Recurrence(Scan):
    """RWKV's way in small: a loop over the sequence whose state is added to every position; unrolled at the
    sample's length, the graph still runs at a longer sequence, and computes it wrongly (the state of 6 steps)."""

    def forward(self, input_ids):
        x = self.fc(self.embed(input_ids))
        state = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            state = 0.5 * state + x[:, t]
        return x + state.unsqueeze(1)


def test_a_loop_that_runs_at_a_longer_sequence_but_computes_it_wrongly_is_exported_at_the_sample_s_length(tmp_path):
    """RWKV was written "not validated" (cosine 0.945 at sequence length 9): the sample agrees, the longer sequence
    runs and parts. That is the unrolled loop too: the file is exported at the sample's length, validated."""
    torch.manual_seed(0)
    batches = [torch.randint(0, 20, (2, 6)) for _ in range(2)]
    model = calibrated(Recurrence(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "recurrence.onnx", exporter="dynamo")
    dims = onnx.load(str(tmp_path / "recurrence.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert report.validated and dims[1].dim_value == 6 and report.sequence_check is None
    assert any("sequence length fixed at the sample's (6)" in w and "computes it wrongly" in w for w in report.warnings)


def test_a_loop_over_the_sequence_is_exported_at_the_sample_s_length_and_the_report_says_why(tmp_path):
    """A graph declaring the sequence dynamic that does not run at another length (the scan unrolled when traced:
    HF Mamba) is exported again at the sample's length, with a warning saying so, instead of refused."""
    torch.manual_seed(0)
    batches = [torch.randint(0, 20, (2, 6)) for _ in range(2)]
    model = calibrated(Scan(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "scan.onnx", exporter="dynamo")
    dims = onnx.load(str(tmp_path / "scan.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert dims[1].dim_value == 6 and report.sequence_check is None and report.validated
    fixed = [w for w in report.warnings if "sequence length fixed at the sample's (6)" in w]
    assert fixed and "does not run at sequence length 7" in fixed[0] and "runs at this length only" in fixed[0]
    session = ort.InferenceSession(str(tmp_path / "scan.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {session.get_inputs()[0].name: batches[1].numpy()})[0].shape == (2, 6, 8)
    asked = export_qdq_onnx(model, batches[0], tmp_path / "asked.onnx", exporter="dynamo", static_sequence=True)
    assert any("sequence length fixed at the sample's (6), as asked" in note for note in asked.notes)
    assert not any("sequence length fixed" in w for w in asked.warnings)
