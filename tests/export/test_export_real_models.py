"""Issue 34 on real library code (tiny configs, random weights, the placement the CLI uses): Hugging Face DETR is
exported whole, GPT-2 with INT4 weights opens in onnxruntime with its default optimizations. Skipped where
transformers is not installed."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from workbench.export import export_qdq_onnx
from workbench.graph import fold_batchnorm
from workbench.graph.batchnorm import is_frozen_batchnorm
from workbench.graph.prepare import prepare_for_tensorrt
from workbench.project.settings import make_descriptor
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.algorithms.precision import Precision, descriptors_for

transformers = pytest.importorskip("transformers")


def tiny_detr():
    """DETR on a two-stage ResNet backbone built by transformers itself (no timm, nothing downloaded)."""
    backbone = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                         layer_type="basic", out_features=["stage2"])
    config = transformers.DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
                                     d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=5,
                                     num_labels=3, auxiliary_loss=False)
    torch.manual_seed(0)
    return transformers.DetrForObjectDetection(config).eval()


def test_detr_frozen_batchnorms_are_folded_or_listed():
    model = tiny_detr()
    frozen = [name for name, module in model.named_modules() if is_frozen_batchnorm(module)]
    assert frozen  # DETR swaps its backbone's BatchNorm2d for DetrFrozenBatchNorm2d
    _, report = fold_batchnorm(model, example_inputs=(torch.randn(1, 3, 32, 32),))
    accounted = {pair.bn for pair in report.folded} | {skip.bn for skip in report.skipped}
    assert set(frozen) <= accounted
    assert report.folded  # the backbone's traced stages fold
    assert all(skip.reason for skip in report.skipped)


def test_detr_is_exported_whole_without_a_q_dq_on_a_constant(tmp_path, capsys):
    model = tiny_detr()
    batches = [torch.randn(1, 3, 32, 32) for _ in range(2)]
    model, _ = prepare_for_tensorrt(model, example_inputs=batches[0])
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    capsys.readouterr()
    report = export_qdq_onnx(model, batches[0], tmp_path / "detr.onnx")
    out, err = capsys.readouterr()
    assert report.output_names[:2] == ["logits", "pred_boxes"]  # pred_boxes was dropped before
    assert "last_hidden_state" in report.output_names
    # torch.export cannot capture DETR: the fallback's reason is in the report's text, its graph dump is not printed
    assert report.exporter_note and report.exporter in ("dynamo", "torchscript")
    assert "def forward(" not in out + err and len((out + err).splitlines()) < 10
    proto = onnx.load(str(tmp_path / "detr.onnx"))
    producers = {out: node for node in proto.graph.node for out in node.output}
    for node in proto.graph.node:
        if node.op_type == "QuantizeLinear":
            source = producers.get(node.input[0])
            assert source is None or source.op_type not in ("ConstantOfShape", "Constant"), node.name
    assert any("no Q/DQ on its input, the constant" in note for note in report.notes)
    session = ort.InferenceSession(str(tmp_path / "detr.onnx"), providers=["CPUExecutionProvider"])
    boxes = session.run(["pred_boxes"], {"pixel_values": batches[0].numpy()})[0]
    assert boxes.shape == (1, 5, 4) and np.all((boxes >= 0) & (boxes <= 1))  # sigmoid boxes


def test_gpt2_with_int4_weights_opens_in_onnxruntime_with_default_optimizations(tmp_path):
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 64, (2, 8), generator=generator),
                "attention_mask": torch.ones(2, 8, dtype=torch.long)} for _ in range(2)]

    def choose(name, module):  # INT8 everywhere (attention included), INT4 weights in the MLP
        precision = Precision.INT4W if ".mlp." in name and module is not None else Precision.INT8
        kind = type(module).__name__ if module is not None else "Add"
        inputs, weight = descriptors_for(precision, kind, has_weight=module is not None, block_size=16)
        return make_descriptor(inputs), make_descriptor(weight)

    model, _ = prepare_for_tensorrt(model, example_inputs=batches[0], descriptor_for=choose)
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    report = export_qdq_onnx(model, batches[0], tmp_path / "gpt2.onnx")
    assert report.opset == 21 and report.formats.get("int4")
    session = ort.InferenceSession(str(tmp_path / "gpt2.onnx"), providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in batches[0].items()}
    assert session.run(None, feeds)[0].shape == (2, 8, 64)
    assert report.quantize_nodes == sum(1 for n in onnx.load(str(tmp_path / "gpt2.onnx")).graph.node
                                        if n.op_type == "QuantizeLinear")


def test_mamba_is_exported_at_the_sample_s_length_with_a_warning_saying_why(tmp_path):
    config = transformers.MambaConfig(vocab_size=32, hidden_size=16, state_size=4, num_hidden_layers=1, expand=2,
                                      conv_kernel=4, use_mambapy=False)
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 32, (2, 8), generator=generator)} for _ in range(2)]
    model, _ = prepare_for_tensorrt(model, example_inputs=batches[0])
    calibrate(model, batches, num_batches=2, method="max", report_sqnr=False)
    # the torch path's scan is a Python loop: the trace holds 8 steps, so the file fixes the length at 8 and says so
    report = export_qdq_onnx(model, batches[0], tmp_path / "mamba.onnx")
    assert report.output_names == ["logits"] and report.cosine > 0.999 and report.validated
    assert any("sequence length fixed at the sample's (8)" in w and "sequence length 9" in w for w in report.warnings)
    dims = onnx.load(str(tmp_path / "mamba.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert dims[1].dim_value == 8
