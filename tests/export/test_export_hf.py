"""Tiny Hugging Face models (random weights, built from a config) export by keyword with their outputs
picked from the ModelOutput; skipped where transformers is not installed."""
import pytest
import torch

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.quant.algorithms.calibrate import calibrate

transformers = pytest.importorskip("transformers")


def token_batches(vocab, count=2, batch=2, length=8, types=False):
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        batch_ = {"input_ids": torch.randint(0, vocab, (batch, length), generator=generator),
                  "attention_mask": torch.ones(batch, length, dtype=torch.long)}
        if types:
            batch_["token_type_ids"] = torch.zeros(batch, length, dtype=torch.long)
        batches.append(batch_)
    return batches


def quantized(model, batches):
    model.eval()
    report = quant.replace_to_quantization_module(model)
    calibrate(model, batches, num_batches=len(batches), method="max", report_sqnr=False)
    return report


def test_llama_with_its_default_config_exports_logits_without_the_cache(tmp_path):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    assert config.use_cache  # the default, whose DynamicCache output broke the export
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    batches = token_batches(64)
    report = quantized(model, batches)
    assert len(report.replaced) >= 2 * 7 + 1  # q/k/v/o, gate/up/down per layer, and lm_head
    exported = export_qdq_onnx(model, batches[0], tmp_path / "llama.onnx")
    assert exported.input_names == ["input_ids", "attention_mask"] and exported.output_names == ["logits"]
    assert any("use_cache=False" in n for n in exported.notes)
    assert model.config.use_cache is True
    assert exported.outputs[0].shape == (2, 8, 64) and exported.cosine > 0.999


def test_bert_exports_by_keyword_with_every_output(tmp_path):
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(config)
    batches = token_batches(64, types=True)
    quantized(model, batches)
    exported = export_qdq_onnx(model, batches[0], tmp_path / "bert.onnx")
    assert exported.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert exported.output_names == ["last_hidden_state", "pooler_output"] and exported.cosine > 0.999
