"""hf: checkpoint folders written by tests, and the `new` that opens one, for the lazy-open, streaming and
smoothing tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.cli_run import run


def save_bf16_llama(tmp_path: Path, hidden: int) -> Path:
    """A 2-block LLaMA in bf16 of width ``hidden``, saved as safetensors in ``tmp_path/llama``, with 12 rows of 16
    token ids in ``tmp_path/ids.npy``; returns the folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                         attn_implementation="eager")
    folder = tmp_path / "llama"
    LlamaForCausalLM(config).eval().to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (12, 16)).astype(np.int64))
    return folder


def save_outlier_llama(tmp_path: Path) -> None:
    """The tiny LLaMA with outlier rows in block 1's MLP, saved in bf16 as ``tmp_path/llama`` (safetensors), and 8x8
    token ids as ``tmp_path/ids.npy``: the model whose block-by-block searches have one clear layer to pick."""
    import models  # tests/transformers/models.py

    torch.manual_seed(0)
    model = models.hf_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[:4] *= 60.0
        model.model.layers[1].mlp.gate_proj.weight[:4] *= 8.0
    model.to(torch.bfloat16).save_pretrained(tmp_path / "llama", safe_serialization=True)
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (8, 8)).astype(np.int64))


def new_project(capsys, tmp_path: Path, folder: Path, name: str = "p.qwb", precision: str | None = None) -> Path:
    """``workbench new`` on ``hf:folder`` with ``tmp_path/ids.npy`` (batches of 4, the logits compared), then every
    Linear set to ``precision`` when one is given."""
    project = tmp_path / name
    code, _, err = run(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", "4", "--output-key", "logits", "--force")
    assert code == 0, err
    if precision is not None:
        code, _, err = run(capsys, "set", project, "--type", "Linear", "--precision", precision)
        assert code == 0, err
    return project
