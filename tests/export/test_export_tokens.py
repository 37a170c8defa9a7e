"""QDQ export of models that are not one float image in, one tensor out: token ids by keyword, outputs
holding a cache, configs with use_cache, both exporters failing, and graphs written with external data."""
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from tests.ort_run import value_session
from workbench import quant
from workbench.export import ExportError, export_qdq_onnx
from workbench.quant.algorithms.calibrate import calibrate


class Cache:
    """Stands for transformers' DynamicCache: returned with the output, not a tensor."""


class TokenModel(nn.Module):
    """Embedding -> quantized Linear layers; returns a dict with a cache, as a Hugging Face model does."""

    def __init__(self, config=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = config
        self.embed = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 5)

    def forward(self, input_ids, attention_mask=None):
        hidden = torch.relu(self.fc(self.embed(input_ids)))
        if attention_mask is not None:
            hidden = hidden * attention_mask.unsqueeze(-1).to(hidden.dtype)
        use_cache = self.config is not None and self.config.use_cache
        return {"logits": self.head(hidden), "past_key_values": Cache() if use_cache else None, "hidden": hidden}


def token_batches(count=2, batch=3, length=7):
    generator = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 50, (batch, length), generator=generator),
             "attention_mask": torch.ones(batch, length, dtype=torch.long)} for _ in range(count)]


def calibrated_tokens(config=None):
    model = TokenModel(config).eval()
    quant.replace_to_quantization_module(model)
    batches = token_batches()
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    return model, batches[0]


def dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_keyword_token_inputs_are_named_after_the_forward_with_batch_and_sequence_axes(tmp_path, exporter):
    model, sample = calibrated_tokens()
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx", exporter=exporter)
    assert report.input_names == ["input_ids", "attention_mask"] and report.output_names == ["logits", "hidden"]
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert [(i.name, dims(i)) for i in graph.input] == [("input_ids", ["batch", "sequence"]),
                                                       ("attention_mask", ["batch", "sequence"])]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [o.name for o in graph.output] == ["logits", "hidden"] and dims(graph.output[0])[0] == "batch"
    assert report.quantize_nodes >= 4 and report.cosine > 0.999
    assert report.sequence_check is not None and report.sequence_check.shape == (3, 8, 5)  # one token longer
    # another batch size and sequence length run and match the fake-quant model
    longer = token_batches(1, batch=2, length=11)[0]
    session = value_session(str(tmp_path / "m.onnx"))
    logits = session.run(None, {k: v.numpy() for k, v in longer.items()})[0]
    for q in (m for m in model.modules() if isinstance(m, quant.TensorQuantizer)):
        q.rounding = "onnx"
    with torch.no_grad():
        expected = model(**longer)["logits"].numpy()
    assert logits.shape == (2, 11, 5) and np.abs(logits - expected).max() < 1e-4


def test_the_output_to_export_can_be_named(tmp_path):
    model, sample = calibrated_tokens()
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx", output="hidden")
    assert report.output_names == ["hidden"] and report.outputs[0].shape == (3, 7, 16)
    with pytest.raises(ExportError, match="no tensor under 'scores'; it has: logits, past_key_values, hidden"):
        export_qdq_onnx(model, sample, tmp_path / "bad.onnx", output="scores")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_config_with_use_cache_exports_without_the_cache_and_says_so(tmp_path):
    config = SimpleNamespace(use_cache=True)
    model, sample = calibrated_tokens(config)
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx")
    assert any("use_cache=False" in n for n in report.notes)  # what the exporter did: a note, not a warning
    assert not any("use_cache=False" in w for w in report.warnings)
    assert report.output_names == ["logits", "hidden"] and config.use_cache is True  # the setting comes back


class DataDependentFFT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:  # torch.export cannot capture a branch on a value
            x = x * 2
        return torch.fft.rfft(self.fc(x)).abs()  # the TorchScript exporter has no ONNX for rfft


def test_when_both_exporters_fail_both_errors_are_shown_primary_first(tmp_path):
    model = DataDependentFFT().eval()
    quant.replace_to_quantization_module(model)
    x = torch.randn(2, 8)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    with pytest.raises(ExportError) as info:
        export_qdq_onnx(model, x, tmp_path / "m.onnx")
    message = str(info.value)
    primary, fallback = message.index("torch.export-based exporter:"), message.index("TorchScript fallback:")
    assert primary < fallback
    assert "data-dependent" in message[primary:fallback] and "in forward" in message[primary:fallback]
    assert "fft_rfft" in message[fallback:]
    assert list(tmp_path.iterdir()) == []


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:  # torch.export cannot capture a branch on a value; TorchScript records one path
            x = x * 2
        return self.fc(x)


