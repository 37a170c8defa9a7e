"""A tiny BERT classifier project as a user makes it: a Hugging Face folder (save_pretrained) and token ids in an
.npz named after the forward's arguments (imported by name: tests/app is on sys.path)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def write_bert(folder: Path, *, hidden: int = 32, layers: int = 2, vocab: int = 60) -> Path:
    """A BertForSequenceClassification with random weights saved to ``folder`` (skips without transformers)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=2 * hidden, max_position_embeddings=32,
                                     num_labels=2, attn_implementation="eager")
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)
    return folder


def write_tokens(path: Path, *, samples: int = 8, length: int = 12, vocab: int = 60) -> Path:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(samples, length)).astype(np.int64)
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids))
    return path


def bert_specs(tmp_path: Path, **model: int) -> tuple[ModelSpec, DataSpec]:
    """The model and calibration data specs of a tiny BERT project under ``tmp_path``."""
    folder = write_bert(tmp_path / "bert", **model)
    tokens = write_tokens(tmp_path / "tokens.npz")
    return ModelSpec("hf", str(folder)), DataSpec("tensors", str(tokens), batch_size=4, num_batches=2)
