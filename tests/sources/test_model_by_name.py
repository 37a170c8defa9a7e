"""Models by name: hf:DIR (a local Hugging Face folder, no code run) and timm:NAME[@weights]."""
import json

import pytest
import torch

from workbench.sources.errors import SourceError
from workbench.sources.model_source import ModelSpec, load_model


def test_parse_names_the_kind_and_the_weights():
    assert ModelSpec.parse("hf:models/bert") == ModelSpec("hf", "models/bert")
    spec = ModelSpec.parse("timm:resnet18@ckpt/r18.safetensors")
    assert (spec.kind, spec.target, spec.weights) == ("timm", "resnet18", "ckpt/r18.safetensors")
    assert spec.label == "timm:resnet18 + ckpt/r18.safetensors" and not spec.requires_trust
    assert not ModelSpec.parse("hf:x").requires_trust
    with pytest.raises(SourceError, match="give one"):
        ModelSpec.parse("timm:resnet18@a.safetensors", weights="b.safetensors")


def test_hf_folder_loads_without_trust_and_paths_stay_relative(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    saved = transformers.BertForSequenceClassification(config).eval()
    saved.save_pretrained(tmp_path / "bert")
    loaded = load_model(ModelSpec.parse("hf:bert"), base_dir=tmp_path)  # no trust_code
    assert type(loaded.model).__name__ == "BertForSequenceClassification" and not loaded.model.training
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, saved(input_ids=ids).logits)
    assert {d.path.rsplit("/", 1)[-1] for d in loaded.digests} == {"config.json", "model.safetensors"}
    spec = ModelSpec("hf", str(tmp_path / "bert"))
    assert spec.relative_to(tmp_path).target == "bert" and spec.relative_to(tmp_path).absolute(tmp_path) == spec


def test_hf_folders_that_would_run_code_or_unpickle_are_refused(tmp_path):
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "config.json").write_text(json.dumps(
        {"model_type": "custom", "auto_map": {"AutoModel": "modeling_custom.CustomModel"}}))
    (tmp_path / "remote" / "model.safetensors").write_bytes(b"")
    with pytest.raises(SourceError, match=r"needs the folder's own Python code \(auto_map: \['AutoModel'\]\)"):
        load_model(ModelSpec.parse(f"hf:{tmp_path / 'remote'}"))
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(SourceError, match="no \\*.safetensors weights"):
        load_model(ModelSpec.parse(f"hf:{tmp_path / 'pickled'}"))
    with pytest.raises(SourceError, match="no config.json"):
        load_model(ModelSpec.parse(f"hf:{tmp_path / 'absent'}"))


def test_timm_by_name_or_a_clear_reason_why_not():
    try:
        import timm  # noqa: F401
    except Exception as error:  # here: torchvision without a CPU build breaks timm's import
        with pytest.raises(SourceError, match=r"needs the timm package, which cannot be imported here \(") as info:
            load_model(ModelSpec.parse("timm:resnet18"))
        assert type(error).__name__ in str(info.value) and "WORKBENCH_EXTRAS=timm" in str(info.value)
        return
    model = load_model(ModelSpec.parse("timm:resnet18")).model
    assert type(model).__name__ == "ResNet"
    with pytest.raises(SourceError, match="timm has no model 'resnet181'; did you mean"):
        load_model(ModelSpec.parse("timm:resnet181"))