@pytest.fixture
def over_torchscript_limit(monkeypatch):
    """The TorchScript exporter's protobuf limit (2 GB) lowered below the model's weights (about 300 bytes)."""
    from workbench.export import exporters

    monkeypatch.setattr(exporters, "TORCHSCRIPT_LIMIT", 100)
    model = DataDependent().eval()
    quant.replace_to_quantization_module(model)
    x = torch.randn(2, 8)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    traced = []
    original = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: traced.append(k.get("dynamo")) or original(*a, **k))
    return model, x, traced


def test_a_model_over_2gb_gets_no_torchscript_fallback_and_the_error_says_why(tmp_path, over_torchscript_limit):
    model, x, traced = over_torchscript_limit
    with pytest.raises(ExportError) as info:
        export_qdq_onnx(model, x, tmp_path / "m.onnx")
    message = str(info.value)
    primary, fallback = message.index("torch.export-based exporter failed:"), message.index("fallback cannot")
    assert primary < fallback
    assert "data-dependent" in message[primary:fallback]  # why torch.export failed
    assert "cannot write a graph over" in message[fallback:] and "weights are" in message[fallback:]
    assert "Traceback" not in message and "protobuf" in message
    assert False not in traced  # the TorchScript exporter was never run
    assert list(tmp_path.iterdir()) == []
    # asked for by name, it is refused the same way, pointing to the exporter that can do it
    with pytest.raises(ExportError, match=r"cannot write a graph over .* \('auto' or 'dynamo'\)"):
        export_qdq_onnx(model, x, tmp_path / "m.onnx", exporter="torchscript")
    assert False not in traced and list(tmp_path.iterdir()) == []


def test_torch_reaching_the_protobuf_limit_in_the_fallback_is_reported_as_that(tmp_path, monkeypatch):
    model = DataDependent().eval()
    quant.replace_to_quantization_module(model)
    x = torch.randn(2, 8)
    calibrate(model, [x], num_batches=1, method="max", report_sqnr=False)
    original = torch.onnx.export

    def export(*args, **kwargs):
        if kwargs.get("dynamo") is False:  # what torch says for a graph whose folded constants pass 2 GB
            raise RuntimeError("The serialized model is larger than the 2GiB limit imposed by the protobuf library. "
                               "Therefore the output file must be a file path")
        return original(*args, **kwargs)
    monkeypatch.setattr(torch.onnx, "export", export)
    with pytest.raises(ExportError) as info:
        export_qdq_onnx(model, x, tmp_path / "m.onnx")
    message = str(info.value)
    assert "data-dependent" in message and "fallback cannot take over" in message and "cannot write a graph over" \
        in message
    assert list(tmp_path.iterdir()) == []


def test_a_large_graph_is_written_with_external_data_and_validated(tmp_path):
    model, sample = calibrated_tokens()
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx", external_data_threshold=1000,
                             float_onnx_path=tmp_path / "float.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float.onnx", "float.onnx.data", "m.onnx", "m.onnx.data"]
    assert report.external_data_path == str(tmp_path / "m.onnx.data")
    assert any("m.onnx.data" in n for n in report.notes)
    assert report.file_size == (tmp_path / "m.onnx").stat().st_size + (tmp_path / "m.onnx.data").stat().st_size
    weights = [t for t in onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL]
    assert weights and all(e.value == "m.onnx.data" for t in weights for e in t.external_data if e.key == "location")
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    session = value_session(str(tmp_path / "m.onnx"))
    logits = session.run(None, {k: v.numpy() for k, v in sample.items()})[0]
    assert logits.shape == (3, 7, 5)
    # a small graph stays one file
    export_qdq_onnx(model, sample, tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists()


@pytest.fixture
def protobuf_limit(monkeypatch):
    """Stands for protobuf's 2 GB limit at 2000 bytes (the token model's weights: 4750): serialising, sizing
    or copying a ModelProto that still holds more than that in its tensors raises, as encoding a >2 GB
    model does. Scales and shapes (about 1.5 kB here) may stay in the graph. Exports under it use a
    threshold of 1000 bytes."""
    limit = 2000

    def inline_bytes(model):
        return sum(len(t.raw_data) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * len(t.int64_data)
                   for t in model.graph.initializer)

    for method in ("SerializeToString", "ByteSize", "CopyFrom"):
        original = getattr(onnx.ModelProto, method)

        def guarded(self, *args, original=original, method=method):
            for model in (self, *args):
                if isinstance(model, onnx.ModelProto) and inline_bytes(model) > limit:
                    raise RuntimeError(f"Failed to serialize proto: {method} of a model holding "
                                       f"{inline_bytes(model)} bytes of weights")
            return original(self, *args)
        monkeypatch.setattr(onnx.ModelProto, method, guarded)
    return 1000


@pytest.mark.parametrize("opset", [17, 18])
def test_a_graph_over_the_protobuf_limit_is_exported_without_serialising_its_weights(tmp_path, protobuf_limit,
                                                                                     opset):
    model, sample = calibrated_tokens()
    # logits alone: with "hidden" a graph output too, onnxruntime's extended optimizations (the script below runs
    # them) fuse the Mul before head's QuantizeLinear and return quantized values for both (0.5 off; the report
    # says so, the graph as written matches)
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx", opset=opset, exporter="dynamo", outputs=["logits"],
                             external_data_threshold=protobuf_limit, float_onnx_path=tmp_path / "float.onnx",
                             calibration_cache_path=tmp_path / "calib.cache")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.cache", "float.onnx", "float.onnx.data", "m.onnx",
                                                          "m.onnx.data"]
    assert report.external_data_path == str(tmp_path / "m.onnx.data")
    assert report.opset == opset and report.cosine > 0.999 and report.quantize_nodes >= 4
    graph = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer)
    assert any(n.name == "fc._input_quantizer/QuantizeLinear" for n in graph.node)  # the naming passes ran
    session = value_session(str(tmp_path / "m.onnx"))
    logits = session.run(None, {k: v.numpy() for k, v in sample.items()})[0]
    with torch.no_grad():
        expected = model(**sample)["logits"].numpy()
    assert np.abs(logits - expected).max() < 0.1
    # the float graph has its own weights file and runs without Q/DQ
    float_graph = onnx.load(str(tmp_path / "float.onnx"), load_external_data=False).graph
    assert not any(n.op_type == "QuantizeLinear" for n in float_graph.node)
    assert {e.value for t in float_graph.initializer for e in t.external_data if e.key == "location"} == \
        {"float.onnx.data"}
    session = ort.InferenceSession(str(tmp_path / "float.onnx"), providers=["CPUExecutionProvider"])
    float_logits = session.run(None, {k: v.numpy() for k, v in sample.items()})[0]
    assert np.abs(float_logits - expected).max() < 0.5


