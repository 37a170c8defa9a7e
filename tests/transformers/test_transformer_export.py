"""Transformers end to end: prepare, calibrate, export; both inputs of both attention MatMuls come from
DequantizeLinear, and onnxruntime agrees with the FP32 model."""
import models as zoo
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.ort_run import value_session
from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.graph import describe_model, insert_functional_quantizers, prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantMatMul, QuantSDPA


def attention_matmuls_fed_by_dq(path) -> tuple[int, int]:
    """(MatMuls whose two inputs both come from DequantizeLinear, MatMuls with no initializer input)."""
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {i.name for i in graph.initializer}

    def constant(name: str) -> bool:  # computed from initializers only (a weight through Q/DQ/Transpose)
        if name in initializers:
            return True
        node = producer.get(name)
        if node is None:
            return False
        return node.op_type == "Constant" or all(constant(i) for i in node.input if i)

    between_activations = [n for n in graph.node if n.op_type == "MatMul" and not any(constant(i) for i in n.input)]
    both = [n for n in between_activations
            if all(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in n.input)]
    return len(both), len(between_activations)


def _cosine_vs_fp32(path, inputs: tuple, fp32: torch.Tensor) -> float:

    session = value_session(str(path))
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    out = session.run(None, feeds)[0].astype(np.float64).ravel()
    ref = fp32.detach().double().numpy().ravel()
    return float(out @ ref / (np.linalg.norm(out) * np.linalg.norm(ref)))


def _first(output):
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "to_tuple"):
        return output.to_tuple()[0]
    return output[0]


def run_pipeline(model: nn.Module, inputs: tuple, tmp_path, layers: int, export: bool = True):
    with torch.no_grad():
        fp32 = _first(model(*inputs))
    model, report = prepare_for_tensorrt(model, example_inputs=inputs)
    products = sum(2 if isinstance(m, QuantSDPA) else 1 for m in model.modules()
                   if isinstance(m, (QuantSDPA, QuantMatMul)))
    assert products == 2 * layers, report.functional.summary()
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(_first(model(*inputs)), fp32)  # nothing changed while quantization is off
    result = calibrate(model, [inputs], num_batches=None, method="max", report_sqnr=False)
    attention = [n for n in result.quantizers if any(r in n for r in ("_probs_quantizer", "matmul"))]
    assert attention and not any(n in result.unused for n in attention)
    if not export:
        return model, report
    path = tmp_path / "model.onnx"
    export = export_qdq_onnx(model, inputs, path)
    fed, total = attention_matmuls_fed_by_dq(path)
    assert fed == total == 2 * layers
    assert export.cosine > 0.999
    assert _cosine_vs_fp32(path, inputs, fp32) > 0.98
    return model, report


@pytest.mark.parametrize("fused", [False, True], ids=["matmul", "sdpa"])
def test_vit_like_exports_with_quantized_attention(tmp_path, fused):
    torch.manual_seed(0)
    run_pipeline(zoo.ViTLike(fused=fused).eval(), (zoo.images(),), tmp_path, layers=2)


def test_transformer_encoder_on_token_ids_exports(tmp_path):
    torch.manual_seed(0)
    run_pipeline(zoo.TokenEncoder().eval(), (zoo.tokens(),), tmp_path, layers=2)


# every architecture exports once (exports take most of the time); the other implementation calibrates
HF = [("bert", "eager", True), ("bert", "sdpa", False), ("vit", "eager", False), ("vit", "sdpa", True),
      ("llama", "eager", False), ("llama", "sdpa", True)]


@pytest.mark.parametrize("arch,attn,export", HF, ids=[f"{a}-{b}" for a, b, _ in HF])
def test_hugging_face_attention_is_quantized_and_exports(tmp_path, arch, attn, export):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = {"bert": zoo.hf_bert, "vit": zoo.hf_vit, "llama": zoo.hf_llama}[arch](attn)
    inputs = (zoo.images(),) if arch == "vit" else (zoo.tokens(vocab=64),)
    model, report = run_pipeline(model, inputs, tmp_path, layers=2, export=export)
    functional = report.functional
    assert len(functional.attention_modules) == 2 and functional.unquantized_attention == []
    roles = {q.role for q in describe_model(model).quantizers() if q.role}
    assert roles == {"query", "key", "value", "probabilities"}
    if arch == "llama":  # the rotary embedding's concatenation of angles gets no quantizer
        assert not any("rotary" in name for name in functional.inserted_names)
        assert any(s.owner == "model.rotary_emb" for s in functional.skipped)


