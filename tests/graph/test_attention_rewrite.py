"""The fx rewrite on attention, residual blocks and non-activation paths; traced modules checked on real inputs."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from workbench import quant
from workbench.analysis.units import find_units, resolve_units
from workbench.graph import describe_model, insert_functional_quantizers, prepare_for_tensorrt
from workbench.quant.algorithms.calibrate import calibrate
from workbench.quant.nn import QuantAdd, QuantMatMul, QuantSDPA

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
import models as zoo  # noqa: E402


def test_vit_attention_products_get_named_quantizers_with_roles():
    torch.manual_seed(0)
    model = zoo.ViTLike(fused=False).eval()
    x = zoo.images()
    with torch.no_grad():
        reference = model(x)
    model, report = prepare_for_tensorrt(model, example_inputs=x)
    f = report.functional
    assert [i.name for i in f.matmuls] == ["blocks.0.attn.matmul", "blocks.0.attn.matmul_1",
                                           "blocks.1.attn.matmul", "blocks.1.attn.matmul_1"]
    assert f.attention_products == 4 and f.verified == ["blocks.0.attn", "blocks.1.attn"]
    assert isinstance(model.blocks[0].attn.matmul, QuantMatMul)
    roles = {q.name: q.role for q in describe_model(model).quantizers() if q.role}
    assert roles["blocks.0.attn.matmul._input0_quantizer"] == "query"
    assert roles["blocks.0.attn.matmul._input1_quantizer"] == "key"
    assert roles["blocks.0.attn.matmul_1._input0_quantizer"] == "probabilities"
    assert roles["blocks.0.attn.matmul_1._input1_quantizer"] == "value"
    tree = describe_model(model)
    assert tree["blocks.0.attn.matmul"].display_type == "QuantMatMul (query x key)"
    assert tree["blocks.0.attn.matmul"].parent == "blocks.0.attn"  # shown under its attention module
    # residual adds inside the blocks stay float by default, with the reason
    residual = [s for s in f.skipped if s.owner == "blocks.0"]
    assert len(residual) == 2 and all("transformer block" in s.reason for s in residual)
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(x), reference)
    # the two products of one attention are one sensitivity unit, named after the attention
    units = {u.name: u for u in find_units(model)}
    assert set(units["blocks.0.attn"].quantizers) == {
        "blocks.0.attn.matmul._input0_quantizer", "blocks.0.attn.matmul._input1_quantizer",
        "blocks.0.attn.matmul_1._input0_quantizer", "blocks.0.attn.matmul_1._input1_quantizer"}
    blocks = [u.name for u in resolve_units(model, "transformer_blocks")]
    assert blocks == ["patch_embed", "blocks.0", "blocks.1", "head"]


def test_residual_switch_quantizes_block_adds_with_the_same_names():
    model = zoo.ViTLike(fused=True).eval()
    model, report = insert_functional_quantizers(model, residual_adds_in_transformer_blocks=True,
                                                 example_inputs=zoo.images())
    assert [i.name for i in report.adds] == ["blocks.0.add", "blocks.0.add_1", "blocks.1.add", "blocks.1.add_1"]
    assert [i.name for i in report.attentions] == ["blocks.0.attn.sdpa", "blocks.1.attn.sdpa"]
    assert isinstance(model.blocks[1].attn.sdpa, QuantSDPA)


def test_products_with_parameters_integers_and_positions_get_no_quantizer():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 8))
            self.register_buffer("inv_freq", torch.rand(4))

        def forward(self, x, y, position_ids, attention_mask):
            linear_like = x @ self.weight                          # a parameter: Linear-like
            both = torch.bmm(x, y)                                 # two activations
            added = torch.baddbmm(both, x, y, beta=0.5)            # two activations, bias kept
            angles = self.inv_freq[None, :, None] @ position_ids[:, None, :].float()  # positions
            emb = torch.cat((angles, angles), dim=-1)              # rotary angles: not an activation
            shifted = position_ids + position_ids                  # integer tensors
            masked = both + attention_mask                         # a mask
            return torch.stack([linear_like.sum(), added.sum(), emb.cos().sum(), shifted.sum().float(), masked.sum()])

    model = Mixed()
    inputs = (torch.randn(2, 8, 8), torch.randn(2, 8, 8), torch.arange(6).repeat(2, 1), torch.zeros(2, 8, 8))
    with torch.no_grad():
        reference = model(*inputs)
    result, report = insert_functional_quantizers(model, example_inputs=inputs)
    assert [(i.name, i.kind) for i in report.inserted] == [("matmul", "matmul"), ("matmul_1", "matmul")]
    assert result.matmul.op == "bmm" and result.matmul_1.op == "baddbmm"
    skipped = {s.operation.split("(")[0]: s.reason for s in report.skipped}
    assert "Linear-like" in skipped["operator.matmul"]
    assert "not a floating activation" in skipped["torch.cat"]
    assert all(not isinstance(m, QuantAdd) for m in result.modules())
    with quant.disable_quantization(result), torch.no_grad():
        assert torch.equal(result(*inputs), reference)


def test_resnet_blocks_written_like_timm_and_torchvision_get_their_adds():
    model = zoo.ResNetStyle().eval()
    x = zoo.images()
    with torch.no_grad():
        reference = model(x)
    model, report = prepare_for_tensorrt(model, example_inputs=x)
    assert report.functional.inserted_names == ["layer1.add", "layer2.add"]
    assert report.functional.failures == [] and report.functional.verified == ["layer1", "layer2"]
    # the add fuses into conv2 (+bn2): only the identity operand stays quantized
    assert report.rules.disabled == ["layer1.add._input0_quantizer", "layer2.add._input0_quantizer"]
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.equal(model(x), reference)


def test_a_traced_forward_that_bakes_in_a_branch_is_kept_original():
    class Embeddings(nn.Module):
        """HF BertEmbeddings' shape: a None branch decided at trace time."""

        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(20, 8)
            self.types = nn.Embedding(2, 8)
            self.proj = nn.Linear(8, 8)

        def forward(self, ids, token_type_ids=None):
            x = self.proj(self.words(ids))
            if token_type_ids is None:
                token_type_ids = torch.ones_like(ids)
            return x + self.proj(self.types(token_type_ids))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = Embeddings()

        def forward(self, ids):
            return self.embeddings(ids)  # token_type_ids is None: fx traced the other branch

    model = Model().eval()
    ids = torch.randint(0, 20, (2, 5))
    with torch.no_grad():
        reference = model(ids)
    result, report = insert_functional_quantizers(model, example_inputs=ids)
    # fx's rewrite is refused; the add is found by running the model and quantized at run time instead
    assert type(result.embeddings) is Embeddings
    assert report.inserted_names == ["embeddings.add"] and report.runtime == ["embeddings"]
    assert all(f.name != "embeddings" for f in report.failures)
    notes = describe_model(result)["embeddings"].notes
    assert any("run time" in note and "the traced forward fails on the sample input" in note for note in notes)
    with quant.disable_quantization(result), torch.no_grad():
        assert torch.equal(result(ids), reference)
    with torch.no_grad():
        calibrate(result, [ids], num_batches=None, method="max", report_sqnr=False)
        assert not torch.equal(result(ids), reference)  # the add's operands are quantized now
    # without a sample input the rewrite cannot tell and keeps the traced module
    _, blind = insert_functional_quantizers(Model().eval())
    assert blind.inserted_names == ["embeddings.add"]


def test_sdpa_model_calibrates_with_every_attention_quantizer_reached():
    model = zoo.ViTLike(fused=True).eval()
    x = zoo.images()
    model, _ = prepare_for_tensorrt(model, example_inputs=x)
    result = calibrate(model, [x], num_batches=None, method="max", report_sqnr=False)
    assert result.unused == []
    probs = float(model.blocks[0].attn.sdpa._probs_quantizer.amax)
    assert 0 < probs <= 1.0
    with torch.no_grad():
        output = model(x)
        with quant.disable_quantization(model):
            exact = model(x)
    assert F.cosine_similarity(output.flatten(), exact.flatten(), dim=0) > 0.98