def test_a_large_export_that_fails_validation_leaves_no_file(tmp_path, protobuf_limit):
    model, sample = calibrated_tokens()
    with pytest.raises(ExportError):
        export_qdq_onnx(model, sample, tmp_path / "m.onnx", exporter="dynamo", min_cosine=1.5, strict=True,
                        external_data_threshold=protobuf_limit)
    assert list(tmp_path.iterdir()) == []


def test_a_graph_over_the_stream_threshold_is_streamed_then_folded_into_one_file(tmp_path, monkeypatch):
    """Weights over STREAM_THRESHOLD go through a temporary data file during export (no serialised copy of
    them in memory) and the committed file is still one file: the same graph, weights and outputs as the
    ordinary export, its float graph too."""
    from onnx import numpy_helper

    from workbench.export import exporters, onnx_file

    model, sample = calibrated_tokens()
    plain = export_qdq_onnx(model, sample, tmp_path / "plain.onnx")
    folds = []
    monkeypatch.setattr(exporters, "STREAM_THRESHOLD", 1000)  # the token model's weights: 4750 bytes
    monkeypatch.setattr(onnx_file, "fold_external_data",
                        lambda *args, fold=onnx_file.fold_external_data: folds.append(args) or fold(*args))
    report = export_qdq_onnx(model, sample, tmp_path / "m.onnx", float_onnx_path=tmp_path / "float.onnx")
    assert len(folds) == 1, "the export did not stream its weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float.onnx", "m.onnx", "plain.onnx"]
    assert report.external_data_path is None and not any(".data" in w for w in report.warnings + report.notes)
    assert report.file_size == (tmp_path / "m.onnx").stat().st_size
    streamed, ordinary = onnx.load(str(tmp_path / "m.onnx")), onnx.load(str(tmp_path / "plain.onnx"))
    # the file protobuf itself writes (one graph field: netron keeps only the last of several)
    assert (tmp_path / "m.onnx").read_bytes() == streamed.SerializeToString()
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in streamed.graph.initializer)
    onnx.checker.check_model(streamed, full_check=True)

    def weights(model):
        return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}

    mine, theirs = weights(streamed), weights(ordinary)
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
    assert [(n.op_type, n.name, list(n.input)) for n in streamed.graph.node] == \
        [(n.op_type, n.name, list(n.input)) for n in ordinary.graph.node]
    feeds = {k: v.numpy() for k, v in sample.items()}
    outputs = [ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
               for name in ("m.onnx", "plain.onnx")]
    assert np.array_equal(outputs[0], outputs[1]) and plain.cosine == report.cosine
    float_graph = onnx.load(str(tmp_path / "float.onnx"))
    assert not any(n.op_type == "QuantizeLinear" for n in float_graph.graph.node)
    assert weights(float_graph).keys() <= mine.keys()