def test_unsupported_hugging_face_attention_is_reported_by_module():
    pytest.importorskip("transformers")
    model = zoo.hf_bert("eager")
    model.config._attn_implementation = "flash_attention_2"  # not runnable here: only its name matters
    _, report = insert_functional_quantizers(model)
    assert [s.owner for s in report.unquantized_attention] == ["encoder.layer.0.attention.self",
                                                               "encoder.layer.1.attention.self"]
    assert "flash_attention_2" in report.unquantized_attention[0].reason
    assert "attention modules left in floating point" in report.summary()
    notes = describe_model(model)["encoder.layer.0.attention.self"].notes
    assert any("attention not quantized" in n for n in notes)


@pytest.mark.parametrize("arch", ["vit", "llama", "bert"])
def test_hugging_face_residual_adds_on_request_and_embeddings_kept_original(arch):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = {"bert": zoo.hf_bert, "vit": zoo.hf_vit, "llama": zoo.hf_llama}[arch]("sdpa")
    inputs = (zoo.images(),) if arch == "vit" else (zoo.tokens(vocab=64),)
    with torch.no_grad():
        fp32 = _first(model(*inputs))
    model, report = insert_functional_quantizers(model, residual_adds_in_transformer_blocks=True,
                                                 example_inputs=inputs)
    blocks = {"vit": ["layers.0", "layers.1"], "llama": ["model.layers.0", "model.layers.1"],
              "bert": ["encoder.layer.0.attention.output", "encoder.layer.0.output",
                       "encoder.layer.1.attention.output", "encoder.layer.1.output"]}[arch]
    assert sorted({a.owner for a in report.adds}) == blocks  # **kwargs blocks traced as they were called
    assert len(report.adds) == 4
    if arch == "bert":  # BertEmbeddings' `token_type_ids is None` branch: the traced copy fails, so it is kept,
        # and its adds are found by running it: the token-type and position tables are looked up with indices
        # that do not depend on the input (constants for TensorRT), so they stay float with that reason
        assert "embeddings" in report.runtime and all(f.name != "embeddings" for f in report.failures)
        kept = [s for s in report.skipped if s.owner == "embeddings"]
        assert len(kept) == 2 and all("not a floating activation" in s.reason for s in kept)
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(_first(model(*inputs)), fp32)
    result = calibrate(model, [inputs], num_batches=None, method="max", report_sqnr=False)
    assert result.unused == []


def test_probabilities_of_p_at_v_get_the_attention_probabilities_descriptor(tmp_path):
    """The softmax output of an explicit ``attn @ v`` is quantized as QuantSDPA quantizes its probabilities (max
    calibration, per tensor), whatever the default input descriptor; a descriptor chosen for the product wins."""
    from workbench.quant.calib import HistogramCalibrator, MaxCalibrator
    from workbench.quant.nn.modules.quant_attention import QUANT_DESC_8BIT_ATTENTION_PROBS

    torch.manual_seed(0)
    model = zoo.ViTLike(fused=False).eval()
    x = zoo.images()
    chosen = quant.QuantDescriptor(num_bits=8, calib_method="histogram", unsigned=False)

    def descriptor_for(name, module):  # the user set a descriptor for block 1's P @ V product only
        return (chosen, None) if name == "blocks.1.attn.matmul_1" else (None, None)

    model, _ = prepare_for_tensorrt(model, example_inputs=(x,), descriptor_for=descriptor_for,
                                    quant_desc_input=quant.QuantDescriptor(calib_method="histogram"))
    probs, value = model.blocks[0].attn.matmul_1._input0_quantizer, model.blocks[0].attn.matmul_1._input1_quantizer
    assert model.blocks[0].attn.matmul_1.roles == ("probabilities", "value")
    expected = QUANT_DESC_8BIT_ATTENTION_PROBS
    assert isinstance(probs._calibrator, MaxCalibrator)
    assert (probs.num_bits, probs.axis, probs.unsigned, probs.narrow_range, probs.fake_quant) == (
        expected.num_bits, expected.axis, expected.unsigned, expected.narrow_range, expected.fake_quant)
    assert isinstance(value._calibrator, HistogramCalibrator)  # the value keeps the default input descriptor
    query_key = model.blocks[0].attn.matmul
    assert all(isinstance(q._calibrator, HistogramCalibrator)
               for q in (query_key._input0_quantizer, query_key._input1_quantizer))
    assert isinstance(model.blocks[1].attn.matmul_1._input0_quantizer._calibrator, HistogramCalibrator)  # chosen

    result = calibrate(model, [(x,)], num_batches=None, method="percentile", report_sqnr=False)
    item = result.quantizers["blocks.0.attn.matmul_1._input0_quantizer"]
    assert item.calibrator == "MaxCalibrator" and item.method == "max"
    assert 0 < float(probs.amax) <= 1.0
    assert float(probs.amax) == float(item.max_value)  # max calibration: the largest probability seen
    path = tmp_path / "model.onnx"
    export_qdq_onnx(model, (x,), path)
    assert attention_matmuls_fed_by_dq(path) == (4, 4)
